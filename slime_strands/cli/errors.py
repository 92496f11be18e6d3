"""What the ``slime-strands`` command tells a user when it cannot do what was asked: one line, a hint, an
exit status a script can branch on. The command's modules raise :class:`CommandError`; modules below the
command raise its base :class:`~slime_strands.errors.InputError` (exit status 2) or a
:class:`~slime_strands.errors.ConfigurationError`; only ``slime_strands.cli.main`` prints them, so no user sees a traceback
for a wrong path or a server that is down.

Exit statuses (every command):

* ``0``: done.
* ``1``: the command ran and found a problem: a check failed (``check-template``, ``validate-config``) or
  some eval trajectories FAILED (grouped by cause, each saying whether a rerun of the same ``eval`` fixes it).
* ``2``: usage or input error: bad arguments, a missing or malformed file (data rows, plugin config,
  trajectory file), a tokenizer that cannot be loaded, a chat template or tool that cannot work, a missing
  optional dependency.
* ``3``: the SGLang server or router cannot be reached or is not healthy (``check-server``; ``eval`` checks
  before it starts) or stopped answering during an ``eval`` (it stops within seconds; a rerun resumes).
* ``130``: interrupted (Ctrl-C); an ``eval`` with ``--out`` resumes where it stopped.
"""

from __future__ import annotations

from ..errors import InputError

__all__ = [
    "EXIT_FAILURES",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_SERVER",
    "EXIT_USAGE",
    "CommandError",
]

EXIT_OK = 0
EXIT_FAILURES = 1
EXIT_USAGE = 2
EXIT_SERVER = 3
EXIT_INTERRUPTED = 130


class CommandError(InputError):
    """A command cannot run as asked; ``str(error)`` is one line, ``hint`` says what to do next, ``exit_code``
    what the command exits with."""

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code
