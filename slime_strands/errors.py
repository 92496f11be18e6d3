"""The package's exception tree: one root, so callers can catch everything slime-strands raises.

``ConfigurationError`` is the branch that must stop a training run at once (a bad settings file, a tool
that does not import, a chat template that cannot be rendered token-in/token-out, no sandbox isolation):
slime's entry point re-raises it at the first sample instead of turning every sample into a FAILED one.
Everything else is per-episode: it ends one trajectory and never the rollout step.

``InputError`` is input a person gave that cannot be used (a file, an argument): one line saying what is wrong
and a hint saying what to do. The command prints it as that one line; modules below the command raise it
without knowing the command (the trajectory file's ``TrajectoryFileError``, the command's ``CommandError``).
"""

from __future__ import annotations

__all__ = ["ConfigurationError", "InputError", "SlimeStrandsError"]


class SlimeStrandsError(Exception):
    """Root of every exception slime-strands raises on purpose."""


class ConfigurationError(SlimeStrandsError, ValueError):
    """The setup is wrong and no sample can succeed: fix the configuration (the message says how)."""


class InputError(SlimeStrandsError):
    """Input that cannot be used; ``str(error)`` is one line, ``hint`` says what to do next (or None)."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(one_line(message))
        self.hint = one_line(hint) if hint else None


def one_line(text: str) -> str:
    """Messages from libraries (transformers, aiohttp) may span lines: join them into one."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())
