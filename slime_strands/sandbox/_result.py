"""What one execution produced, and the text the model sees for it."""

from __future__ import annotations

import signal
from dataclasses import dataclass

__all__ = ["ExecutionResult", "Figure", "cut_middle"]


@dataclass(frozen=True)
class Figure:
    """An image file a run saved in its working directory (``plt.savefig("plot.png")``), as written."""

    name: str
    data: bytes

    @property
    def format(self) -> str | None:
        """Strands' image format, from the file's own bytes (never its name): None when it is no image."""
        for magic, kind in _MAGIC:
            if self.data.startswith(magic):
                return kind
        return None


_MAGIC = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpeg"), (b"GIF8", "gif"), (b"RIFF", "webp"))


def cut_middle(text: str, limit: int) -> tuple[str, bool]:
    """``text`` within ``limit`` characters: head + marker + tail when longer."""
    if len(text) <= limit:
        return text, False
    marker = "\n... [{} characters omitted] ...\n"
    keep = max(limit - len(marker.format(len(text))), 2)
    head, tail = text[: keep - keep // 2], text[len(text) - keep // 2 :]
    return head + marker.format(len(text) - len(head) - len(tail)) + tail, True


@dataclass(frozen=True)
class ExecutionResult:
    """The outcome of running one snippet in the sandbox."""

    stdout: str
    stderr: str
    exit_code: int | None
    """Exit status; None when the run was killed (timeout) or died from a signal."""
    signal: int | None = None
    timed_out: bool = False
    output_truncated: bool = False
    """stdout / stderr were longer than the sandbox kept (head + tail shown)."""
    duration_s: float = 0.0
    backend: str = ""
    timeout_s: float | None = None
    memory_mb: int | None = None
    error: str | None = None
    """The sandbox itself failed (not the code): the reason."""
    figures: tuple[Figure, ...] = ()
    """Image files the run saved in its working directory, with ``sandbox.return_figures``."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.error is None

    @property
    def memory_exceeded(self) -> bool:
        """The code died of an uncaught MemoryError (the sandbox exits such runs with 137)."""
        return self.exit_code == 137

    def to_model_text(self, max_chars: int = 8000) -> str:
        """stdout, then stderr / traceback, then one marker per limit hit; bounded to ``max_chars``."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        if self.error:
            parts.append(f"[sandbox error: {self.error}]")
        if self.timed_out:
            parts.append(f"[timeout: killed after {self.timeout_s or self.duration_s:.1f} s]")
        if self.memory_exceeded:
            parts.append(f"[memory limit exceeded ({self.memory_mb} MiB)]")
        if self.signal is not None:
            name = signal.Signals(self.signal).name if self.signal in signal.valid_signals() else self.signal
            reason = {"SIGXCPU": ": CPU time limit", "SIGXFSZ": ": file size limit"}.get(str(name), "")
            parts.append(f"[killed by {name}{reason}]")
        for figure in self.figures:  # an image's own line comes with it (the model's side: shown or why not)
            if not figure.format:
                parts.append(f"[{figure.name}: not an image]")
        if self.output_truncated:
            parts.append("[output limit: only the head and tail were kept]")
        if self.exit_code not in (0, None) and not self.memory_exceeded:
            parts.append(f"[exit code {self.exit_code}]")
        text = "\n".join(parts) if parts else "[no output: print() what you want to see]"
        return cut_middle(text, max_chars)[0]
