"""`agentbatch diff A [B]`: per-task score changes, per-group deltas and the makespan change."""

from __future__ import annotations

import argparse
import json

from agentbatch.flows.commands._common import add_db_option, fail, quiet_on_closed_pipe


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff", help="what changed between two runs of a suite (regressed / fixed tasks, group scores, makespan)",
        description="Compare batch B with batch A (with only A: A with the previous finished run of its "
        "suite). Lists tasks whose score fell (regressed) or rose (fixed) by more than --threshold, or that "
        "failed / recovered; the mean score overall and per group before and after; and the makespan. "
        "Exit 0, or 1 with --fail-on-regression when a task regressed.",
    )
    p.add_argument("a", type=int, metavar="A", help="batch id (the earlier run)")
    p.add_argument("b", type=int, nargs="?", default=None, metavar="B", help="batch id (the later run)")
    p.add_argument("--threshold", type=float, default=0.0, help="score drop that counts as a regression (default 0: any drop)")
    p.add_argument("--makespan-threshold", type=float, default=None, metavar="RATIO",
                   help="flag a makespan more than (1 + RATIO) x the earlier run's (off by default)")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when a task regressed")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_db_option(p)
    p.set_defaults(func=quiet_on_closed_pipe(main))


def main(args: argparse.Namespace) -> int:
    if args.threshold < 0 or (args.makespan_threshold is not None and args.makespan_threshold < 0):
        return fail("--threshold and --makespan-threshold must be 0 or more")
    from agentbatch.dashboards.history import diff_runs
    from agentbatch.db.history import previous_run
    from agentbatch.db.store import Store, UnknownBatch

    store = Store(args.db)
    try:
        if store.get_batch(args.a) is None or (args.b is not None and store.get_batch(args.b) is None):
            missing = args.a if store.get_batch(args.a) is None else args.b
            return fail(f"no batch with id {missing} in {store.url}")
        before, after = args.a, args.b
        if after is None:
            before, after = previous_run(store, args.a), args.a
            if before is None:
                return fail(f"batch {args.a} is the first finished run of its suite; give two batch ids")
        try:
            diff = diff_runs(store, before, after, threshold=args.threshold,
                             makespan_threshold=args.makespan_threshold)
        except UnknownBatch as exc:
            return fail(str(exc))
        print(json.dumps(diff.as_dict(), indent=1, default=str) if args.json else diff.to_text())
        return 1 if args.fail_on_regression and diff.regressions else 0
    finally:
        store.close()
