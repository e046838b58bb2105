"""The repository describes itself as it is: engine and specviz import without a cycle (every
import counted, function-level ones too), ARCHITECTURE.md names every module and only modules
that exist, every package's docstring names every module of the package, and README, docs/
and the code carry no development history."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "specviz")


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the two packages."""
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the two packages it imports anywhere in its body (module level,
    function level, TYPE_CHECKING blocks); `from pkg import name` counts as importing
    pkg.name when that is a module, else pkg."""
    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                           else node.module for a in node.names]
            for t in targets:
                if t.split(".")[0] in PACKAGES and (r := resolve(t)) and r != mod:
                    graph[mod].add(r)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_reports_a_function_level_cycle(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import engine.b\n")
    b.write_text("def f():\n    from engine.a import x\n")
    graph = import_graph({"engine.a": a, "engine.b": b})
    assert cycles(graph) == [["engine.a", "engine.b"]]
    b.write_text("def f():\n    from engine.c import x\n")
    assert cycles(import_graph({"engine.a": a, "engine.b": b})) == []


def test_engine_and_specviz_have_no_import_cycle():
    assert cycles(import_graph(module_files())) == []


def test_engine_never_imports_specviz_or_its_cli():
    graph = import_graph(module_files())
    bad = [(m, t) for m, ts in graph.items() for t in ts
           if m.startswith("engine") and (t.startswith("specviz") or (
               t.startswith("engine.cli") and not m.startswith(("engine.cli", "engine.__main__"))))]
    assert bad == []


# The lower floors of the engine and what each may import besides itself: the vocabulary
# (core) imports no other engine package, the contract and the kernels only the vocabulary,
# execution the kernels and the vocabulary.
FLOORS = {
    "engine.core": (),
    "engine.contract": ("engine.core",),
    "engine.kernels": ("engine.core",),
    "engine.execution": ("engine.core", "engine.kernels"),
}


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_the_lower_floors_import_only_the_floors_below_them():
    graph = import_graph(module_files())
    bad = [(m, t) for m, ts in graph.items() if package_of(m) in FLOORS for t in ts
           if package_of(t) != package_of(m) and package_of(t) not in FLOORS[package_of(m)]]
    assert bad == []


def architecture_names(text: str) -> set[str]:
    """The .py files ARCHITECTURE.md names, as written or, on a line that names a folder
    (`training/`), inside that folder."""
    names = set()
    for line in text.splitlines():
        folders = re.findall(r"`([\w/]+/)`", line)
        for name in re.findall(r"`([\w/]+\.py)`", line):
            inside = [f + name for f in folders if any((ROOT / pkg / f / name).exists()
                                                       for pkg in PACKAGES)]
            names.update(inside or [name])
    return names


def test_architecture_page_names_every_module_and_only_real_ones():
    named = architecture_names((ROOT / "docs" / "ARCHITECTURE.md").read_text())
    missing = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT / pkg).as_posix()
            if path.name == "__init__.py" and path.parent != ROOT / pkg:
                continue  # a subpackage is named by its folder
            if rel not in named and f"{pkg}/{rel}" not in named:
                missing.append(f"{pkg}/{rel}")
    assert missing == [], "modules ARCHITECTURE.md does not describe"
    dangling = [n for n in named if not any((ROOT / base / n).exists()
                                            for base in ("", "tests", *PACKAGES))]
    assert dangling == [], "ARCHITECTURE.md names files that do not exist"


def unnamed_modules(package: Path) -> list[str]:
    """The modules of a package (its .py files but __init__ and __main__) whose name its
    docstring does not hold as a word (``ngram`` names ngram.py, as do ``ngram.py`` and
    ``engine.drafters.ngram``; ``n-gram`` does not)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    return sorted(p.stem for p in package.glob("*.py")
                  if not p.stem.startswith("__")
                  and not re.search(rf"(?<![\w-]){re.escape(p.stem)}(?![\w-])", doc))


def packages() -> list[Path]:
    return sorted(p.parent for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py"))


def test_the_docstring_check_catches_a_module_its_package_does_not_name(tmp_path):
    (tmp_path / "__init__.py").write_text('"""The n-gram drafter (ngram_law.py) and cost."""')
    for name in ("ngram", "ngram_law", "cost", "cost_controller", "__main__"):
        (tmp_path / f"{name}.py").write_text("")
    assert unnamed_modules(tmp_path) == ["cost_controller", "ngram"]


def test_every_package_docstring_names_every_module_of_the_package():
    missing = {str(p.relative_to(ROOT)): unnamed_modules(p) for p in packages()}
    assert {k: v for k, v in missing.items() if v} == {}, "modules a package docstring omits"


HISTORY = [  # wording that tells how the project got here, not what it is
    r"\b[Ss]essions? \d+", r"\b[Ii]ssues? #?\d+", r"\bpreviously\b", r"\bformerly\b",
    r"\bused to (?:be|run|take|read)\b", r"\bbefore the (?:move|change|fix|rewrite)\b",
    r"\bno longer\b", r"\bwas (?:changed|fixed|replaced|removed|renamed) (?:to|in|by)\b",
]


def history_lines(paths: list[Path]) -> list[str]:
    pattern = re.compile("|".join(HISTORY))
    return [f"{p}:{i}: {line.strip()}" for p in paths
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]


@pytest.mark.parametrize("line", ["measured in session 9", "see issue 13",
                                  "this previously ran twice", "it no longer copies"])
def test_history_check_catches_history_wording(tmp_path, line):
    f = tmp_path / "x.md"
    f.write_text(f"a current fact\n{line}\nanother current fact (a session's state)\n")
    assert [x.split(":")[1] for x in history_lines([f])] == ["2"]


def test_readme_docs_and_code_carry_no_development_history():
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for pkg in PACKAGES:
        paths += sorted((ROOT / pkg).rglob("*.py"))
    assert history_lines(paths) == []


def test_readme_stays_an_entry_point():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 260
