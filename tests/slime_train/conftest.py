"""Fixtures of the slime-train tier: the output of one ``bash scripts/slime_cpu_smoke.sh OUT_DIR`` run, named by
``SLIME_STRANDS_SLIME_TRAIN_OUT=OUT_DIR``.

Without that variable the tier SKIPS, saying how to run it, unless ``SLIME_STRANDS_REQUIRE_SLIME_TRAIN=1`` (CI)
makes that a failure. The tests only read the run's files: they never import slime (the saved Samples are read
into the project's field-for-field copy of slime's ``Sample``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slime_train.smoke_output import SmokeRun

OUT_ENV = "SLIME_STRANDS_SLIME_TRAIN_OUT"
REQUIRE_ENV = "SLIME_STRANDS_REQUIRE_SLIME_TRAIN"
HINT = (
    "run `bash scripts/slime_cpu_smoke.sh OUT_DIR` (the first time builds two venvs: minutes, ~8 GB), then "
    f"`{OUT_ENV}=OUT_DIR pytest -q tests/slime_train`"
)


@pytest.fixture(scope="session")
def smoke() -> SmokeRun:
    """The smoke run's saved output, loaded once."""
    out = os.environ.get(OUT_ENV)
    if not out:
        if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
            pytest.fail(f"{REQUIRE_ENV} is set but {OUT_ENV} is not: {HINT}", pytrace=False)
        pytest.skip(f"the slime-train tier needs {OUT_ENV}: {HINT}")
    if not (Path(out) / "smoke.json").is_file():
        pytest.fail(f"{OUT_ENV}={out} holds no finished smoke run (no smoke.json): {HINT}", pytrace=False)
    return SmokeRun.load(Path(out))
