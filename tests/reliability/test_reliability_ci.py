"""Finding 8: CI does not hide failures.

- AGENTBATCH_TEST_PG_URL set but the server down: the PostgreSQL fixtures fail (they skipped).
- Under CI=true a skipped test (in a test, a fixture or a whole module) is reported as a failure.
- Under CI=true `.ci/run` fails, with the service's log, when a service setup fails (it went on).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

SKIPPING = '''
import pytest

def test_skips_inside():
    pytest.skip("no Docker engine (simulated)")

@pytest.fixture
def service():
    pytest.skip("service missing (simulated)")

def test_skips_in_fixture(service):
    pass
'''
MODULE_SKIP = '''
import pytest
pytest.skip("no vLLM (simulated)", allow_module_level=True)

def test_never_runs():
    pass
'''
GROUPED = '''
import os
import pytest

pytestmark = pytest.mark.xdist_group("one")

@pytest.fixture(scope="module")
def expensive(tmp_path_factory):
    with open(os.environ["SETUPS_FILE"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    return 1
''' + "".join(f"\ndef test_{i}(expensive):\n    assert expensive\n" for i in range(6))
NEEDS_PG = '''
def test_uses_pg(pg_url):
    assert pg_url
'''


def run_pytest(tmp_path: Path, files: dict[str, str], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    full_env = {k: v for k, v in os.environ.items() if k not in ("CI", "AGENTBATCH_TEST_PG_URL")}
    full_env.update(PYTHONPATH=str(TESTS), **env)
    # -p conftest: the project's tests/conftest.py, as a plugin, for test files outside tests/
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), *args, *files], cwd=tmp_path, env=full_env,
                          capture_output=True, text=True, timeout=300)


def test_pg_fixture_fails_when_the_configured_server_is_down(tmp_path: Path) -> None:
    down = run_pytest(tmp_path, {"test_pg.py": NEEDS_PG},
                      AGENTBATCH_TEST_PG_URL="postgresql+psycopg://nobody:x@127.0.0.1:9/none")
    assert down.returncode == 1 and "1 error" in down.stdout and "unreachable" in down.stdout, down.stdout
    unset = run_pytest(tmp_path, {"test_pg.py": NEEDS_PG})
    assert unset.returncode == 0 and "1 skipped" in unset.stdout, unset.stdout  # not configured: a skip


def test_skips_fail_under_ci(tmp_path: Path) -> None:
    files = {"test_skipping.py": SKIPPING}
    local = run_pytest(tmp_path, files)
    assert local.returncode == 0 and "2 skipped" in local.stdout, local.stdout
    ci = run_pytest(tmp_path, files, CI="true")
    assert ci.returncode == 1 and "1 failed, 1 error" in ci.stdout, ci.stdout  # fixture skips: setup errors
    assert "skipped under CI=true" in ci.stdout
    assert "no Docker engine (simulated)" in ci.stdout and "service missing (simulated)" in ci.stdout


def test_module_skip_fails_under_ci(tmp_path: Path) -> None:
    files = {"test_module_skip.py": MODULE_SKIP}
    assert run_pytest(tmp_path, files).returncode == 5  # nothing ran: skipped module, no failure
    ci = run_pytest(tmp_path, files, CI="true")
    assert ci.returncode != 0 and "skipped under CI=true" in ci.stdout and "no vLLM (simulated)" in ci.stdout, \
        ci.stdout


def test_skips_fail_under_ci_in_parallel_workers(tmp_path: Path) -> None:
    """`make test` runs pytest-xdist workers: the rule holds in them (tests, fixtures, modules)."""
    ci = run_pytest(tmp_path, {"test_skipping.py": SKIPPING, "test_module_skip.py": MODULE_SKIP}, "-n", "2",
                    CI="true")
    assert ci.returncode == 1 and "1 failed, 2 errors" in ci.stdout, ci.stdout
    for reason in ("no Docker engine (simulated)", "service missing (simulated)", "no vLLM (simulated)"):
        assert f"skipped under CI=true, which runs every test: Skipped: {reason}" in ci.stdout, ci.stdout


def test_xdist_group_keeps_a_module_fixture_on_one_worker(tmp_path: Path) -> None:
    """`make test` relies on `--dist loadgroup`: a group's tests share one worker, so an expensive module
    fixture (vLLM workers, a Docker image) starts once. A pytest / pytest-xdist pair that ignores the
    marks spreads the tests over every worker and starts the fixture on each."""
    setups = tmp_path / "setups.txt"
    ungrouped = {f"test_other{i}.py": "def test_x():\n    pass\n" for i in range(4)}
    done = run_pytest(tmp_path, {"test_grouped.py": GROUPED, **ungrouped}, "-n", "3", "--dist", "loadgroup",
                      SETUPS_FILE=str(setups))
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(setups.read_text().split()) == 1, setups.read_text()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("pg_ctlcluster") is None,
                    reason=".ci/run needs root and Debian's PostgreSQL (as in CI)")
def test_ci_run_fails_with_the_log_of_a_service_that_cannot_start(tmp_path: Path) -> None:
    (tmp_path / "setup_broken.sh").write_text("echo 'dockerd: failed to start: permission denied (simulated)'\nexit 1\n")
    env = {**os.environ, "AGENTBATCH_CI_PARTS": "broken", "AGENTBATCH_CI_SETUP_DIR": str(tmp_path),
           "AGENTBATCH_CI_SKIP_TESTS": "1"}
    ci = subprocess.run(["bash", str(REPO / ".ci" / "run")], env={**env, "CI": "true"}, capture_output=True,
                        text=True, timeout=300)
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "setup_broken failed" in ci.stdout and "permission denied (simulated)" in ci.stdout
    unset = subprocess.run(["bash", str(REPO / ".ci" / "run")], env={k: v for k, v in env.items() if k != "CI"},
                           capture_output=True, text=True, timeout=300)
    assert unset.returncode == 1 and "setup_broken failed" in unset.stdout, unset.stdout + unset.stderr  # strict
    local = subprocess.run(["bash", str(REPO / ".ci" / "run")], env={**env, "CI": "false"},
                           capture_output=True, text=True, timeout=300)
    assert local.returncode == 0 and "will be skipped" in local.stdout, local.stdout + local.stderr
