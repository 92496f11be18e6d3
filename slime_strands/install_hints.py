"""The pip command that adds one of slime-strands' optional extras (``wandb``, ``data``, ...) to THIS install.

``pip install 'slime-strands[wandb]'`` is right for an install from an index and wrong for a clone installed
with ``pip install -e .`` (it would fetch another copy), which is how the README installs it; there the command
is ``pip install -e '<the clone>[wandb]'``. pip records which one it did in the distribution's
``direct_url.json`` (PEP 610); a checkout imported without being installed gets the editable form too.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

__all__ = ["install_command"]

DISTRIBUTION = "slime-strands"


def install_command(extra: str, distribution: importlib.metadata.Distribution | None = None) -> str:
    """``pip install -e '<folder>[extra]'`` for an editable install or an uninstalled checkout, else
    ``pip install 'slime-strands[extra]'``; ``distribution`` defaults to the installed one."""
    folder = _editable_folder(distribution)
    if folder is not None:
        return f"pip install -e '{folder}[{extra}]'"
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def _editable_folder(distribution: importlib.metadata.Distribution | None) -> str | None:
    if distribution is None:
        try:
            distribution = importlib.metadata.distribution(DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            checkout = Path(__file__).resolve().parents[1]
            return str(checkout) if (checkout / "pyproject.toml").is_file() else None
    try:
        origin = json.loads(distribution.read_text("direct_url.json") or "{}")
    except ValueError:
        return None
    if not isinstance(origin, dict) or not (origin.get("dir_info") or {}).get("editable"):
        return None
    url = urlparse(str(origin.get("url", "")))
    return unquote(url.path) if url.scheme == "file" and url.path else None
