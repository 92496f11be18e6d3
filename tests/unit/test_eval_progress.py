"""Eval progress: plain status lines on a file or pipe (paced by the clock), a tqdm bar on a terminal."""

from __future__ import annotations

import io

from slime_strands.cli.eval.progress import EvalProgress
from slime_strands.cli.eval.summary import TrajectoryTally


def outcome(correct: bool, status: str = "COMPLETED", tokens: int = 100) -> TrajectoryTally:
    return TrajectoryTally("0:0", 0, "d", correct, status, 1, 0, 0, tokens)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_when_not_a_terminal():
    stream, clock = io.StringIO(), Clock()
    progress = EvalProgress(4, resumed=[outcome(True)], stream=stream, interval_s=10, clock=clock)
    progress.started()
    progress.started()
    clock.now = 2.0
    progress.finished(outcome(False, "FAILED", tokens=0))
    assert stream.getvalue() == "", "no line before the interval"
    clock.now = 10.0
    progress.finished(outcome(True, tokens=300))
    assert stream.getvalue() == "eval: 3/4 done, 0 running, 1 failed, 30 tok/s, accuracy 0.667\n"
    progress.close()
    assert (
        stream.getvalue().splitlines()[-1] == "eval: 3/4 done, 0 running, 1 failed, 30 tok/s, accuracy 0.667"
    )


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_on_a_terminal():
    stream, clock = Terminal(), Clock()
    progress = EvalProgress(2, stream=stream, clock=clock)
    progress.started()
    clock.now = 1.0
    progress.finished(outcome(True, tokens=50))
    progress.close()
    shown = stream.getvalue()
    assert "\r" in shown and "2/2" not in shown and "1/2" in shown
    assert "0 running, 0 failed, 50 tok/s, accuracy 1.000" in shown
