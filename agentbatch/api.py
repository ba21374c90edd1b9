"""The Python API: run or resume a batch from a script, a notebook or another Prefect flow.

    import agentbatch
    result = agentbatch.run("examples/bfcl_demo.yaml", db="sqlite:///runs/demo.sqlite")
    result = agentbatch.run(workload=MyWorkload, workload_params={"n": 10}, engine="scripted")
    print(result.score_mean, result.group_scores, result.samples[0])
    agentbatch.resume(result.batch_id, db="sqlite:///runs/demo.sqlite")

`run` takes a config (a file, a mapping or a `BatchConfig`) and/or objects: a workload, engine or
policy given as a class or factory function becomes the kind "module:Object" (so `resume` in another
process finds it again: define it in an importable module). The config is validated whole before
anything is written (`ConfigError`). A run starts as `agentbatch run` starts it (`flows/launch.py`):
the same Prefect server (PREFECT_API_URL, else the local server; `AGENTBATCH_PREFECT_SERVER=ephemeral`
for Prefect's temporary one), the store URL's password never in a flow-run parameter, secrets hidden
in logs. Called inside a Prefect flow, the batch runs as a subflow on that flow's server. In async
code (a notebook's running event loop, an async flow) use `await arun(...)` / `await aresume(...)`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentbatch.flows.config import BatchConfig, ConfigError, load_config, validate_config

__all__ = ["BatchResult", "ConfigError", "SampleResult", "arun", "aresume", "build_config", "resume", "run"]


@dataclass(frozen=True, slots=True)
class SampleResult:
    index: int
    task_id: str
    group: str | None
    status: str  # completed | failed | pending | running
    score: float | None
    steps: int
    result: dict[str, Any] | None  # what the environment's score() returned
    error: str | None


@dataclass
class BatchResult:
    batch_id: int
    status: str
    db_url: str  # password hidden
    wall_s: float
    makespan_s: float | None
    lower_bound_s: float | None
    score_mean: float | None
    group_scores: dict[str, float | None] = field(default_factory=dict)
    samples: list[SampleResult] = field(default_factory=list)
    report_path: str | None = None

    @property
    def completed(self) -> int:
        return sum(s.status == "completed" for s in self.samples)

    @property
    def failed(self) -> int:
        return sum(s.status == "failed" for s in self.samples)


def as_kind(obj: Any) -> str:
    """A kind for the config: a string as it is; a class or function as "module:Qualname"."""
    if isinstance(obj, str):
        return obj
    if not (inspect.isclass(obj) or inspect.isfunction(obj)) or "<locals>" in obj.__qualname__:
        raise TypeError(f"expected a kind name, a module-level class or a function, got {obj!r}")
    return f"{obj.__module__}:{obj.__qualname__}"


def build_config(config: BatchConfig | Mapping[str, Any] | str | Path | None = None, *,
                 name: str | None = None, workload: Any = None, workload_params: Mapping[str, Any] | None = None,
                 engine: Any = None, engine_params: Mapping[str, Any] | None = None,
                 **sections: Any) -> BatchConfig:
    """A validated config from a file, a mapping or a BatchConfig, with objects and sections
    (`scheduling={...}`, `limits={...}` ...) laid over it. Raises ConfigError."""
    if isinstance(config, str | Path):
        data = load_config(config).model_dump(mode="json")
    elif isinstance(config, BatchConfig):
        data = config.model_dump(mode="json")
    else:
        data = dict(config or {})
    if name is not None:
        data["name"] = name
    for key, kind, params in (("workload", workload, workload_params), ("engine", engine, engine_params)):
        part = dict(data.get(key) or {})
        if kind is not None:
            part["kind"] = as_kind(kind)
        if params is not None:
            part["params"] = dict(params)
        if part:
            data[key] = part
    for key, value in sections.items():
        data[key] = {**dict(data.get(key) or {}), **_policies_as_kinds(value)}
    return validate_config(data, source="agentbatch.run config")


def _policies_as_kinds(section: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(section)
    for key, value in section.items():  # scheduling={"router": MyRouter} or {"router": {"name": MyRouter}}
        if inspect.isclass(value):
            out[key] = {"name": as_kind(value)}
        elif isinstance(value, Mapping) and inspect.isclass(value.get("name")):
            out[key] = {**value, "name": as_kind(value["name"])}
    return out


def _store(db: str | None) -> Any:
    from agentbatch.db.engine import resolve_url
    from agentbatch.db.store import Store
    from agentbatch.flows.store_url import db_url_error

    url = resolve_url(db)
    if error := db_url_error(url, arg="db"):
        raise ValueError(error)
    return Store(url)


def _result(store: Any, batch_id: int, wall_s: float, report_path: str | None) -> BatchResult:
    from agentbatch.dashboards.summary import summarize
    from agentbatch.flows.store_url import shown_url

    summary = summarize(store, batch_id)
    samples = [SampleResult(s.index, s.task_id, s.task_group, s.status, s.score, s.steps_done, s.result, s.error)
               for s in store.samples(batch_id)]
    lb = summary.lower_bound
    return BatchResult(
        batch_id=batch_id, status=summary.status, db_url=shown_url(store.url), wall_s=wall_s,
        makespan_s=summary.makespan_s, lower_bound_s=lb.value if lb else None, score_mean=summary.score_mean,
        group_scores={g: s.mean for g, s in summary.group_scores.items()}, samples=samples, report_path=report_path,
    )


async def arun(config: BatchConfig | Mapping[str, Any] | str | Path | None = None, *, db: str | None = None,
               report_dir: str | Path | None = None, show_progress: bool = False, **overrides: Any) -> BatchResult:
    """Create a batch and run it (awaitable; a subflow inside a Prefect flow). See `build_config`."""
    from agentbatch.flows.launch import prepare_launch, wait_for_prefect

    batch_config = build_config(config, **overrides)
    api = prepare_launch()  # the Prefect server `agentbatch run` uses, chosen as it does
    from agentbatch.flows.batch import create_batch, launch_batch, plan_batch

    plan = plan_batch(batch_config)  # the workload, built once for the run
    wait_for_prefect(api)
    store = _store(db)
    try:
        batch_id = create_batch(plan, store)
        outcome = await launch_batch(store, batch_id, api=api, workload=plan.workload, show_progress=show_progress,
                                     report_dir=Path(report_dir) if report_dir else None)
        return _result(store, batch_id, outcome.wall_s, outcome.report_path)
    finally:
        store.close()


async def aresume(batch_id: int, *, db: str | None = None, report_dir: str | Path | None = None,
                  show_progress: bool = False) -> BatchResult:
    """Continue an interrupted batch: completed steps are not executed again."""
    from agentbatch.flows.launch import prepare_launch, wait_for_prefect

    api = prepare_launch()
    from agentbatch.flows.batch import launch_batch

    store = _store(db)
    try:
        row = store.get_batch(batch_id)
        if row is None:
            raise ValueError(f"no batch {batch_id} in this store")
        validate_config(row.config, source=f"batch {batch_id}'s stored config")
        wait_for_prefect(api)
        outcome = await launch_batch(store, batch_id, api=api, show_progress=show_progress,
                                     report_dir=Path(report_dir) if report_dir else None)
        return _result(store, batch_id, outcome.wall_s, outcome.report_path)
    finally:
        store.close()


def _sync(coro: Any) -> BatchResult:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError("an event loop is running here (a notebook, async code): use `await agentbatch.arun(...)` "
                       "or `await agentbatch.aresume(...)`")


def run(config: BatchConfig | Mapping[str, Any] | str | Path | None = None, *, db: str | None = None,
        report_dir: str | Path | None = None, show_progress: bool = False, **overrides: Any) -> BatchResult:
    """Create a batch and run it to the end; returns its result. See `build_config` for `overrides`."""
    return _sync(arun(config, db=db, report_dir=report_dir, show_progress=show_progress, **overrides))


def resume(batch_id: int, *, db: str | None = None, report_dir: str | Path | None = None,
           show_progress: bool = False) -> BatchResult:
    """Continue an interrupted batch to the end; returns its result."""
    return _sync(aresume(batch_id, db=db, report_dir=report_dir, show_progress=show_progress))
