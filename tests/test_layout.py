"""The source's layout (issue 42): no source file over 400 lines, and no two modules that import each other.

Read as text (ast), nothing imported: every import counts, at the top, inside a function (a lazy import) or
under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

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
