"""The layout checker: it passes on the package and catches each kind of violation on small trees."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from agentbatch.devtools import check_layout

PACKAGE = Path(check_layout.__file__).resolve().parents[1]


def _tree(root: Path, files: dict[str, str]) -> Path:
    """A package ``agentbatch`` under ``root`` with the given files (paths relative to it)."""
    pkg = root / "agentbatch"
    for rel, text in {"__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        init = path.parent / "__init__.py"
        if not init.exists():
            init.write_text("")
    return pkg


def _run(pkg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbatch.devtools.check_layout", str(pkg)],
                          capture_output=True, text=True, timeout=120)


def test_package_passes() -> None:
    violations = check_layout.check_package(PACKAGE)
    report = "\n".join(str(v) for v in violations)
    assert not violations, f"check_layout found {len(violations)} violation(s) in the package:\n{report}"


def test_benchmarks_and_scripts_within_size_limits() -> None:
    repo = PACKAGE.parent
    files = [p for folder in ("bench", "scripts") for p in sorted((repo / folder).rglob("*.py"))]
    assert files, "bench/ and scripts/ hold the benchmarks and scripts"
    violations = check_layout.check_files(files)
    report = "\n".join(str(v) for v in violations)
    assert not violations, f"{len(violations)} function(s) over the limits in bench/ or scripts/:\n{report}"


def test_cli_exit_zero_on_clean_tree(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "scheduling/types.py": "X = 1\n",
        "sim/model.py": "from agentbatch.scheduling.types import X\n\ndef f():\n    from ..scheduling import types\n    return types, X\n",
    })
    proc = _run(pkg)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_upward_import_fails(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "flows/cli.py": "X = 1\n",
        # lazy, relative, inside a function: still an upward import
        "scheduling/policy.py": "def pick():\n    from ..flows import cli\n    return cli.X\n",
    })
    proc = _run(pkg)
    assert proc.returncode == 1
    lines = [line for line in proc.stdout.splitlines() if ": room: " in line]
    assert len(lines) == 1, proc.stdout
    assert "scheduling/policy.py:2" in lines[0] and "agentbatch.flows.cli" in lines[0]


def test_unknown_room_and_root_import_fail(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {"misc/helpers.py": "X = 1\n"})
    (pkg / "__init__.py").write_text("from agentbatch.misc.helpers import X\n")
    violations = check_layout.check_package(pkg)
    messages = [v.message for v in violations if v.kind == "room"]
    assert any("is in no room" in m for m in messages), messages
    assert any("package root may import no room" in m for m in messages), messages


def test_cycle_fails_also_through_lazy_imports(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "sim/a.py": "from agentbatch.sim import b\n",
        "sim/b.py": "def later():\n    import agentbatch.sim.c\n",
        "sim/c.py": "from . import a\n",
        "sim/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agentbatch.sim import a\n",
    })
    proc = _run(pkg)
    assert proc.returncode == 1
    cycles = [line for line in proc.stdout.splitlines() if ": cycle: " in line]
    assert len(cycles) == 1, proc.stdout
    assert "agentbatch.sim.a -> agentbatch.sim.b -> agentbatch.sim.c -> agentbatch.sim.a" in cycles[0]
    assert "typed" not in proc.stdout  # imports under TYPE_CHECKING never run: no cycle through them


def test_complex_and_long_functions_fail(tmp_path: Path) -> None:
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(16))  # CC 17
    long_body = "".join(f"    y{i} = {i}\n" for i in range(80)) + "    return y0\n"  # 82 lines
    table = "# layout: table\ndef table():\n" + long_body
    pkg = _tree(tmp_path, {"scheduling/big.py": f"def branchy(x):\n{branches}    return -1\n\n\n"
                                                 f"class K:\n    def long(self):\n{textwrap.indent(long_body, '    ')}\n\n"
                                                 f"{table}"})
    proc = _run(pkg)
    assert proc.returncode == 1
    out = proc.stdout
    assert "complexity: branchy has cyclomatic complexity 17" in out, out
    assert "length: long has 82 lines" in out, out
    assert "table" not in out.replace("tables", "")  # the marked table is exempt
    assert len(out.splitlines()) == 2, out


def test_type_ignore_needs_codes_and_a_reason(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {"scheduling/ign.py": "a: int = 'x'  # type: ignore\n"
                                                "b: int = 'x'  # type: ignore[assignment]\n"
                                                "c: int = 'x'  # type: ignore[assignment]  # a test of the rule\n"
                                                "d = '# type: ignore in a string is no comment'\n"})
    proc = _run(pkg)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert [line.split(": ", 1)[0].rsplit(":", 1)[-1] for line in lines] == ["1", "2"], proc.stdout
    assert all("ignore: a type: ignore needs its error codes and a reason" in line for line in lines), proc.stdout


def test_limit_is_inclusive(tmp_path: Path) -> None:
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(14))  # CC 15
    pkg = _tree(tmp_path, {"scheduling/ok.py": f"def fine(x):\n{branches}    return -1\n"})
    assert check_layout.check_package(pkg) == []


def test_bad_argument_exit_2(tmp_path: Path) -> None:
    proc = _run(tmp_path)  # no __init__.py
    assert proc.returncode == 2
    assert "not a package directory" in proc.stderr
