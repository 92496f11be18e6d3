"""The pip command that adds one of slime-strands' optional extras (``wandb``, ``data``, ...) to THIS install.

``pip install 'slime-strands[wandb]'`` is right for an install from an index and wrong for a clone installed
with ``pip install -e .`` (it would fetch another copy), which is how the README installs it; there the command
is ``pip install -e '<the clone>[wandb]'``. Which one applies is read from where the package is imported from: a
source checkout has this project's ``pyproject.toml`` beside the package folder (an editable install, or a
checkout on the path), an installed copy does not. (The distribution's PEP 610 ``direct_url.json`` cannot be
trusted for this: run from a checkout, ``importlib.metadata`` finds the checkout's own ``*.egg-info`` first,
which has none.)
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["install_command"]

DISTRIBUTION = "slime-strands"
_NAME = re.compile(r'^name\s*=\s*"slime-strands"\s*$', re.MULTILINE)
_PACKAGE_DIR = Path(__file__).resolve().parent
"""The imported ``slime_strands`` folder (this file is ``slime_strands/install_hints.py``)."""


def install_command(extra: str, package_dir: Path | None = None) -> str:
    """``pip install -e '<checkout>[extra]'`` when the package is imported from a source checkout, else
    ``pip install 'slime-strands[extra]'``; ``package_dir``: the imported ``slime_strands`` folder (default:
    this one)."""
    checkout = (package_dir or _PACKAGE_DIR).parent
    if _is_this_project(checkout / "pyproject.toml"):
        return f"pip install -e '{checkout}[{extra}]'"
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def _is_this_project(pyproject: Path) -> bool:
    try:
        return _NAME.search(pyproject.read_text(encoding="utf-8")) is not None
    except (OSError, UnicodeDecodeError):
        return False
