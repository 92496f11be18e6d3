"""No import in the repository points up a layer, and no modules import each other in a loop.

The layers docs/architecture.md draws are declared once below (LAYERS), bottom to top; each entry is a dotted
module prefix. A module may import only from its own layer or a layer below it. Every Python file of the
repository is checked: the package, ``data_prep/`` (the package's eval reads its row format; it names the
package's install hints), and the package's users on top: ``tests/``, ``benchmarks/`` and the scripts' Python.
Every import counts: module level, inside functions (lazy imports are real dependencies), and under
``if TYPE_CHECKING:`` (a type that points up is the same smell), and so do the packages an import runs first:
importing ``slime_strands.errors`` from ``data_prep`` runs ``slime_strands/__init__.py``, the facade at the top.
Every file must fall in exactly one layer, so a new module cannot slip in undeclared.

Loops are checked on the same imports. Modules that import each other, at once or through others, are a loop even
when no arrow points up: ``data_prep`` and the command line were one (through a function-level import and the
packages it ran), ``template/render.py`` and ``template/probe.py`` another (each called the other; one of the two
imports was under ``TYPE_CHECKING``).

The check reads the source with ``ast`` (nothing is imported, so an import cycle or a heavy dependency cannot
hide an arrow), resolves relative imports, and treats ``from pkg import name`` as an import of the submodule
``pkg.name`` when that is a module file. Files are named as they are imported: the packages from the
repository's root, the test helpers from the folders pytest puts on ``sys.path`` (``tests``, ``tests/sandbox``),
the vLLM stand-in from the folder the real-SGLang tier puts on it.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # tests/unit/ -> the repository
IMPORT_ROOTS = ("", "tests", "tests/sandbox", "scripts/real_sglang/import_stub")
"""The folders a module is imported from, relative to the repository (the nearest one names a file)."""
SKIPPED = frozenset({".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__"})

# Bottom to top. A prefix names a module or a whole package; the longest matching prefix wins. Files outside a
# package are named by their path (``tests/...``, ``benchmarks/...``, ``scripts/...``).
LAYERS: tuple[tuple[str, ...], ...] = (
    (  # errors, the time limit, pip hints, the strict reader of saved data, joining Ray outside slime
        "slime_strands.errors",
        "slime_strands._aio",
        "slime_strands._ray_session",
        "slime_strands.strict_reader",
    ),
    ("slime_strands.tool_parsers",),  # text -> tool calls; knows no tokenizer, template or agent
    ("slime_strands.template",),  # chat rendering, the template probe, token codecs
    ("slime_strands.provider",),  # SGLangClient, SGLangModel, TokenManager, SGLang's sampling keys
    ("slime_strands.settings",),  # the frozen plugin settings; owns every default and choice list
    ("slime_strands.sandbox",),  # model-written code, isolated
    ("slime_strands.code_grading",),  # a program against unit tests in the sandbox (the code reward)
    ("slime_strands.mcp_tools",),  # MCP servers' tools: sessions on the episode's loop, shared or per episode
    ("slime_strands.agent",),  # one episode: Agent, record, compaction, sub-agents, limits, pacing
    ("slime_strands.workers",),  # where episodes run: the Ray pool of rollout workers
    ("slime_strands._slime",),  # reading slime's args / Sample / GenerateState, writing Samples
    (  # slime's hooks and the trajectory file
        "slime_strands.rollout",
        "slime_strands.reward",
        "slime_strands._verify_worker",
        "slime_strands.reward_norm",
        "slime_strands.metrics",
        "slime_strands.trajectories",
    ),
    ("data_prep",),  # prompt datasets in slime's format; the eval reads its rows
    ("slime_strands.cli",),  # the slime-strands command
    ("slime_strands.testing",),  # for tests and users: nothing in the package imports it
    ("slime_strands", "slime_strands.subagents"),  # the facade, public re-exports
    ("tests", "benchmarks", "scripts", "configs"),  # the package's users (configs: an example MCP server)
)
FACADES = frozenset({"slime_strands"})
"""Prefixes that name one module (a package's ``__init__``), never the modules below it."""


@dataclasses.dataclass(frozen=True)
class Module:
    name: str
    """The dotted name it is imported by."""
    path: Path
    package: str
    """The package relative imports start from."""
    layer_key: str
    """What LAYERS matches: the dotted name in a package, else the file's path (``tests.unit.test_x``)."""


@dataclasses.dataclass(frozen=True)
class Arrow:
    source: str
    target: str
    line: int
    lazy: bool  # inside a function or under TYPE_CHECKING
    implied: bool = False  # a package whose __init__ the import runs, not the import's own target

    def __str__(self) -> str:
        where = " (lazy or TYPE_CHECKING)" if self.lazy else ""
        how = "runs the package" if self.implied else "imports"
        return f"{self.source} {how} {self.target} at line {self.line}{where}"


def python_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        if not SKIPPED.intersection(path.relative_to(root).parts[:-1]):
            yield path


def modules_of(root: Path, import_roots: Sequence[str] = IMPORT_ROOTS) -> dict[str, Module]:
    """Every Python file under ``root``, by the name it is imported with (see the module docstring)."""
    found: dict[str, Module] = {}
    for path in python_files(root):
        relative = path.relative_to(root)
        home = max(
            (r for r in import_roots if not r or relative.is_relative_to(r)), key=lambda r: len(Path(r).parts)
        )
        name = _dotted(relative.relative_to(home) if home else relative)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        in_package = not home and (path.parent / "__init__.py").is_file()
        found[name] = Module(name, path, package, name if in_package else _dotted(relative))
    return found


def _dotted(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(module: Module, modules: dict[str, Module]) -> Iterator[Arrow]:
    """Every import of a repository module in ``module``'s file, relative ones resolved."""
    tree = ast.parse(module.path.read_text(), filename=str(module.path))
    top = {id(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            targets = [
                f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names
            ]
        else:
            continue
        for target in dict.fromkeys(_known(t, modules) for t in targets):
            if target is None or target == module.name:
                continue
            lazy = id(node) not in top
            yield Arrow(module.name, target, node.lineno, lazy=lazy)
            for package in _packages_run(module.name, target, modules):
                yield Arrow(module.name, package, node.lineno, lazy=lazy, implied=True)


def _packages_run(source: str, target: str, modules: dict[str, Module]) -> Iterator[str]:
    """The packages whose ``__init__`` importing ``target`` runs first, but for ``source``'s own (already
    running): importing ``slime_strands.cli.errors`` from ``data_prep`` runs ``slime_strands`` and
    ``slime_strands.cli``."""
    parts = target.split(".")
    for end in range(1, len(parts)):
        package = ".".join(parts[:end])
        if package in modules and not (source == package or source.startswith(package + ".")):
            yield package


def _known(name: str, modules: dict[str, Module]) -> str | None:
    """The repository module ``name`` imports (``import a.b`` of a module ``a.b``), or None (not ours)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def layer_of(key: str, layers: Sequence[Sequence[str]] = LAYERS) -> int:
    """Index of the layer whose longest prefix matches ``key``; KeyError when none does."""
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(layers):
        for prefix in prefixes:
            inside = key.startswith(prefix + ".") and prefix not in FACADES
            if (key == prefix or inside) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    if best is None:
        raise KeyError(key)
    return best[1]


def upward_arrows(
    modules: dict[str, Module], layers: Sequence[Sequence[str]] = LAYERS
) -> list[tuple[Arrow, str, str]]:
    """Every import that points up a layer, with both layers' names."""
    found = []
    for module in modules.values():
        for arrow in imports_of(module, modules):
            low, high = layer_of(module.layer_key, layers), layer_of(modules[arrow.target].layer_key, layers)
            if high > low:
                found.append((arrow, layers[low][0], layers[high][0]))
    return found


def import_loops(modules: dict[str, Module]) -> list[list[str]]:
    """The loops of imports: every strongly connected group of two or more modules (Tarjan's)."""
    graph = {name: sorted({a.target for a in imports_of(m, modules)}) for name, m in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(start: str) -> None:  # iterative: the repository's import chains are deep
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(graph[step])))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    loops.append(sorted(group))

    for name in graph:
        if name not in index:
            visit(name)
    return loops


SLIME_ARGS_TAKERS = (
    "slime_strands._slime",  # the boundary: SlimeConfig reads slime's args once
    "slime_strands.rollout",  # slime's hooks, which slime calls with its args
    "slime_strands.reward",
    "slime_strands.reward_norm",
    "slime_strands.metrics",
    "slime_strands.testing",  # slime's Sample and trainer checks, mirrored for tests
)
"""The modules whose functions may take slime's ``args`` (a parameter named ``args``, as slime's hooks name it);
everything else gets the typed ``SlimeConfig``."""


def takers_of_slime_args(modules: dict[str, Module], allowed: Sequence[str] = SLIME_ARGS_TAKERS) -> list[str]:
    """``module:line function`` of every function outside ``allowed`` with a parameter named ``args``."""
    found = []
    for module in modules.values():
        inside = any(module.name == a or module.name.startswith(a + ".") for a in allowed)
        if inside or not module.name.startswith("slime_strands"):
            continue
        for node in ast.walk(ast.parse(module.path.read_text(), filename=str(module.path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                names = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
                if "args" in names:
                    found.append(f"{module.name}:{node.lineno} {getattr(node, 'name', 'lambda')}")
    return found


def _lines(items: Iterable[object]) -> str:
    return "\n".join(map(str, items))


# -- the tests -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo() -> dict[str, Module]:
    """Every module of the repository, read once per run of this file (not when it is collected)."""
    return modules_of(ROOT)


def test_the_whole_repository_is_read(repo):
    keys = {m.layer_key.partition(".")[0] for m in repo.values()}
    assert {"slime_strands", "data_prep", "tests", "benchmarks", "scripts"} <= keys
    assert "data_prep.prepare" in repo and "helpers" in repo and "real_sglang.server_process" in repo


def test_every_module_is_in_a_layer(repo):
    undeclared = []
    for module in repo.values():
        try:
            layer_of(module.layer_key)
        except KeyError:
            undeclared.append(module.layer_key)
    assert undeclared == [], "declare each module's layer in LAYERS"


def test_no_import_points_up_a_layer(repo):
    arrows = upward_arrows(repo)
    assert arrows == [], "imports that point up a layer:\n" + _lines(
        f"{a} (layer {low} imports layer {high})" for a, low, high in arrows
    )


def test_no_modules_import_each_other_in_a_loop(repo):
    loops = import_loops(repo)
    assert loops == [], "modules that import each other (at once or through others):\n" + _lines(
        " <-> ".join(loop) for loop in loops
    )


def test_nothing_in_the_package_imports_testing(repo):
    users = [
        arrow
        for module in repo.values()
        if module.name.startswith(("slime_strands", "data_prep"))
        for arrow in imports_of(module, repo)
        if arrow.target.startswith("slime_strands.testing")
        and not arrow.source.startswith("slime_strands.testing")
    ]
    assert users == [], "slime_strands.testing is for tests and users:\n" + _lines(users)


def test_only_the_slime_boundary_takes_slimes_args(repo):
    """slime's namespace is read once, in ``_slime/`` (``SlimeConfig``); below the hooks nothing takes it."""
    takers = takers_of_slime_args(repo)
    assert takers == [], "functions that take slime's args outside _slime/ and the hooks:\n" + _lines(takers)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_sees_every_kind_of_import(tmp_path):
    """The checker itself can fail: an upward import hidden in a function, under TYPE_CHECKING or written
    relative is found, in the package and from a folder beside it, and so is a package's ``__init__`` that an
    import runs."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/high.py": "X = 1\n",
            "pkg/low/__init__.py": "from typing import TYPE_CHECKING\n",
            "pkg/low/a.py": "def f():\n    from ..high import X\n    return X\n",
            "pkg/low/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import high\n",
            "pkg/low/c.py": "from . import a\n",  # same layer: allowed
            "tools/__init__.py": "",
            "tools/use.py": "import pkg.high\n",  # above pkg.low: allowed
            "tests/helper.py": "def f():\n    import tools.use\n",  # the top: allowed
            "tools/bad.py": "from helper import f\n",  # a test helper, from below the tests
            "rows/__init__.py": "",
            "rows/prep.py": "def hint():\n    from pkg.low.c import a\n",  # low, but runs the package's top
        },
    )
    modules = modules_of(tmp_path, ("", "tests"))
    layers = (("pkg.low",), ("rows",), ("pkg.high", "pkg"), ("tools",), ("tests",))
    found = {(a.source, a.target, a.lazy) for a, _, _ in upward_arrows(modules, layers)}
    assert found == {
        ("pkg.low.a", "pkg.high", True),
        ("pkg.low.b", "pkg.high", True),
        ("tools.bad", "helper", False),
        ("rows.prep", "pkg", True),
    }


def test_the_args_check_can_fail(tmp_path):
    _write(
        tmp_path,
        {
            "slime_strands/__init__.py": "",
            "slime_strands/_slime/config.py": "def of(args):\n    return args\n",
            "slime_strands/agent/episode.py": "async def run(spec, *args, args_seen=0):\n    pass\n",
            "slime_strands/agent/spec.py": "def episode_spec(config, args):\n    return args.flag\n",
            "slime_strands/provider/x.py": "F = lambda args: args\n",
        },
    )
    assert takers_of_slime_args(modules_of(tmp_path, ("",)), ("slime_strands._slime",)) == [
        "slime_strands.agent.spec:1 episode_spec",
        "slime_strands.provider.x:1 lambda",
    ]


def test_the_checker_finds_loops(tmp_path):
    """Loops through a function-level import, a ``TYPE_CHECKING`` one and a package's ``__init__`` are found;
    the ``__init__`` of a module's own package (already running) is no step of a loop."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .render import X\n",
            "pkg/render.py": "from .probe import detect\n",
            "pkg/facts.py": "from pkg.probe import detect\n",  # runs no __init__ but pkg's own (running)
            "pkg/probe.py": "def detect():\n    from .render import X\n",
            "pkg/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .user import U\n",
            "pkg/user.py": "from .typed import T\n",
            "pkg/cli/__init__.py": "def main():\n    from .run import go\n",
            "pkg/cli/run.py": "from data.prepare import rows\n",
            "pkg/cli/hints.py": "HINT = 1\n",
            "data/prepare.py": "def hint():\n    from pkg.cli.hints import HINT\n",
        },
    )
    loops = import_loops(modules_of(tmp_path, ("",)))
    assert sorted(loops) == [
        ["data.prepare", "pkg.cli", "pkg.cli.run"],
        ["pkg.probe", "pkg.render"],
        ["pkg.typed", "pkg.user"],
    ]
