"""Bad input, table-driven: every malformed config, argument or store URL is refused before anything
is written or any flow starts — exit code 2, the file and the field (or argument) named, no
traceback, and the store file byte-identical (no other file appears next to it)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentbatch.db.store import Store
from agentbatch.flows.cli import main as cli

GOOD = {"name": "ok", "workload": {"kind": "bfcl", "params": {"limit": 2}}}


@dataclass(frozen=True)
class Case:
    id: str
    expect: str  # what stderr must name: the dotted field or the argument
    config: object = None  # a dict (dumped as JSON into .yaml), str or bytes: the config file's content
    argv: tuple[str, ...] = ("run", "{cfg}", "--db", "{db}")
    suffix: str = ".yaml"


def cfg(**overrides: object) -> dict:
    """GOOD with dotted-path overrides, e.g. cfg(**{"workload.params.limit": True})."""
    data = json.loads(json.dumps(GOOD))
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return data


TASKS = Path(__file__).resolve().parent / "mcp_tasks"  # JSONL task files, good and broken
KV_SERVER = Path(__file__).resolve().parents[1] / "plugins" / "kv_server.py"  # a third party's MCP server


def mcp(**overrides: object) -> dict:
    """A good mcp workload on a real MCP server (its tools: kv_set, kv_get, debug_dump; each takes
    state_key) with params overridden."""
    params = {"servers": [{"name": "kv", "command": sys.executable, "args": [str(KV_SERVER)]}],
              "task_file": {"path": str(TASKS / "good.jsonl"), "fields": {"id": "task_id", "turns": "asks",
                                                                           "system": "system_prompt"}},
              "inject": {"state_key": "{sample_key}"}, "tools_hide": ["debug_*"], "state_tool": "debug_dump"}
    return {"name": "mcp", "workload": {"kind": "mcp", "params": {**params, **overrides}}}


INF = float("inf")
CASES = [
    # --- the file itself
    Case("empty", "empty", ""),
    Case("comment-only", "empty", "# nothing here\n   \n# still nothing\n"),
    Case("binary-garbage", "not a UTF-8 text file", bytes(range(256)) * 4),
    Case("nul-bytes", "not a UTF-8 text file", b"name: x\x00\n"),
    Case("top-level-list", "top level must be a mapping", "- a\n- b\n"),
    Case("top-level-scalar", "top level must be a mapping", "42\n"),
    Case("yaml-syntax", "cannot parse", "name: [unclosed\n"),
    Case("toml-syntax", "cannot parse", "name = \n", suffix=".toml"),
    Case("unknown-suffix", "unknown config format", "name: x\n", suffix=".txt"),
    Case("missing-file", "no such file", argv=("run", "{tmp}/nope.yaml", "--db", "{db}")),
    Case("yaml-python-tag", "cannot parse", "name: !!python/object/apply:os.system ['true']\n"),
    Case("yaml-duplicate-key", "duplicate key 'limit'",
         "name: x\nworkload:\n  kind: bfcl\n  params:\n    limit: 2\n    limit: 50\n"),
    Case("unknown-top-key", "nmae", cfg(nmae="x")),
    # --- top-level fields
    Case("name-too-long", "name", cfg(name="n" * 201)),
    Case("name-empty", "name", cfg(name="")),
    Case("name-control-chars", "name", cfg(name="a\x1b[31mb")),
    Case("name-not-string", "name", cfg(name=12)),
    Case("active-true", "scheduling.max_active_samples", cfg(**{"scheduling.max_active_samples": True})),
    Case("env-slots-zero", "scheduling.env_slots", cfg(**{"scheduling.env_slots": 0})),
    Case("env-slots-negative", "scheduling.env_slots", cfg(**{"scheduling.env_slots": -3})),
    Case("inflight-string", "scheduling.per_worker_inflight", cfg(**{"scheduling.per_worker_inflight": "16"})),
    Case("active-huge", "scheduling.max_active_samples", cfg(**{"scheduling.max_active_samples": 10**12})),
    Case("coupled-string", "scheduling.coupled", cfg(**{"scheduling.coupled": "yes"})),
    Case("admission-order", "scheduling.admission_order", cfg(**{"scheduling.admission_order": "random"})),
    Case("timeout-inf", "limits.step_timeout_s", "name: x\nlimits: {step_timeout_s: .inf}\n"),
    Case("timeout-nan", "limits.step_timeout_s", "name: x\nlimits: {step_timeout_s: .nan}\n"),
    Case("timeout-zero", "limits.step_timeout_s", cfg(**{"limits.step_timeout_s": 0})),
    Case("max-steps-one", "limits.max_steps", cfg(**{"limits.max_steps": 1})),
    Case("retries-huge", "retries.environment", cfg(**{"retries.environment": 10**30})),
    Case("retries-negative", "retries.inference", cfg(**{"retries.inference": -1})),
    Case("backoff-negative", "retries.backoff_s", cfg(**{"retries.backoff_s": -0.5})),
    Case("mode-unknown", "execution.mode", cfg(**{"execution.mode": "fast"})),
    Case("priors-not-numbers", "scheduling.priors.t1", cfg(**{"scheduling.priors": {"t1": "long"}})),
    # --- the workload
    Case("workload-unknown", "workload.kind", cfg(**{"workload.kind": "nope"})),
    Case("workload-no-module", "workload.kind", cfg(**{"workload.kind": "no_such_pkg.mod:Thing"})),
    Case("workload-no-object", "workload.kind", cfg(**{"workload.kind": "agentbatch.environments.bfcl:Nope"})),
    Case("workload-kind-too-long", "workload.kind", cfg(**{"workload.kind": "k" * 201})),
    Case("workload-param-unknown", "workload.params.limt", cfg(**{"workload.params": {"limt": 3}})),
    Case("workload-param-true", "workload.params.limit", cfg(**{"workload.params.limit": True})),
    Case("workload-param-zero", "workload.params.limit", cfg(**{"workload.params.limit": 0})),
    Case("workload-category", "workload.params.categories.0", cfg(**{"workload.params.categories": ["bogus"]})),
    Case("workload-params-list", "workload.params", cfg(**{"workload.params": [1, 2]})),
    Case("bash-repeats-zero", "workload.params.repeats",
         cfg(**{"workload": {"kind": "bash_tasks", "params": {"repeats": 0}}})),
    Case("workload-tasks-unknown", "workload.params: unknown BFCL task id", cfg(**{"workload.params": {"task_ids": ["multi_turn_base_99999"]}})),
    Case("task-id-too-long", "workload.params: task id", cfg(workload={"kind": "mcp", "params": {
        "servers": [{"name": "s", "command": "true"}], "tasks": [{"id": "t" * 201, "turns": ["hi"]}]}})),
    Case("task-group-too-long", "workload.params: group", cfg(workload={"kind": "mcp", "params": {
        "servers": [{"name": "s", "command": "true"}], "tasks": [{"id": "t", "group": "g" * 201, "turns": ["hi"]}]}})),
    # --- the mcp workload: checked against its files and its servers' tools before anything is written
    Case("mcp-server-missing", "workload.params: servers: cannot start or reach kv",
         mcp(servers=[{"name": "kv", "command": "/nonexistent/mcp-server"}])),
    Case("mcp-server-exits", "workload.params: servers: cannot start or reach kv",
         mcp(servers=[{"name": "kv", "command": sys.executable, "args": ["-c", "pass"]}])),
    Case("mcp-allow-matches-nothing", "tools_allow: 'serch*' matches no tool", mcp(tools_allow=["serch*"])),
    Case("mcp-hide-matches-nothing", "tools_hide: 'dbg_*' matches no tool", mcp(tools_hide=["dbg_*"])),
    Case("mcp-no-tool-left", "the model would see none", mcp(tools_allow=["debug_*"])),
    Case("mcp-state-tool-unknown", "state_tool: no tool 'dump_state'", mcp(state_tool="dump_state")),
    Case("mcp-reconcile-tool-unknown", "reconcile_tool: no tool 'did_it_run'", mcp(reconcile_tool="did_it_run")),
    Case("mcp-field-mapping-typo", "task_file.fields.system: no record", mcp(task_file={
        "path": str(TASKS / "good.jsonl"), "fields": {"id": "task_id", "turns": "asks", "system": "sytem_prompt"}})),
    Case("mcp-inject-template-typo", "inject.state_key: cannot fill '{sampel_key}'",
         mcp(inject={"state_key": "{sampel_key}"})),
    Case("mcp-inject-unknown-argument", "inject.stat_key: no tool", mcp(inject={"stat_key": "{sample_key}"})),
    Case("mcp-category-without-preset", "category: a BFCL category", mcp(category="multi_turn_base")),
    Case("mcp-ids-unknown", "ids: no task ['kv-9']", mcp(ids=["kv-9"])),
    Case("mcp-limit-zero", "limit: expected at least 1", mcp(limit=0)),
    Case("mcp-jsonl-malformed", "malformed.jsonl line 3: not JSON", mcp(task_file={
        "path": str(TASKS / "malformed.jsonl"), "fields": {"id": "task_id", "turns": "asks"}})),
    Case("mcp-jsonl-record-without-id", "no_id.jsonl line 2: no 'task_id'", mcp(task_file={
        "path": str(TASKS / "no_id.jsonl"), "fields": {"id": "task_id", "turns": "asks"}})),
    # --- the engine
    Case("engine-unknown", "engine.kind", cfg(**{"engine.kind": "gpt"})),
    Case("engine-workers-zero", "engine.params.workers", cfg(**{"engine.params": {"workers": 0}})),
    Case("engine-workers-negative", "engine.params.workers", cfg(**{"engine.params": {"workers": -2}})),
    Case("engine-workers-float", "engine.params.workers", cfg(**{"engine.params": {"workers": 1.5}})),
    Case("engine-param-unknown", "engine.params.wokers", cfg(**{"engine.params": {"wokers": 2}})),
    Case("engine-profile-unknown", "engine.params.timing",
         cfg(**{"engine.params": {"timing": {"kind": "simulated", "profile": "gpt-9-on-a-toaster"}}})),
    Case("engine-timing-kind", "engine.params.timing", cfg(**{"engine.params": {"timing": {"kind": "bogus"}}})),
    Case("engine-timing-field", "engine.params.timing", cfg(**{"engine.params": {"timing": {"kind": "token", "speed": 2}}})),
    Case("engine-timing-inf", "engine.params.timing", "name: x\nengine: {params: {timing: {kind: token, scale: .inf}}}\n"),
    Case("endpoint-no-model", "engine.params.endpoints.0.model",
         cfg(engine={"kind": "openai", "params": {"endpoints": [{"base_url": "http://127.0.0.1:9/v1"}]}})),
    Case("endpoints-empty", "engine.params.endpoints", cfg(engine={"kind": "openai", "params": {"endpoints": []}})),
    Case("endpoint-bad-url", "engine.params.endpoints.0.base_url",
         cfg(engine={"kind": "openai", "params": {"endpoints": [{"base_url": "gpu0:8000", "model": "m"}]}})),
    Case("endpoints-file-missing", "engine.params.endpoints",
         cfg(engine={"kind": "openai", "params": {"endpoints": "/nonexistent/endpoints.yaml"}})),
    Case("openai-no-endpoints", "engine.params.endpoints", cfg(engine={"kind": "openai", "params": {}})),
    Case("replay-needs-recorded", "engine.kind", cfg(engine={"kind": "replay"})),
    # --- the policies
    Case("queue-unknown", "scheduling.env_queue.name", cfg(**{"scheduling.env_queue": {"name": "lifo"}})),
    Case("router-wrong-role", "scheduling.router.name", cfg(**{"scheduling.router": {"name": "fifo"}})),
    Case("queue-param-unknown", "scheduling.env_queue.params.max_wait",
         cfg(**{"scheduling.env_queue": {"name": "caas", "params": {"max_wait": 5}}})),
    Case("priority-param-true", "scheduling.priority.params.ceiling",
         cfg(**{"scheduling.priority": {"name": "chain_progress", "params": {"ceiling": True}}})),
    Case("router-param-inf", "scheduling.router.params.balance_rel",
         "name: x\nscheduling: {router: {name: trajectory_aware, params: {balance_rel: .inf}}}\n"),
    Case("policy-not-mapping", "scheduling.inference_queue", cfg(**{"scheduling.inference_queue": "fifo"})),
    Case("policy-module-object", "scheduling.env_queue.name",
         cfg(**{"scheduling.env_queue": {"name": "agentbatch.scheduling.policies:RoundRobinRouter"}})),
    # --- arguments and store URLs
    Case("db-unknown-dialect", "--db", GOOD, argv=("run", "{cfg}", "--db", "oracle://u@h/db")),
    Case("db-malformed", "--db", GOOD, argv=("run", "{cfg}", "--db", "not a url at all")),
    Case("db-folder-missing", "--db", GOOD, argv=("run", "{cfg}", "--db", "sqlite:///{tmp}/no/such/dir/s.db")),
    Case("db-unreachable", "--db", GOOD,
         argv=("run", "{cfg}", "--db", "postgresql+psycopg://u:planted-pw@127.0.0.1:1/db")),
    Case("report-dir-is-file", "--report", GOOD, argv=("run", "{cfg}", "--db", "{db}", "--report", "{cfg}")),
    Case("status-missing-store", "no store", argv=("status", "1", "--db", "sqlite:///{tmp}/missing.sqlite")),
    Case("report-missing-store", "no store", argv=("report", "1", "--db", "sqlite:///{tmp}/missing.sqlite")),
    Case("resume-missing-store", "--db", argv=("resume", "1", "--db", "sqlite:///{tmp}/missing.sqlite")),
    Case("status-bad-dialect", "--db", argv=("status", "1", "--db", "mysql://u@h/db")),
    Case("resume-unknown-batch", "no batch 999", argv=("resume", "999", "--db", "{db}")),
    Case("status-unknown-batch", "999", argv=("status", "999", "--db", "{db}")),
    Case("report-unknown-batch", "999", argv=("report", "999", "--db", "{db}", "--out", "{tmp}/r")),
    Case("report-out-is-file", "--out", argv=("report", "1", "--db", "{db}", "--out", "{db_path}")),
    Case("report-out-under-file", "--out", argv=("report", "1", "--db", "{db}", "--out", "{db_path}/sub")),
    # a folder no one may create in, root included (sysfs)
    Case("report-out-unwritable", "--out", argv=("report", "1", "--db", "{db}", "--out", "/sys/agentbatch-report")),
    Case("resume-plugin-gone", "workload.kind", argv=("resume", "2", "--db", "{db}")),
    Case("batch-id-not-int", "batch_id", argv=("status", "one", "--db", "{db}")),
]


def _digest(folder: Path) -> dict[str, str]:
    """Every file's bytes: the store, and no `-wal` or `-shm` beside it after a read-only command."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding batch 1 (valid) and batch 2 (its workload plugin no longer importable)."""
    folder = tmp_path_factory.mktemp("store")
    store = Store(f"sqlite:///{folder / 'store.sqlite'}")
    store.create_batch("ok", GOOD, [("multi_turn_base_0", {})])
    store.create_batch("gone", cfg(**{"workload.kind": "plugin_that_was_uninstalled:Workload"}), [("t", {})])
    store.close()
    for extra in folder.glob("store.sqlite-*"):  # WAL files are checkpointed on close
        assert extra.stat().st_size == 0 or not extra.exists()
    return folder / "store.sqlite"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_naming_the_field_and_leaves_the_store_untouched(
    case: Case, seeded: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db_folder = tmp_path / "db"
    db_folder.mkdir()
    db_path = db_folder / "store.sqlite"
    db_path.write_bytes(seeded.read_bytes())
    cfg_path = tmp_path / f"config{case.suffix}"
    if case.config is not None:
        content = case.config if isinstance(case.config, str | bytes) else json.dumps(case.config)
        cfg_path.write_bytes(content.encode() if isinstance(content, str) else content)
    before_db, before_tmp = _digest(db_folder), sorted(p.name for p in tmp_path.iterdir())
    subs = {"{cfg}": str(cfg_path), "{db}": f"sqlite:///{db_path}", "{db_path}": str(db_path), "{tmp}": str(tmp_path)}
    argv = []
    for arg in case.argv:
        for key, value in subs.items():
            arg = arg.replace(key, value)
        argv.append(arg)

    try:
        rc = cli(argv)
    except SystemExit as exc:  # argparse's own usage errors
        rc = exc.code
    err = capfd.readouterr().err  # fd level: MCP servers started by the checks need a real stderr

    assert rc == 2, err
    assert case.expect in err, err
    assert "Traceback" not in err
    if case.config is not None and "{cfg}" in case.argv:
        assert cfg_path.name in err or case.id.startswith(("db-", "report-")), err
    assert "planted-pw" not in err
    assert _digest(db_folder) == before_db  # byte-identical, and no -wal/-journal or other file appeared
    assert sorted(p.name for p in tmp_path.iterdir()) == before_tmp  # no missing.sqlite, no report folder


def test_the_table_has_at_least_fifty_cases() -> None:
    assert len(CASES) >= 50
    assert len({c.id for c in CASES}) == len(CASES)


def test_a_good_config_passes_the_same_checks(tmp_path: Path) -> None:
    from agentbatch.flows.config import load_config

    path = tmp_path / "good.yaml"
    path.write_text(json.dumps(GOOD))
    config = load_config(path)
    assert config.workload.params == {"limit": 2}
    assert os.path.getsize(path) > 0
