"""CI runs the slime-train smoke beside the suite: the suite runs tests/slime_train last (tests/conftest.py) and the
tier's tests wait for the smoke's status file (tests/slime_train/smoke_wait.py) instead of reading a half-written
output folder. These tests run pytest on the real tier (its conftest and tests) as CI does, and the wait itself."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from slime_train.smoke_wait import (
    LOG_ENV,
    STATUS_ENV,
    WAIT_ENV,
    SmokeNotFinished,
    SmokeWait,
    wait_for_smoke,
    wait_from_environment,
)

REPO = Path(__file__).resolve().parents[2]
TIER = "tests/slime_train"
OUT_ENV = "SLIME_STRANDS_SLIME_TRAIN_OUT"


def _pytest(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """pytest in a child, from the repository's root, with the tier's variables exactly as given."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SLIME_STRANDS_SLIME_TRAIN_")
        and k not in ("PYTEST_ADDOPTS", "SLIME_STRANDS_REQUIRE_SLIME_TRAIN")
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _collected(*paths: str) -> list[str]:
    result = _pytest("--collect-only", "-q", *paths, env={})
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_the_tier_runs_last_and_its_smoke_readers_after_its_other_tests() -> None:
    # The tier first on the command line: pytest alone would run it first.
    ids = _collected(TIER, "tests/unit/test_scripts.py")
    tier = [i for i, name in enumerate(ids) if name.startswith(TIER + "/")]
    assert tier and tier == list(range(len(ids) - len(tier), len(ids))), ids
    # The rest keeps pytest's order.
    assert [name for name in ids if not name.startswith(TIER + "/")] == _collected(
        "tests/unit/test_scripts.py"
    )
    # In the tier, the tests that read the smoke's output (test_slime_train.py) after those that need no run.
    files = [name.split("::")[0].rsplit("/", 1)[1] for name in ids if name.startswith(TIER + "/")]
    readers = files.index("test_slime_train.py")
    assert "test_smoke_parts.py" in files[:readers], files
    assert "test_smoke_parts.py" not in files[readers:], files


def _tier_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    out = tmp_path / "out"  # no smoke.json: a smoke that was waited for still fails the tier, saying so
    out.mkdir()
    log = tmp_path / "smoke.log"
    log.write_text("".join(f"smoke line {n}\n" for n in range(200)))
    return {OUT_ENV: str(out), "SLIME_STRANDS_REQUIRE_SLIME_TRAIN": "1", LOG_ENV: str(log), **extra}


def test_a_failed_smoke_fails_the_tier_with_its_status_and_the_end_of_its_log(tmp_path: Path) -> None:
    status = tmp_path / "smoke.status"
    status.write_text("4\n")
    result = _pytest(
        "-x", "-q", f"{TIER}/test_slime_train.py", env=_tier_env(tmp_path, **{STATUS_ENV: str(status)})
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the slime-train smoke failed (exit status 4)" in result.stdout, result.stdout
    assert "smoke line 199" in result.stdout and "smoke line 120" in result.stdout
    assert "smoke line 119\n" not in result.stdout  # the end of the log, not all of it


def test_the_wait_is_not_cut_short_by_the_tests_own_timeout(tmp_path: Path) -> None:
    # pytest-timeout's 1 s would end the first test's set-up long before the wait's own 4 s: the wait must be the
    # one that ends it (no status ever comes).
    env = _tier_env(tmp_path, **{STATUS_ENV: str(tmp_path / "smoke.status"), WAIT_ENV: "4"})
    result = _pytest("-x", "-q", "-o", "timeout=1", f"{TIER}/test_slime_train.py", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the slime-train smoke did not end within 4 s" in result.stdout, result.stdout
    assert "Timeout" not in result.stdout
    assert "smoke line 199" in result.stdout


def test_a_smoke_that_ended_well_lets_the_tier_read_its_output(tmp_path: Path) -> None:
    status = tmp_path / "smoke.status"
    status.write_text("0\n")
    result = _pytest(
        "-x", "-q", f"{TIER}/test_slime_train.py", env=_tier_env(tmp_path, **{STATUS_ENV: str(status)})
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "holds no finished smoke run of configuration sync (no smoke.json)" in result.stdout, result.stdout
    assert "slime-train smoke failed" not in result.stdout


def test_without_a_status_file_the_output_is_read_at_once(tmp_path: Path) -> None:
    result = _pytest("-x", "-q", f"{TIER}/test_slime_train.py", env=_tier_env(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "holds no finished smoke run of configuration sync (no smoke.json)" in result.stdout, result.stdout


def test_the_wait_ends_when_the_status_is_written(tmp_path: Path) -> None:
    status = tmp_path / "smoke.status"
    done: list[BaseException | None] = []

    def wait() -> None:
        try:
            wait_for_smoke(SmokeWait(status, None, timeout_s=120))
            done.append(None)
        except BaseException as error:  # the test's thread reports whatever ended the wait
            done.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    (tmp_path / "smoke.status.tmp").write_text("0\n")
    (tmp_path / "smoke.status.tmp").rename(status)
    waiter.join(timeout=120)
    assert not waiter.is_alive()
    assert done == [None]


@pytest.mark.parametrize("text", ["", "   \n"])
def test_an_empty_status_file_is_not_an_end(tmp_path: Path, text: str) -> None:
    status = tmp_path / "smoke.status"
    status.write_text(text)
    with pytest.raises(SmokeNotFinished, match=r"did not end within 0 s \(no status in .*\); \(no log: set "):
        wait_for_smoke(SmokeWait(status, None, timeout_s=0.2))


def test_a_status_file_that_holds_no_exit_status_is_refused(tmp_path: Path) -> None:
    status = tmp_path / "smoke.status"
    status.write_text("done\n")
    with pytest.raises(SmokeNotFinished, match=r"holds 'done', not an exit status"):
        wait_for_smoke(SmokeWait(status, None, timeout_s=60))


@pytest.mark.parametrize("raw", ["soon", "0", "-5"])
def test_a_bad_wait_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raw: str
) -> None:
    monkeypatch.setenv(STATUS_ENV, str(tmp_path / "smoke.status"))
    monkeypatch.setenv(WAIT_ENV, raw)
    with pytest.raises(
        SmokeNotFinished, match=rf"^{WAIT_ENV}='{raw}' is not a number of seconds above 0: set e\.g\. "
    ):
        wait_from_environment()


def test_the_environment_names_the_wait(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(STATUS_ENV, raising=False)
    assert wait_from_environment() is None
    monkeypatch.setenv(STATUS_ENV, str(tmp_path / "s"))
    monkeypatch.delenv(WAIT_ENV, raising=False)
    monkeypatch.delenv(LOG_ENV, raising=False)
    assert wait_from_environment() == SmokeWait(tmp_path / "s", None, 45 * 60.0)
    monkeypatch.setenv(LOG_ENV, str(tmp_path / "log"))
    monkeypatch.setenv(WAIT_ENV, "90")
    assert wait_from_environment() == SmokeWait(tmp_path / "s", tmp_path / "log", 90.0)
