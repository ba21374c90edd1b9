"""How big the report is and how fast headless Chromium opens it, at 60, 2,000 and 10,000 samples.

Each size is a synthetic batch written into a temporary SQLite store: chains of 6-40 alternating
inference and environment steps on 4 workers and 16 environment slots, in the runner's
request/response format (a system and user prompt on the first step, an assistant message with a
tool call and its JSON arguments on each inference step, a 200-600 character observation on each
environment step); 4 task groups; 5 % of the samples fail, with a failed step attempt retried
before it. Per size it prints the time to write the report (HTML, transcripts, PNGs), the size of
index.html, of the transcript pages together and of the whole folder, and two render times in
headless Chromium (`--dump-dom`, no virtual time budget), each page after an empty one:

- `open`: wall time of the Chromium process that loads index.html and dumps its DOM, minus the
  same for an empty page on the same run (the browser's own start-up);
- `CPU`: the CPU seconds of all the browser's processes for the report, minus those for the
  empty page: what the page itself costs, much less sensitive to the host's load than wall time;
- `drawn`: the page's own clock (performance.now(), from navigation start) when its script has
  drawn every chart and the sample list (`data-drawn-ms` on <html>).

    .venv/bin/python bench/report_size.py [--samples 60 2000 10000] [--repeat 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import re
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import insert

from agentbatch.dashboards.browser import find_chromium, render
from agentbatch.dashboards.report import write_report
from agentbatch.db.models import Batch, Sample, Step
from agentbatch.db.store import Store

GROUPS = ("base", "miss_func", "miss_param", "long_context")
WORDS = "the file report directory budget alpha beta listing moved copied ticket price flight".split()


def _text(rng: np.random.Generator, chars: int) -> str:
    out, n = [], 0
    while n < chars:
        w = WORDS[int(rng.integers(len(WORDS)))]
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def _step_rows(rng: np.random.Generator, bid: int, i: int, t: float, chain: int, fail: bool
               ) -> tuple[list[dict[str, Any]], float]:
    rows = []
    for k in range(chain):
        inf = k % 2 == 0
        enq = t + float(rng.exponential(0.05))
        start = enq + float(rng.exponential(0.2))
        dur = float(rng.gamma(2.0, 0.4 if inf else 0.6))
        common = dict(batch_id=bid, index=k, kind="inference" if inf else "environment", attempt=1,
                      enqueued_at=enq, started_at=start, worker=f"w{i % 4}" if inf else f"slot-{i % 16}")
        if fail and k == 1:  # a failed attempt, retried
            rows.append(dict(common, status="failed", finished_at=start + 0.3, error="EnvironmentFailure: timeout",
                             request={"from_step": 0}))
            start, common["attempt"] = start + 0.5, 2
        if inf:
            request: dict[str, Any] = {"n_messages": k + 2, "priority": k}
            if k == 0:
                request.update(messages=[{"role": "system", "content": _text(rng, 300)},
                                         {"role": "user", "content": _text(rng, 150)}], tools=[])
            call = {"id": f"c{k}", "type": "function",
                    "function": {"name": f"tool_{k % 5}", "arguments": f'{{"path": "{_text(rng, 20)}"}}'}}
            response = {"message": {"role": "assistant", "content": _text(rng, 60), "tool_calls": [call]},
                        "finish_reason": "tool_calls"}
            extra = dict(prompt_tokens=500 + 200 * k, cached_prompt_tokens=400 + 150 * k, output_tokens=80,
                         prefill_s=0.1 * dur, decode_s=0.8 * dur, engine_queue_s=0.1 * dur)
        else:
            request = {"from_step": k - 1}
            response = {"messages": [{"role": "tool", "tool_call_id": f"c{k - 1}",
                                      "content": _text(rng, int(rng.integers(200, 600)))}], "done": False}
            extra = dict(tool_calls=1)
        rows.append(dict(common, status="completed", finished_at=start + dur, request=request, response=response,
                         **extra))
        t = start + dur
    return rows, t


def build(store: Store, n: int, seed: int = 0) -> tuple[int, int]:
    """The synthetic batch (see the module docstring); returns its id and its number of step rows."""
    rng = np.random.default_rng(seed)
    with store.session() as s, s.begin():
        b = Batch(name=f"synthetic-{n}", config={"scheduling": {"env_slots": 16, "per_worker_inflight": 8}},
                  status="completed", created_at=0.0, started_at=0.0)
        s.add(b)
        s.flush()
        bid = b.id
    samples, steps = [], []
    admit = np.sort(rng.uniform(0, n / 20, n))
    for i in range(n):
        fail = rng.random() < 0.05
        rows, end = _step_rows(rng, bid, i, float(admit[i]), int(rng.integers(3, 21)) * 2, fail)
        samples.append(dict(batch_id=bid, index=i, task_id=f"{GROUPS[i % 4]}_{i}", task={}, task_group=GROUPS[i % 4],
                            status="failed" if fail else "completed", steps_done=sum(r["status"] == "completed"
                                                                                      for r in rows),
                            score=None if fail else float(rng.integers(0, 2)), admitted_at=float(admit[i]),
                            finished_at=end + 0.01, error="ScoringError: checker crashed" if fail else None,
                            result=None if fail else {"valid": True}))
        steps.append(rows)
    with store.engine.begin() as conn:
        ids = conn.execute(insert(Sample).returning(Sample.id, sort_by_parameter_order=True), samples).scalars().all()
        keys = ("batch_id", "index", "kind", "status", "attempt", "enqueued_at", "started_at", "finished_at", "worker",
                "prompt_tokens", "cached_prompt_tokens", "output_tokens", "prefill_s", "decode_s", "engine_queue_s",
                "tool_calls", "request", "response", "error")  # one shape for every row of an executemany
        flat = [dict({k: r.get(k) for k in keys}, sample_id=sid) for sid, rows in zip(ids, steps, strict=True)
                for r in rows]
        for i in range(0, len(flat), 20_000):
            conn.execute(insert(Step), flat[i:i + 20_000])
    return bid, len(flat)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _open_s(page: Path) -> tuple[float, float, int | None]:
    """Wall and CPU seconds of the browser (all its processes) loading the page, and the page's clock."""
    t, cpu = time.perf_counter(), _children_cpu()
    r = render(page, dump_dom=True, budget_ms=None, timeout_s=300)
    wall, cpu = time.perf_counter() - t, _children_cpu() - cpu
    if r.returncode != 0 or r.console_errors:
        raise RuntimeError(f"chromium failed on {page}: {r.console_errors or r.stderr[-500:]}")
    m = re.search(r'data-drawn-ms="(\d+)"', r.dom)
    return wall, cpu, int(m.group(1)) if m else None


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _stored(tmp: Path, n: int) -> tuple[Store, int, int, float]:
    """The synthetic store of n samples: built, or the one a previous run left in --dir."""
    path = tmp / f"bench-{n}.sqlite"
    fresh = not path.exists()
    store = Store(f"sqlite:///{path}")
    if fresh:
        (bid, rows), t_build = _timed(lambda: build(store, n))
        return store, bid, rows, t_build
    with store.session() as s:
        rows = s.query(Step).count()
    return store, 1, rows, 0.0


