"""The source's layout (issue 42): no source file over 400 lines, and no two modules that import each other.

Read as text (ast), nothing imported: every import counts, at the top, inside a function (a lazy import) or
under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 400
CODE_SUFFIXES = (".py", ".js", ".css", ".html")  # (the data files under tasks/data are not code)


def _modules() -> dict[str, tuple[Path, bool]]:
    """{dotted name: (file, is a package's __init__)} of every module under src/."""
    modules = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if package else parts)] = (path, package)
    return modules


def _imported(name: str, modules: dict) -> str | None:
    """The module of ours that importing ``name`` (a module, or a name in one) reads; None for another package's."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_edges() -> dict[str, set[str]]:
    """{module: the modules of ours it imports anywhere in its text}; ``from package import submodule``
    counts as importing the submodule, ``from package import name`` as importing the package."""
    modules = _modules()
    edges: dict[str, set[str]] = {}
    for module, (path, package) in modules.items():
        here = module if package else module.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found.update(_imported(alias.name, modules) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the package up level - 1 times
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    found.add(full if full in modules else _imported(source, modules))
        found.discard(None)
        found.discard(module)
        edges[module] = found
    return edges


def test_no_source_file_is_over_400_lines():
    long = {str(path.relative_to(SRC)): n for path in SRC.rglob("*") if path.suffix in CODE_SUFFIXES
            for n in [len(path.read_text(encoding="utf-8").splitlines())] if n > MAX_LINES}
    assert long == {}, f"split these where the code has a seam (at most {MAX_LINES} lines): {long}"


def test_no_two_modules_import_each_other():
    edges = import_edges()
    both = sorted({tuple(sorted((a, b))) for a, targets in edges.items() for b in targets if a in edges.get(b, ())})
    assert both == [], f"modules that import each other: {both}"


def test_the_import_walk_sees_lazy_and_type_checking_imports(tmp_path, monkeypatch):
    """The check itself: a pair tied only by an import inside a function and one under TYPE_CHECKING is found."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.b import g\n    return g\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    (package / "c.py").write_text("from . import a\n")
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    edges = import_edges()
    assert edges["pkg.a"] == {"pkg.b"} and edges["pkg.b"] == {"pkg.a"} and edges["pkg.c"] == {"pkg.a"}


