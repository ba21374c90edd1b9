"""Helpers that write batches with hand-set timings straight into the store's tables."""

from __future__ import annotations

from typing import Any

from agentbatch.db.models import Batch, Sample, Step, Worker
from agentbatch.db.store import Store

T0 = 1000.0


def write_batch(store: Store, samples: list[dict[str, Any]], *, config: dict[str, Any] | None = None,
                name: str = "known", workers: tuple[str, ...] = (), status: str = "completed",
                heartbeat_at: float | None = None) -> int:
    """Write a batch: each sample dict has task_id, admitted, finished, status, score, optional error
    and group, and steps (dicts with kind, enq, start, fin and optional status/attempt/worker/token/timing
    fields, and request/response/error as recorded)."""
    with store.session() as s, s.begin():
        fins = [x["finished"] for x in samples if x.get("finished") is not None]
        batch = Batch(name=name, config=config or {}, status=status, created_at=T0 - 1, started_at=T0,
                      finished_at=max(fins) if fins and status == "completed" else None, heartbeat_at=heartbeat_at)
        s.add(batch)
        s.flush()
        for w in workers:
            s.add(Worker(batch_id=batch.id, name=w, kind="engine"))
        for i, x in enumerate(samples):
            done = [st for st in x.get("steps", []) if st.get("status", "completed") == "completed"]
            sample = Sample(batch_id=batch.id, index=i, task_id=x["task_id"], task={}, status=x["status"],
                            steps_done=len(done), score=x.get("score"), admitted_at=x.get("admitted"),
                            finished_at=x.get("finished"), error=x.get("error"), task_group=x.get("group"),
                            result=x.get("result"))
            s.add(sample)
            s.flush()
            for st in x.get("steps", []):
                s.add(Step(
                    batch_id=batch.id, sample_id=sample.id, index=st["index"], kind=st["kind"],
                    status=st.get("status", "completed"), attempt=st.get("attempt", 1),
                    enqueued_at=st["enq"], started_at=st["start"], finished_at=st.get("fin"),
                    worker=st.get("worker"), prompt_tokens=st.get("prompt"), cached_prompt_tokens=st.get("cached"),
                    recomputed_tokens=st.get("recomputed"), output_tokens=st.get("output"),
                    prefill_s=st.get("prefill"), decode_s=st.get("decode"), engine_queue_s=st.get("eq"),
                    request=st.get("request"), response=st.get("response"), error=st.get("error"),
                ))
        return batch.id


def _inf(index: int, enq: float, start: float, fin: float, worker: str, prefill: float, decode: float,
         prompt: int, cached: int, eq: float = 0.0, recomputed: int = 0, output: int = 10) -> dict[str, Any]:
    return dict(index=index, kind="inference", enq=T0 + enq, start=T0 + start, fin=T0 + fin, worker=worker,
                prefill=prefill, decode=decode, prompt=prompt, cached=cached, eq=eq, recomputed=recomputed,
                output=output)


def _env(index: int, enq: float, start: float, fin: float, status: str = "completed", attempt: int = 1
         ) -> dict[str, Any]:
    return dict(index=index, kind="environment", enq=T0 + enq, start=T0 + start, fin=T0 + fin,
                worker="slot", status=status, attempt=attempt)


KNOWN_CONFIG = {"scheduling": {"env_slots": 2, "per_worker_inflight": 2}, "engine": {"params": {}}}


def known_samples(scores: tuple[float, ...] = (1.0, 0.0, 1.0, 1.0), shift: float = 0.0) -> list[dict[str, Any]]:
    """Four samples on workers w0/w1 and 2 environment slots (times relative to T0)."""
    s = [
        dict(task_id="t0", admitted=T0, finished=T0 + 8.5, status="completed", score=scores[0], steps=[
            _inf(0, 0, 0, 3, "w0", 1.0, 1.5, 100, 0, eq=0.5),
            _env(1, 3.5, 4, 6),
            _inf(2, 6, 6, 8, "w0", 0.5, 1.5, 200, 100)]),
        dict(task_id="t1", admitted=T0, finished=T0 + 12, status="completed", score=scores[1], steps=[
            _inf(0, 0, 1, 4, "w1", 1.0, 2.0, 100, 0),
            _env(1, 4, 4, 5, status="failed"),
            _env(1, 5, 6, 9, attempt=2),
            _inf(2, 9, 9, 11, "w1", 0.5, 1.5, 200, 100, recomputed=50)]),
        dict(task_id="t2", admitted=T0 + 2, finished=T0 + 14, status="completed", score=scores[2], steps=[
            _inf(0, 2, 2, 4, "w0", 0.5, 1.5, 100, 50),
            _env(1, 4, 5, 11),
            _inf(2, 11, 11, 13, "w0", 0.5, 1.5, 300, 200)]),
        dict(task_id="t3", admitted=T0, finished=T0 + 1, status="completed", score=scores[3], steps=[
            _inf(0, 0, 0, 1, "w1", 0.2, 0.8, 50, 0)]),
    ]
    if shift:
        for x in s:
            x["admitted"] += shift
            x["finished"] += shift
            for st in x["steps"]:
                for k in ("enq", "start", "fin"):
                    st[k] += shift
    return s
