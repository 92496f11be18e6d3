"""Fixtures of the slime-train tier: the output of ``bash scripts/slime_cpu_smoke.sh`` runs, named by
``SLIME_STRANDS_SLIME_TRAIN_OUT=OUT_DIR``: one run (``OUT_DIR/smoke.json``), or one per named configuration in
``OUT_DIR/<configuration>/`` (``SMOKE_CONFIG``, see smoke_output.CONFIGURATIONS). ``SLIME_STRANDS_SLIME_TRAIN_CONFIGS``
(CI: every configuration) lists the configurations the tests run on, each of which must be there; without it they
run on what ``OUT_DIR`` holds. Every test taking ``smoke`` runs once per configuration; one taking
``async_smoke`` / ``pool_smoke`` / ``workers_smoke`` only on the configurations that have slime's fully-async
rollout / the sandbox's Ray pool / rollout workers.

Without that variable the tier SKIPS, saying how to run it, unless ``SLIME_STRANDS_REQUIRE_SLIME_TRAIN=1`` (CI)
makes that a failure. The tests only read the run's files: they never import slime (the saved Samples are read
into the project's field-for-field copy of slime's ``Sample``).

With ``SLIME_STRANDS_SLIME_TRAIN_STATUS`` (CI, whose smoke runs beside the rest of the suite) every fixture that
reads the output first waits for the whole smoke to end (``smoke_finished``, see smoke_wait.py); those tests' timeout
then covers their own call only, not that wait (which has its own).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from slime_train.smoke_output import CONFIGURATIONS, Configuration, SmokeRun
from slime_train.smoke_wait import (
    STATUS_ENV,
    WAIT_FIXTURE,
    SmokeNotFinished,
    wait_for_smoke,
    wait_from_environment,
)

OUT_ENV = "SLIME_STRANDS_SLIME_TRAIN_OUT"
CONFIGS_ENV = "SLIME_STRANDS_SLIME_TRAIN_CONFIGS"
REQUIRE_ENV = "SLIME_STRANDS_REQUIRE_SLIME_TRAIN"
HINT = (
    "run `bash scripts/slime_cpu_smoke.sh OUT_DIR` (the first time builds two venvs: minutes, ~8 GB), then "
    f"`{OUT_ENV}=OUT_DIR pytest -q tests/slime_train`"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """While the smoke may still be running, the tests that wait for it are timed on their call only (pytest-timeout's
    ``func_only``): the default timeout would otherwise end the wait, which has its own, long before the smoke."""
    if not os.environ.get(STATUS_ENV):
        return
    for item in items:
        if WAIT_FIXTURE not in getattr(item, "fixturenames", ()):
            continue
        marker = item.get_closest_marker("timeout")
        args, kwargs = (marker.args, dict(marker.kwargs)) if marker else ((), {})
        item.add_marker(pytest.mark.timeout(*args, **{**kwargs, "func_only": True}), append=False)


@pytest.fixture(scope="session")
def smoke_finished() -> None:
    """Returns once the smoke has ended well; fails with the end of its log when it failed or did not end in time.
    Returns at once without ``SLIME_STRANDS_SLIME_TRAIN_STATUS`` (the output is read as it is)."""
    try:
        wait = wait_from_environment()
        if wait is not None:
            wait_for_smoke(wait)
    except SmokeNotFinished as error:
        pytest.fail(str(error), pytrace=False)


def _configurations() -> dict[str, str]:
    """The configurations the tests run on, by name: the folder under ``OUT_DIR`` that holds each ("" for
    ``OUT_DIR`` itself). Decided at collection, when CI's smoke may not have written anything yet."""
    out = Path(os.environ.get(OUT_ENV, ""))
    if names := os.environ.get(CONFIGS_ENV, "").split():
        return {name: name for name in names}
    if (out / "smoke.json").is_file():  # one run, in OUT_DIR itself
        name = json.loads((out / "smoke.json").read_text()).get("smoke_config") or "sync"
        return {name: ""}
    found = sorted(p.parent.name for p in out.glob("*/smoke.json")) if os.environ.get(OUT_ENV) else []
    return {name: name for name in found} or {"sync": ""}  # nothing yet: the fixture says what is missing


_SUBSETS: dict[str, Callable[[Configuration], bool]] = {
    "smoke": lambda c: True,
    "async_smoke": lambda c: c.rollout == "fully_async",
    "pool_smoke": lambda c: c.sandbox_pool,
    "workers_smoke": lambda c: c.rollout_workers,
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test that reads a run, once per configuration it applies to (the ids are the names)."""
    for fixture, applies in _SUBSETS.items():
        if fixture in metafunc.fixturenames:
            names = [n for n in _configurations() if n not in CONFIGURATIONS or applies(CONFIGURATIONS[n])]
            metafunc.parametrize(fixture, names, indirect=True, scope="session")


@functools.cache
def _load(name: str) -> SmokeRun:
    out = os.environ.get(OUT_ENV)
    if not out:
        if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
            pytest.fail(f"{REQUIRE_ENV} is set but {OUT_ENV} is not: {HINT}", pytrace=False)
        pytest.skip(f"the slime-train tier needs {OUT_ENV}: {HINT}")
    if name not in CONFIGURATIONS:
        pytest.fail(
            f"{name!r} is not one of the smoke's configurations {sorted(CONFIGURATIONS)}", pytrace=False
        )
    folder = Path(out) / _configurations().get(name, name)
    if not (folder / "smoke.json").is_file():
        pytest.fail(
            f"{folder} holds no finished smoke run of configuration {name} (no smoke.json): {HINT}",
            pytrace=False,
        )
    return SmokeRun.load(folder)


@pytest.fixture(scope="session")
def smoke(request: pytest.FixtureRequest, smoke_finished: None) -> SmokeRun:
    """One configuration's saved output, loaded once (after the whole smoke has ended)."""
    return _load(request.param)


@pytest.fixture(scope="session")
def async_smoke(request: pytest.FixtureRequest, smoke_finished: None) -> SmokeRun:
    """A configuration with slime's fully-async rollout."""
    return _load(request.param)


@pytest.fixture(scope="session")
def pool_smoke(request: pytest.FixtureRequest, smoke_finished: None) -> SmokeRun:
    """A configuration whose sandbox runs on its Ray pool."""
    return _load(request.param)


@pytest.fixture(scope="session")
def workers_smoke(request: pytest.FixtureRequest, smoke_finished: None) -> SmokeRun:
    """A configuration with rollout workers."""
    return _load(request.param)
