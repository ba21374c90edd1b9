"""Prefect UI artifacts of a batch: a progress bar while it runs, a table and a markdown summary
(with a link to the HTML report) at the end.

Outside a Prefect flow or task run every call does nothing: creating artifacts there would start an
ephemeral API server or fail, and a batch must never break because of its dashboard. Errors from
the Prefect API are logged, not raised, for the same reason.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from pathlib import Path
from typing import Any
from uuid import UUID

from agentbatch.dashboards.inert import cell_inert, md_inert
from agentbatch.db.store import Store

log = logging.getLogger(__name__)
MIN_UPDATE_INTERVAL_S = 2.0


def in_prefect_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def store_tag(store_url: str) -> str:
    """8 hex digits naming a store (its URL without the password): batch ids repeat across stores,
    so Prefect artifact keys and tags carry this too."""
    shown = re.sub(r"://([^:/@]+):[^@]*@", r"://\1@", store_url)
    if shown.startswith("sqlite:///") and not shown.startswith("sqlite:////"):  # relative: to the cwd
        path = shown.removeprefix("sqlite:///").split("?")[0]
        if path and not path.startswith((":memory:", "file:")):
            shown = f"sqlite:///{Path(path).resolve()}"
    return hashlib.sha256(shown.encode()).hexdigest()[:8]


def _key(batch_id: int, store_url: str, what: str) -> str:
    return f"agentbatch-{store_tag(store_url)}-batch-{batch_id}-{what}"


def progress_key(batch_id: int, store_url: str) -> str:
    return _key(batch_id, store_url, "progress")


def summary_key(batch_id: int, store_url: str) -> str:
    return _key(batch_id, store_url, "summary")


def report_key(batch_id: int, store_url: str) -> str:
    return _key(batch_id, store_url, "report")


class BatchProgressArtifact:
    """Samples done / total as a Prefect progress artifact, updated at most every
    `min_interval_s` seconds (and always for the last sample)."""

    def __init__(self, min_interval_s: float = MIN_UPDATE_INTERVAL_S) -> None:
        self.min_interval_s = min_interval_s
        self.artifact_id: UUID | None = None
        self.batch_id: int | None = None
        self.store_url = ""
        self.total = 0
        self.sent = 0  # updates sent to the API (the creation not counted)
        self._last_sent = -math.inf
        self._pending: int | None = None  # the newest value not sent yet
        self._sending = False

    def _description(self, done: int) -> str:
        return f"agentbatch batch {self.batch_id}: {done}/{self.total} samples done"

    async def start(self, batch_id: int, total: int, store_url: str = "") -> None:
        self.batch_id, self.total, self.store_url = batch_id, total, store_url
        if not in_prefect_run():
            return
        from prefect.artifacts import acreate_progress_artifact

        try:
            self.artifact_id = await acreate_progress_artifact(
                progress=0.0, key=progress_key(batch_id, store_url), description=self._description(0))
            self._last_sent = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - the UI must not break the batch
            log.warning("cannot create the Prefect progress artifact: %s", exc)

    async def update(self, done: int) -> None:
        """Called as each sample ends. One update at a time: while one is on its way the newest value
        waits (thousands of samples ending at once must not each open a request to the API)."""
        if self.artifact_id is None:
            return
        self._pending = done
        if self._sending or (done < self.total and time.monotonic() - self._last_sent < self.min_interval_s):
            return
        await self._send()

    async def flush(self) -> None:
        """Send a value held back by the throttle (call when the batch stops early)."""
        if self.artifact_id is not None and self._pending is not None and not self._sending:
            await self._send()

    async def _send(self) -> None:
        """Send the pending value; again when the last one arrived while sending (it is always sent)."""
        from prefect.artifacts import aupdate_progress_artifact

        assert self.artifact_id is not None
        self._sending = True
        try:
            while self._pending is not None:
                done = self._pending  # stays pending until sent: a failed or cancelled send leaves it to flush
                progress = 100.0 * done / self.total if self.total else 100.0
                try:
                    await aupdate_progress_artifact(self.artifact_id, progress=min(progress, 100.0),
                                                    description=self._description(done))
                except Exception as exc:  # noqa: BLE001
                    log.warning("cannot update the Prefect progress artifact: %s", exc)
                    break
                finally:
                    self._last_sent = time.monotonic()
                self.sent += 1
                if self._pending == done:
                    self._pending = None
                if self._pending is not None and self._pending < self.total:
                    break  # not the last value: it waits for the next update after the interval
        finally:
            self._sending = False


def _clean(v: Any) -> Any:
    """JSON-safe table cell: no NaN/inf, floats rounded for reading."""
    if isinstance(v, float):
        return None if not math.isfinite(v) else round(v, 4)
    return cell_inert(v) if isinstance(v, str) else v  # names and ids: text, never markup


def _fmt(x: float | None, unit: str = "s") -> str:
    return "-" if x is None else f"{x:.2f} {unit}".strip()


def summary_markdown(summary: Any, report_path: Path | None) -> str:
    lb = summary.lower_bound
    lines = [f"# agentbatch batch {summary.batch_id}: {md_inert(summary.name)}", "",
             f"**{summary.samples_completed}/{summary.samples_total} completed**, {summary.samples_failed} failed "
             f"({summary.status})", ""]
    if report_path is not None:
        p = Path(report_path).resolve()
        lines += [f"Report: [{p}]({p.as_uri()}) (open it locally; `agentbatch report {summary.batch_id}` "
                  "writes it again)", ""]
    lines += ["| figure | value |", "|---|---|"]
    lines += [f"| makespan | {_fmt(summary.makespan_s)} |",
              f"| lower bound | {_fmt(lb.value) if lb else '-'} ({lb.binding if lb else '-'}) |",
              f"| makespan / lower bound | {_fmt(summary.lb_ratio, '')} |",
              f"| tail 90 % -> last | {_fmt(summary.tail_90_s)} |",
              f"| tail 99 % -> last | {_fmt(summary.tail_99_s)} |",
              f"| cache-hit rate | {_fmt(summary.cache_hit_rate, '')} |",
              f"| recomputed tokens | {summary.recomputed_tokens} |",
              f"| mean score | {_fmt(summary.score_mean, '')} |"]
    lines += [f"| phase {k} | {_fmt(v)} |" for k, v in summary.phases.items()]
    if summary.critical:
        lines += ["", "## Samples that finished last", "", "| sample | task | finished | steps | chain | waited on |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {c.sample_id} | {md_inert(c.task_id)} | {c.finished_s:.1f} s | {c.steps} | {c.chain_s:.1f} s | "
                  f"{md_inert(c.waited_on)} ({c.waits.get(c.waited_on, 0.0):.1f} s) |" for c in summary.critical]
    return "\n".join(lines)


async def publish_batch_artifacts(store: Store, batch_id: int, report_path: Path | None) -> None:
    """Table + markdown artifacts with the batch summary (and a link to the report)."""
    if not in_prefect_run():
        log.debug("not in a Prefect run: no artifacts for batch %s", batch_id)
        return
    from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact

    from agentbatch.dashboards.summary import summarize

    try:
        summary = summarize(store, batch_id)
        rows = [{"figure": k, "value": _clean(v)} for k, v in summary.as_row().items()]
        await acreate_table_artifact(table=rows, key=summary_key(batch_id, store.url),
                                     description=f"agentbatch batch {batch_id}: figures")
        await acreate_markdown_artifact(markdown=summary_markdown(summary, report_path), key=report_key(batch_id, store.url),
                                        description=f"agentbatch batch {batch_id}: summary")
    except Exception as exc:  # noqa: BLE001
        log.warning("cannot publish the Prefect artifacts of batch %s: %s", batch_id, exc)


def write_report_if(store: Store, batch_id: int, out_dir: Path | None) -> Path | None:
    """The batch's HTML/PNG report in out_dir (None: none). pandas, plotly and matplotlib are imported
    only here: the batch flow imports this module, and a run's first step should not wait for them."""
    if out_dir is None:
        return None
    from agentbatch.dashboards.report import write_report

    return write_report(store, [batch_id], out_dir)