def _architecture_tree() -> set[str]:
    """The files docs/architecture.md's tree lists, as paths under src/specdec/ (a folder's entries are
    indented under it)."""
    text = (SRC.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("```")[1].splitlines()
    listed, folders = set(), {}  # indent -> folder path
    top = [i for i, line in enumerate(block) if line.strip() and not line[0].isspace()]  # src/specdec/, tests/, ...
    for line in block[top[0] + 1: top[1]]:
        entry = line.split()[0] if line.strip() else ""
        indent = len(line) - len(line.lstrip())
        if not entry or not (entry.endswith("/") or entry.endswith(".py")):
            continue
        parent = next((folders[i] for i in sorted(folders, reverse=True) if i < indent), "")
        folders = {i: f for i, f in folders.items() if i < indent}
        if entry.endswith("/"):
            folders[indent] = parent + entry
        else:
            listed.add(parent + entry)
    return listed


def test_the_architecture_page_lists_every_module():
    """docs/architecture.md, one line per file, is how a newcomer finds their way: a module added, moved or
    removed without it fails here."""
    package = SRC / "specdec"
    files = {str(p.relative_to(package)) for p in package.rglob("*.py") if "data" not in p.relative_to(package).parts}
    listed = _architecture_tree()
    assert sorted(files - listed) == [], "add these to docs/architecture.md's tree"
    assert sorted(listed - files) == [], "docs/architecture.md lists files that are not there"


def _runs_at_import(tree: ast.Module) -> list[ast.stmt]:
    """The import statements a module runs when it is imported: its top level and the if / try blocks there (not
    those under ``if TYPE_CHECKING:``, which never run), not those inside functions or classes' methods."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return found


def runtime_edges() -> dict[str, set[str]]:
    """{module: the modules of ours that importing it runs first}, as Python runs them: its module-level imports;
    ``from P import x`` runs P's ``__init__`` (then P.x where x is a module); a module imported from outside its
    package runs that package's ``__init__`` (each package above it that does not hold the importer)."""
    modules = _modules()
    edges: dict[str, set[str]] = {}
    for module, (path, package) in modules.items():
        here = module if package else module.rpartition(".")[0]
        named = set()
        for node in _runs_at_import(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                named.update(_imported(alias.name, modules) for alias in node.names)
                continue
            if node.level:
                source = ".".join(here.split(".")[: len(here.split(".")) - node.level + 1] + ([node.module] if node.module else []))
            else:
                source = node.module
            named.add(_imported(source, modules))
            named.update(f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in modules)
        named.discard(None)
        runs = set(named)
        for target in named:  # the packages above an imported module, from outside them
            parts = target.split(".")
            runs.update(p for p in (".".join(parts[:i]) for i in range(2, len(parts)))
                        if p in modules and not (here == p or here.startswith(p + ".")))
        runs.discard(module)
        edges[module] = runs
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    """Issue 69: no files of src/specdec that import one another in a circle when they load (a package's __init__
    counted: importing from a package runs it), so every arrow points down."""
    assert circles(runtime_edges()) == [], "import circles (module-level imports): break each where it points up"


def test_the_circle_check_sees_a_package_init(tmp_path, monkeypatch):
    """The check itself: a circle closed only through a package's __init__ (from P import x, or P.m imported from
    outside P) is found; imports inside functions and under TYPE_CHECKING are not module-level."""
    for name, text in {
        "pkg/__init__.py": "",
        "pkg/a/__init__.py": "from pkg.a.m import f\n",
        "pkg/a/m.py": "from pkg.b import g\ndef f():\n    from pkg.c import h\n",
        "pkg/b.py": "from pkg.a.n import g\n",  # runs pkg.a's __init__, which imports pkg.a.m: a circle
        "pkg/a/n.py": "g = 1\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import m\nfrom pkg.a import n\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    edges = runtime_edges()
    assert edges["pkg.b"] == {"pkg.a.n", "pkg.a"} and edges["pkg.c"] == {"pkg.a", "pkg.a.n"}
    assert circles(edges) == [["pkg.a", "pkg.a.m", "pkg.b"]]


#: models/'s rooms, lowest first (docs/architecture.md): a room's files import, anywhere in their text (inside
#: functions too), only rooms below their own and the modules every room may use.
MODEL_ROOMS = ("kernels", "cache", "quantized", "native", "sessions", "formats")
BOTTOM = {"specdec.errors", "specdec.devices", "specdec.text"}
MAX_MODULES = 15  # per folder, a package's __init__ not counted


def _room(module: str) -> int | None:
    """The rank of the models/ room a module of ours is in (the top, models/ itself, ranks last); None outside."""
    parts = module.split(".")
    if parts[:2] != ["specdec", "models"]:
        return None
    return MODEL_ROOMS.index(parts[2]) if len(parts) > 2 and parts[2] in MODEL_ROOMS else len(MODEL_ROOMS)


def test_the_model_rooms_import_downwards_only():
    """Issue 69: kernels < cache < quantized < native < sessions < formats < models/ (load, the model types): no
    room reaches one above it or the library above models/ (config, drafters, the engines), not even lazily."""
    up = sorted(f"{a} -> {b}" for a, targets in import_edges().items() if _room(a) is not None for b in targets
                if b not in BOTTOM and (_room(b) is None or _room(b) > _room(a)))
    assert up == [], "imports that point up from a models/ room (move the code down, or the caller up)"


def test_no_folder_holds_more_than_15_modules():
    counts = {}
    for path in (SRC / "specdec").rglob("*.py"):
        if path.name != "__init__.py":
            counts[str(path.parent.relative_to(SRC))] = counts.get(str(path.parent.relative_to(SRC)), 0) + 1
    assert {k: v for k, v in counts.items() if v > MAX_MODULES} == {}, "group these folders' modules into rooms"


def test_the_room_check_sees_an_upward_import(monkeypatch):
    """The check itself: a kernels/ file importing quantized/ (inside a function) is an upward arrow."""
    edges = {"specdec.models.kernels.build": {"specdec.models.quantized.int4", "specdec.errors"},
             "specdec.models.quantized.int4": {"specdec.models.kernels.build"}}
    monkeypatch.setitem(globals(), "import_edges", lambda: edges)
    with pytest.raises(AssertionError, match="kernels.build -> specdec.models.quantized.int4"):
        test_the_model_rooms_import_downwards_only()
