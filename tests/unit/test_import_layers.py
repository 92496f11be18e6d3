"""No import in slime_strands points up a layer: the layers docs/architecture.md draws, checked.

The layers, bottom to top, are declared once below (LAYERS); each entry is a dotted module prefix. A module may
import only from its own layer or a layer below it. Every import counts: module level, inside functions (lazy
imports are real dependencies), and under ``if TYPE_CHECKING:`` (a type that points up is the same smell).
Every module of the package must fall in exactly one layer, so a new module cannot slip in undeclared.

The check reads the source with ``ast`` (nothing is imported, so an import cycle or a heavy dependency cannot
hide an arrow), resolves relative imports, and treats ``from pkg import name`` as an import of the submodule
``pkg.name`` when that is a module file.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/unit/ -> the repository
PACKAGE = ROOT / "slime_strands"

# Bottom to top. A prefix names a module or a whole subpackage; the longest matching prefix wins.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("slime_strands.errors", "slime_strands._aio", "slime_strands.install_hints"),  # errors, time limit
    ("slime_strands.tool_parsers",),  # text -> tool calls; knows no tokenizer, template or agent
    ("slime_strands.template",),  # chat rendering, the template probe, token codecs
    ("slime_strands.provider",),  # SGLangClient, SGLangModel, TokenManager, SGLang's sampling keys
    ("slime_strands.settings",),  # the frozen plugin settings; owns every default and choice list
    ("slime_strands.sandbox",),  # model-written code, isolated
    ("slime_strands.agent",),  # one episode: Agent, record, compaction, sub-agents, limits, pacing
    ("slime_strands._slime",),  # reading slime's args / Sample / GenerateState, writing Samples
    (  # slime's hooks and the trajectory file
        "slime_strands.rollout",
        "slime_strands.reward",
        "slime_strands._verify_worker",
        "slime_strands.reward_norm",
        "slime_strands.metrics",
        "slime_strands.trajectories",
    ),
    ("slime_strands.cli",),  # the slime-strands command
    ("slime_strands.testing",),  # for tests and users: nothing in the package imports it
    ("slime_strands", "slime_strands.subagents"),  # the facade, public re-exports
)


@dataclasses.dataclass(frozen=True)
class Arrow:
    source: str
    target: str
    line: int
    lazy: bool  # inside a function or under TYPE_CHECKING

    def __str__(self) -> str:
        where = " (lazy or TYPE_CHECKING)" if self.lazy else ""
        return (
            f"{self.source} (layer {layer_name(self.source)}) imports {self.target} "
            f"(layer {layer_name(self.target)}) at line {self.line}{where}"
        )


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, root: Path = PACKAGE) -> bool:
    relative = Path(*name.split(".")[1:]) if "." in name else Path()
    base = root / relative
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path, root: Path = PACKAGE) -> Iterator[Arrow]:
    """Every import of a package module in ``path``, relative ones resolved."""
    source = module_name(path, root)
    tree = ast.parse(path.read_text(), filename=str(path))
    top = {id(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))}
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            targets = [
                f"{module}.{alias.name}" if _is_module(f"{module}.{alias.name}", root) else module
                for alias in node.names
            ]
        else:
            continue
        for target in dict.fromkeys(targets):
            if target == root.name or target.startswith(root.name + "."):
                yield Arrow(source, target, node.lineno, lazy=id(node) not in top)


def layer_of(module: str, layers: Sequence[Sequence[str]] = LAYERS) -> int:
    """Index of the layer whose longest prefix matches ``module``; KeyError when none does."""
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(layers):
        for prefix in prefixes:
            # The root package stands for its __init__ only, never for every module below it.
            inside = module.startswith(prefix + ".") and "." in prefix
            if (module == prefix or inside) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    if best is None:
        raise KeyError(module)
    return best[1]


def layer_name(module: str, layers: Sequence[Sequence[str]] = LAYERS) -> str:
    return layers[layer_of(module, layers)][0].removeprefix("slime_strands.")


def upward_arrows(layers: Sequence[Sequence[str]] = LAYERS, root: Path = PACKAGE) -> list[Arrow]:
    return [
        arrow
        for path in sorted(root.rglob("*.py"))
        for arrow in imports_of(path, root)
        if layer_of(arrow.target, layers) > layer_of(arrow.source, layers)
    ]


# -- the tests -------------------------------------------------------------------------------------------


def test_every_module_is_in_a_layer():
    undeclared = []
    for path in PACKAGE.rglob("*.py"):
        try:
            layer_of(module_name(path))
        except KeyError:
            undeclared.append(module_name(path))
    assert undeclared == [], "declare each module's layer in LAYERS"


def test_no_import_points_up_a_layer():
    arrows = upward_arrows()
    assert arrows == [], "imports that point up a layer:\n" + "\n".join(map(str, arrows))


def test_nothing_in_the_package_imports_testing():
    users = [
        arrow
        for path in PACKAGE.rglob("*.py")
        for arrow in imports_of(path)
        if arrow.target.startswith("slime_strands.testing")
        and not arrow.source.startswith("slime_strands.testing")
    ]
    assert users == [], "slime_strands.testing is for tests and users:\n" + "\n".join(map(str, users))


def test_the_checker_sees_every_kind_of_import(tmp_path):
    """The checker itself can fail: an upward import hidden in a function, under TYPE_CHECKING or written
    relative is found."""
    package = tmp_path / "slime_strands"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "high.py").write_text("X = 1\n")
    (package / "low" / "__init__.py").write_text("from typing import TYPE_CHECKING\n")
    (package / "low" / "a.py").write_text("def f():\n    from ..high import X\n    return X\n")
    (package / "low" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from slime_strands import high\n"
    )
    (package / "low" / "c.py").write_text("from . import a\n")  # same layer: allowed
    layers = (("slime_strands.low",), ("slime_strands.high", "slime_strands"))
    found = {(a.source, a.target, a.lazy) for a in upward_arrows(layers, package)}
    assert found == {
        ("slime_strands.low.a", "slime_strands.high", True),
        ("slime_strands.low.b", "slime_strands.high", True),
    }
