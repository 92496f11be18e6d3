"""Progress of an eval: trajectories done / running / failed, generated tokens per second, accuracy so far.

A tqdm bar on a terminal (tqdm already comes with transformers and huggingface_hub, so it costs no new
install; rich would be a second rendering stack for one line); plain status lines every ``interval_s``
seconds and at the end when the output is a file or a pipe (CI logs, ``nohup``), where carriage-return
redraws would be noise.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from .summary import TrajectoryTally

__all__ = ["EvalProgress"]

_REDRAW_S = 0.5


class EvalProgress:
    """Counts episodes as they start and finish and shows the figures; :meth:`close` prints the last state."""

    def __init__(
        self,
        total: int,
        *,
        resumed: Sequence[TrajectoryTally] = (),
        stream: TextIO | None = None,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.done = len(resumed)
        self.running = 0
        self.failed = sum(o.failed for o in resumed)
        self._correct = sum(o.correct for o in resumed)
        self._tokens = 0  # generated in this run (resumed rows took their time in another)
        self._stream = stream if stream is not None else sys.stderr
        self._interval_s = interval_s
        self._clock = clock
        self._started = clock()
        self._last_line = self._started
        self._bar: Any = None
        if _is_terminal(self._stream):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                initial=self.done,
                file=self._stream,
                unit="traj",
                desc="eval",
                dynamic_ncols=True,
            )
            self._bar.set_postfix_str(self._figures(), refresh=True)

    @property
    def accuracy(self) -> float | None:
        return self._correct / self.done if self.done else None

    @property
    def tokens_per_second(self) -> float:
        elapsed = self._clock() - self._started
        return self._tokens / elapsed if elapsed > 0 else 0.0

    def started(self) -> None:
        self.running += 1
        self._show(advance=0)

    def finished(self, outcome: TrajectoryTally) -> None:
        self.running -= 1
        self.done += 1
        self.failed += outcome.failed
        self._correct += outcome.correct
        self._tokens += outcome.generated_tokens
        self._show(advance=1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self._figures(), refresh=True)
            self._bar.close()
        else:
            self._stream.write(self.status_line() + "\n")
            self._stream.flush()

    def status_line(self) -> str:
        return f"eval: {self.done}/{self.total} done, {self._figures()}"

    def _figures(self) -> str:
        accuracy = "-" if self.accuracy is None else f"{self.accuracy:.3f}"
        return (
            f"{self.running} running, {self.failed} failed, {self.tokens_per_second:.0f} tok/s, "
            f"accuracy {accuracy}"
        )

    def _show(self, advance: int) -> None:
        now = self._clock()
        if self._bar is not None:
            self._bar.set_postfix_str(self._figures(), refresh=False)
            if advance:
                self._bar.update(advance)
            elif now - self._last_line >= _REDRAW_S:  # a start changes only the running count
                self._last_line = now
                self._bar.refresh()
            return
        if now - self._last_line >= self._interval_s:
            self._last_line = now
            self._stream.write(self.status_line() + "\n")
            self._stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
