"""What live re-planning pays to read a running batch at each checkpoint: `export_batch` (every step
with its payloads, observations tokenized) against `RecordReader` (agentbatch/db/trace_io.py: step
rows without payloads, and only the steps completed since the last read converted).

A recorded batch of --samples samples of --family is imported into a fresh SQLite store with the
steps of the last --pending share of each chain not yet completed; then: export_batch, the reader's
first read, and the reader's read after those steps completed. Ratios are against export_batch,
measured in the same run (CPU seconds of this process).

    .venv/bin/python bench/record_reader.py [--samples 1000] [--family mcp_like] [--pending 0.1]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import update

from agentbatch.db.models import Step, StepStatus
from agentbatch.db.store import Store
from agentbatch.db.trace_io import RecordReader, export_batch, import_trace
from agentbatch.traces import generate


def timed(fn: Callable[[], Any]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--family", default="mcp_like")
    parser.add_argument("--pending", type=float, default=0.1, help="share of each chain not yet completed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'store.sqlite'}")
        trace = generate(args.family, args.samples, seed=1)
        batch_id = import_trace(store, trace, base_time=1000.0)
        steps = store.steps(batch_id)
        chain = {s.index: len(s.steps) for s in trace.samples}
        index_of = {sm.id: sm.index for sm in store.samples(batch_id)}
        late = [st.id for st in steps if st.index >= (1 - args.pending) * chain[index_of[st.sample_id]]]
        with store.session() as s, s.begin():
            s.execute(update(Step).where(Step.id.in_(late)).values(status=StepStatus.RUNNING))
        export = timed(lambda: export_batch(store, batch_id))
        reader = RecordReader(store, batch_id)
        first = timed(reader.read)
        with store.session() as s, s.begin():
            s.execute(update(Step).where(Step.id.in_(late)).values(status=StepStatus.COMPLETED))
        later = timed(reader.read)
        print(f"{args.samples} samples of {args.family}, {len(steps)} steps ({len(late)} completing between reads); "
              f"CPU s: export_batch {export:.2f}, reader first read {first:.2f} (x{first / export:.2f}), "
              f"next read {later:.2f} (x{later / export:.2f}); load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
