"""The pip command that adds one of slime-strands' optional extras (``wandb``, ``data``, ...) to THIS install.

``pip install 'slime-strands[wandb]'`` is right for an install from an index and wrong for a clone installed
with ``pip install -e .`` (it would fetch another copy), which is how the README installs it; there the command
is ``pip install -e '<the clone>[wandb]'``. Which one applies is read from where the package is imported from: a
source checkout has this project's ``pyproject.toml`` beside the package folder (an editable install, or a
checkout on the path), an installed copy does not. (The distribution's PEP 610 ``direct_url.json`` cannot be
trusted for this: run from a checkout, ``importlib.metadata`` finds the checkout's own ``*.egg-info`` first,
which has none.)

It lives in ``data_prep``, the distribution's package below the command line: ``data_prep`` (whose sources need
the ``data`` extra) imports nothing of ``slime_strands`` (importing any of it runs the package's ``__init__``,
which imports the command line, which imports ``data_prep``), and the command line imports it from here.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["install_command"]

DISTRIBUTION = "slime-strands"
_NAME = re.compile(r'^name\s*=\s*"slime-strands"\s*$', re.MULTILINE)
_PACKAGE_DIR = Path(__file__).resolve().parent
"""The imported ``data_prep`` folder (this file is ``data_prep/install_hints.py``): a checkout has this project's
``pyproject.toml`` beside it, as beside ``slime_strands``."""


def install_command(extra: str, package_dir: Path | None = None) -> str:
    """``pip install -e '<checkout>[extra]'`` when the distribution is imported from a source checkout, else
    ``pip install 'slime-strands[extra]'``; ``package_dir``: an imported package folder of the distribution
    (default: ``data_prep``'s)."""
    checkout = (package_dir or _PACKAGE_DIR).parent
    if _is_this_project(checkout / "pyproject.toml"):
        return f"pip install -e '{checkout}[{extra}]'"
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def _is_this_project(pyproject: Path) -> bool:
    try:
        return _NAME.search(pyproject.read_text(encoding="utf-8")) is not None
    except (OSError, UnicodeDecodeError):
        return False