def measure(n: int, tmp: Path, empty: Path, repeat: int) -> None:
    store, bid, rows, t_build = _stored(tmp, n)
    out = tmp / f"report-{n}"
    page, t_write = _timed(lambda: write_report(store, [bid], out))
    store.close()
    index_mb, samples_mb, total_mb = page.stat().st_size / 1e6, _size(out / "samples") / 1e6, _size(out) / 1e6
    runs = []
    for _ in range(repeat):  # an empty page, then the report, one after the other: the same load
        base, base_cpu, _ = _open_s(empty)
        wall, cpu, drawn = _open_s(page)
        runs.append((wall, base, cpu - base_cpu, drawn))
    print(f"{n:6d} samples, {rows:7d} step rows (stored in {t_build:.1f} s): report written in {t_write:6.1f} s; "
          f"index.html {index_mb:6.3f} MB, transcripts {samples_mb:7.1f} MB, folder {total_mb:7.1f} MB", flush=True)
    for wall, base, cpu, drawn in runs:
        print(f"        open in Chromium {wall:5.2f} s (an empty page {base:5.2f} s, difference {wall - base:+5.2f} s); "
              f"browser CPU beyond the empty page's {cpu:5.2f} s; drawn by the page's clock at {drawn} ms", flush=True)


def _timed(fn: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[60, 2000, 10000])
    ap.add_argument("--repeat", type=int, default=3, help="render each page this many times")
    ap.add_argument("--dir", type=Path, default=None,
                    help="keep the stores and reports here (a store already there is reused; default: a temporary folder)")
    args = ap.parse_args()
    if find_chromium() is None:
        raise SystemExit("chromium not found (.ci/setup_chromium.sh installs it)")
    with tempfile.TemporaryDirectory() as tmp:
        where = args.dir or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        empty = where / "empty.html"
        empty.write_text("<!DOCTYPE html><html><body></body></html>")
        for n in args.samples:
            measure(n, where, empty, args.repeat)


if __name__ == "__main__":
    main()
