"""Writes the CPU smoke's plugin settings file: the recipe's file with the smoke's overlay merged in, checked.

    python scripts/slime_cpu/render_settings.py BASE.yaml OVERLAY.yaml OUT.yaml

Mappings merge key by key (the overlay wins; a list or a value replaces the base's), so the smoke runs the
recipe's settings except exactly what the overlay says. The result is checked as slime's run will read it
(``PluginSettings.from_yaml``): a bad key or value stops here with one line, status 2, and no file written.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from slime_strands.errors import SlimeStrandsError
from slime_strands.settings import PluginSettings


def merge(base: Any, overlay: Any) -> Any:
    """``overlay`` on top of ``base``: mappings merged recursively, anything else replaced."""
    if isinstance(base, Mapping) and isinstance(overlay, Mapping):
        merged = dict(base)
        for key, value in overlay.items():
            merged[key] = merge(base.get(key), value) if key in base else value
        return merged
    return overlay


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: render_settings.py BASE.yaml OVERLAY.yaml OUT.yaml", file=sys.stderr)
        return 2
    base_path, overlay_path, out = (Path(a) for a in argv)
    try:
        base = yaml.safe_load(base_path.read_text()) or {}
        overlay = yaml.safe_load(overlay_path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        print(f"render_settings: {exc}", file=sys.stderr)
        return 2
    text = f"# Rendered by scripts/slime_cpu/render_settings.py: {base_path} + {overlay_path}.\n"
    text += yaml.safe_dump(merge(base, overlay), sort_keys=False)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    try:
        PluginSettings.from_yaml(str(tmp))
    except (SlimeStrandsError, ValueError, TypeError) as exc:
        tmp.unlink()
        print(
            f"render_settings: {overlay_path} on {base_path} is not a valid settings file: {exc}",
            file=sys.stderr,
        )
        return 2
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
