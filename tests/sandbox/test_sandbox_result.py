"""The exact text the model sees for each outcome of a run (no process needed)."""

from __future__ import annotations

from slime_strands.sandbox import ExecutionResult


def test_the_text_the_model_sees():
    def text(*args, **kwargs) -> str:
        return ExecutionResult(*args, **kwargs).to_model_text()

    assert text("a\n", "", None, timed_out=True, timeout_s=10.0) == "a\n[timeout: killed after 10.0 s]"
    assert text("", "Traceback ...\nMemoryError\n", 137, memory_mb=2048) == (
        "[stderr]\nTraceback ...\nMemoryError\n[memory limit exceeded (2048 MiB)]"
    )
    assert text("", "", None, signal=24) == "[killed by SIGXCPU: CPU time limit]"
    handled = "MemoryError: caught, printed, then exit(1)\n"
    assert text("", handled, 1) == f"[stderr]\n{handled}[exit code 1]"  # not a memory-limit marker
    assert text("out\n", "warn\n", 2) == "out\n[stderr]\nwarn\n[exit code 2]"
    assert text("", "", None, error="boom") == "[sandbox error: boom]"
    long = ExecutionResult("h" * 6000 + "t" * 6000, "", 0, output_truncated=True).to_model_text(1000)
    assert len(long) <= 1000 and long.startswith("hhh") and "characters omitted] ...\ntt" in long
    assert long.endswith("t\n[output limit: only the head and tail were kept]")
