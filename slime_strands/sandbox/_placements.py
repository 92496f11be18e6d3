"""Where snippets run: each ``sandbox.placement`` value's object, and the runner for some settings.

The one place a placement's name is looked up (the settings own the names and check them); a placement
is a :class:`~._runner.Placement`, its runners :class:`~._runner.CodeRunner` s.
"""

from __future__ import annotations

from ..settings import SandboxSettings
from ._host import HOST
from ._local import LOCAL
from ._ray_pool import RAY
from ._runner import CodeRunner, Placement

__all__ = ["PLACEMENTS", "placement", "runner"]

PLACEMENTS: dict[str, Placement] = {"local": LOCAL, "ray": RAY}
"""``sandbox.placement`` -> its object."""


def placement(settings: SandboxSettings) -> Placement:
    return PLACEMENTS[settings.placement]


def runner(settings: SandboxSettings) -> CodeRunner:
    """The runner for ``settings`` where its placement keeps them (this loop's, or the process's)."""
    return HOST.runner(settings, placement(settings))
