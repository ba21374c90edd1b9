"""Check the package layout: room rules, import cycles and function size.

    python -m agentbatch.devtools.check_layout [PACKAGE_DIR ...]

Reads every module's source (no import runs) and reports, one line each:

- an import from one room into a room it may not use (``ROOMS`` below, the table of
  docs/architecture.md); imports inside functions and under ``TYPE_CHECKING`` count too;
- an import cycle between modules (any size; lazy imports inside functions count, imports under
  ``if TYPE_CHECKING:`` do not, since they never run);
- a function or method above cyclomatic complexity ``MAX_COMPLEXITY`` (radon) or longer than
  ``MAX_LINES`` lines. A function that is a table of data may be exempted by the comment
  ``# layout: table`` on its ``def`` line or on the line above;
- a ``# type: ignore`` without its error codes and a reason after them
  (``# type: ignore[code]  # why``): the type checker (``make typecheck``) is silenced only with both.

Exit 0 when clean, 1 when anything is reported, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radon.complexity import cc_visit_ast

MAX_COMPLEXITY = 15
MAX_LINES = 80
TABLE_MARKER = "# layout: table"
TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")

# Room -> the rooms it may import (besides itself, the stdlib and third-party packages).
# Bottom to top; keep in step with docs/architecture.md.
ROOMS: dict[str, frozenset[str]] = {  # layout: table
    "scheduling": frozenset(),
    "protocols": frozenset(),
    "traces": frozenset({"protocols"}),
    "planning": frozenset({"scheduling", "traces"}),
    "sim": frozenset({"scheduling", "planning", "traces", "protocols"}),
    "db": frozenset({"scheduling", "traces", "protocols"}),
    "environments": frozenset({"protocols", "traces", "db"}),
    "engines": frozenset({"scheduling", "protocols", "traces", "sim", "db", "environments"}),
    "tasks": frozenset({"scheduling", "protocols", "traces", "db", "engines", "environments"}),
    "gateway": frozenset({"scheduling", "protocols", "traces", "planning", "sim", "db", "environments",
                          "engines", "tasks"}),
    "dashboards": frozenset({"scheduling", "protocols", "traces", "db", "sim"}),
    "flows": frozenset({"scheduling", "protocols", "traces", "planning", "sim", "db", "environments",
                        "engines", "tasks", "gateway", "dashboards", "devtools"}),
    "devtools": frozenset(),
    # The Python API (agentbatch/api.py: run/resume) sits on top of everything; the package root
    # may import only it, lazily, for `agentbatch.run(...)`.
    "api": frozenset({"scheduling", "protocols", "traces", "planning", "sim", "db", "environments",
                      "engines", "tasks", "gateway", "dashboards", "flows"}),
    "": frozenset({"api"}),
}
# The package's own ``__init__``/``__main__`` modules sit in no room and may import nothing of it.
ROOT_ROOM = ""


@dataclass(frozen=True)
class Violation:
    kind: str  # "room" | "cycle" | "complexity" | "length" | "ignore"
    where: str  # path:line
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.kind}: {self.message}"


@dataclass(frozen=True)
class ImportEdge:
    source: str  # importing module, dotted
    target: str  # imported module, dotted (the deepest module the statement names)
    line: int
    runs: bool  # False under ``if TYPE_CHECKING:`` (never executed)


@dataclass
class Module:
    name: str  # dotted, e.g. agentbatch.sim.model
    path: Path
    tree: ast.Module
    is_package: bool
    edges: list[ImportEdge] = field(default_factory=list)


# --- reading the tree -------------------------------------------------------------------------


def load_package(package_dir: Path) -> dict[str, Module]:
    """Every module under ``package_dir`` (a directory with ``__init__.py``), parsed."""
    root = package_dir.name
    modules: dict[str, Module] = {}
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).with_suffix("")
        parts = [root, *rel.parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join(parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        modules[name] = Module(name, path, tree, is_package)
    for module in modules.values():
        module.edges = list(_import_edges(module, modules))
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk_imports(node: ast.AST, runs: bool = True) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement below ``node`` (functions included), with whether it ever runs."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, runs
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _walk_imports(ast.Module(body=[stmt], type_ignores=[]), False)
            for stmt in child.orelse:
                yield from _walk_imports(ast.Module(body=[stmt], type_ignores=[]), runs)
        else:
            yield from _walk_imports(child, runs)


def _resolve_from(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _deepest_known(name: str, modules: dict[str, Module]) -> str | None:
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _import_edges(module: Module, modules: dict[str, Module]) -> Iterator[ImportEdge]:
    for node, runs in _walk_imports(module.tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _resolve_from(module, node)
            # ``from pkg import sub`` imports the module pkg.sub when there is one.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        for target in dict.fromkeys(targets):
            known = _deepest_known(target, modules)
            if known is not None and known != module.name:
                yield ImportEdge(module.name, known, node.lineno, runs)


# --- the three checks -------------------------------------------------------------------------


def room_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] != "__main__" else ROOT_ROOM


def check_rooms(modules: dict[str, Module], rooms: dict[str, frozenset[str]] = ROOMS) -> list[Violation]:
    out: list[Violation] = []
    for module in modules.values():
        source = room_of(module.name)
        if source != ROOT_ROOM and source not in rooms:
            out.append(Violation("room", f"{module.path}:1", f"{module.name} is in no room (folder "
                                 f"{source!r} is not in the room table)"))
            continue
        allowed = rooms.get(source, frozenset())
        for edge in module.edges:
            target = room_of(edge.target)
            if target == source or target in allowed:
                continue
            if source == ROOT_ROOM:
                why = "the package root may import no room"
            else:
                why = f"{source}/ may import only {sorted(allowed) or 'no other room'}"
            out.append(Violation("room", f"{module.path}:{edge.line}",
                                 f"{module.name} imports {edge.target} ({target or 'root'}/): {why}"))
    return out


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (deep import chains must not hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def _cycle_path(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One concrete cycle through the component's first module, for the message."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if child not in parents:
                    parents[child] = node
                    nxt.append(child)
        frontier = nxt
    return component


def check_cycles(modules: dict[str, Module]) -> list[Violation]:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module in modules.values():
        graph[module.name].update(edge.target for edge in module.edges if edge.runs)
    out = []
    for component in _strongly_connected(graph):
        if len(component) < 2:
            continue
        path = _cycle_path(component, graph)
        first = modules[path[0]]
        line = next((e.line for e in first.edges if e.runs and e.target == path[1]), 1)
        out.append(Violation("cycle", f"{first.path}:{line}", " -> ".join(path)
                             + (f" (cycle of {len(component)} modules)" if len(component) > len(path) - 1 else "")))
    return out


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _radon_blocks(tree: ast.Module) -> Iterator[Any]:  # radon's Function and Class blocks
    for block in cc_visit_ast(tree):
        todo = [block]
        while todo:
            current = todo.pop()
            yield current
            todo.extend(getattr(current, "closures", ()))


def check_size(path: Path, tree: ast.Module, display: str | None = None,
               max_complexity: int = MAX_COMPLEXITY, max_lines: int = MAX_LINES) -> list[Violation]:
    lines = path.read_text(encoding="utf-8").splitlines()
    shown = display or str(path)

    def exempt(lineno: int) -> bool:
        return any(TABLE_MARKER in lines[i - 1] for i in (lineno - 1, lineno) if 0 < i <= len(lines))

    out: list[Violation] = []
    for node in _functions(tree):
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > max_lines and not exempt(node.lineno):
            out.append(Violation("length", f"{shown}:{node.lineno}",
                                 f"{node.name} has {length} lines (limit {max_lines})"))
    for block in _radon_blocks(tree):
        if getattr(block, "methods", None) is not None:  # a class: its methods are listed on their own
            continue
        if block.complexity > max_complexity and not exempt(block.lineno):
            name = f"{block.classname}.{block.name}" if getattr(block, "classname", None) else block.name
            out.append(Violation("complexity", f"{shown}:{block.lineno}",
                                 f"{name} has cyclomatic complexity {block.complexity} (limit {max_complexity})"))
    return out


# --- entry point ------------------------------------------------------------------------------


def check_ignores(path: Path, display: str | None = None) -> list[Violation]:
    """Every `# type: ignore` names its error codes and gives a reason in a comment after them."""
    out: list[Violation] = []
    source = io.StringIO(path.read_text(encoding="utf-8"))
    for tok in tokenize.generate_tokens(source.readline):
        m = TYPE_IGNORE.search(tok.string) if tok.type == tokenize.COMMENT else None
        if m and not (m["codes"] and m["rest"].strip().lstrip("#").strip()):
            out.append(Violation("ignore", f"{display or path}:{tok.start[0]}",
                                 "a type: ignore needs its error codes and a reason: "
                                 "'# type: ignore[code]  # why'"))
    return out


def check_package(package_dir: Path, rooms: dict[str, frozenset[str]] = ROOMS) -> list[Violation]:
    modules = load_package(package_dir)
    violations = check_rooms(modules, rooms) + check_cycles(modules)
    for module in modules.values():
        violations += check_size(module.path, module.tree) + check_ignores(module.path)
    return sorted(violations, key=lambda v: (v.kind, v.where))


def check_files(paths: Iterable[Path]) -> list[Violation]:
    """Size checks only, for scripts and benchmarks outside the package."""
    out: list[Violation] = []
    for path in paths:
        out += check_size(path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentbatch.devtools.check_layout",
                                     description=__doc__.split("\n\n")[0])
    default = Path(__file__).resolve().parents[1]
    parser.add_argument("packages", nargs="*", type=Path, default=[default],
                        help=f"package directories to check (default: {default})")
    parser.add_argument("--size-only", nargs="*", type=Path, default=[], metavar="FILE_OR_DIR",
                        help="also check function size in these files or folders (e.g. bench scripts)")
    args = parser.parse_args(argv)
    for package in args.packages:
        if not (package / "__init__.py").is_file():
            parser.error(f"{package}: not a package directory (no __init__.py)")
    violations: list[Violation] = []
    for package in args.packages:
        violations += check_package(package)
    extra = [p for given in args.size_only for p in (sorted(given.rglob("*.py")) if given.is_dir() else [given])]
    violations += check_files(extra)
    for violation in violations:
        print(violation)
    counts = {kind: sum(v.kind == kind for v in violations) for kind in ("room", "cycle", "complexity", "length", "ignore")}
    print(f"check_layout: {len(violations)} violation(s) " + ", ".join(f"{k} {n}" for k, n in counts.items()),
          file=sys.stderr)
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
