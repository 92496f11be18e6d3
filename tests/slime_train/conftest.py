"""Fixtures of the slime-train tier: the output of one ``bash scripts/slime_cpu_smoke.sh OUT_DIR`` run, named by
``SLIME_STRANDS_SLIME_TRAIN_OUT=OUT_DIR``.

Without that variable the tier SKIPS, saying how to run it, unless ``SLIME_STRANDS_REQUIRE_SLIME_TRAIN=1`` (CI)
makes that a failure. The tests only read the run's files: they never import slime (the saved Samples are read
into the project's field-for-field copy of slime's ``Sample``).

With ``SLIME_STRANDS_SLIME_TRAIN_STATUS`` (CI, whose smoke runs beside the rest of the suite) every fixture that
reads the output first waits for the whole smoke to end (``smoke_finished``, see smoke_wait.py); those tests' timeout
then covers their own call only, not that wait (which has its own).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slime_train.smoke_output import SmokeRun
from slime_train.smoke_wait import (
    STATUS_ENV,
    WAIT_FIXTURE,
    SmokeNotFinished,
    wait_for_smoke,
    wait_from_environment,
)

OUT_ENV = "SLIME_STRANDS_SLIME_TRAIN_OUT"
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


@pytest.fixture(scope="session")
def smoke(smoke_finished: None) -> SmokeRun:
    """The smoke run's saved output, loaded once (after the smoke has ended)."""
    out = os.environ.get(OUT_ENV)
    if not out:
        if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
            pytest.fail(f"{REQUIRE_ENV} is set but {OUT_ENV} is not: {HINT}", pytrace=False)
        pytest.skip(f"the slime-train tier needs {OUT_ENV}: {HINT}")
    if not (Path(out) / "smoke.json").is_file():
        pytest.fail(f"{OUT_ENV}={out} holds no finished smoke run (no smoke.json): {HINT}", pytrace=False)
    return SmokeRun.load(Path(out))
