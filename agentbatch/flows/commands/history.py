"""`agentbatch history [SUITE|NAME]`: the runs of a suite (or the suites in the store)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from agentbatch.flows.commands._common import add_db_option, fail, quiet_on_closed_pipe

if TYPE_CHECKING:  # imported lazily at run time: `--help` stays fast
    from agentbatch.db.store import Store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "history", help="runs of a suite: date, tag, scores, makespan, failures",
        description="A suite is one workload kind with its params and task ids. Without an argument, list "
        "the suites in the store; with one (a suite key or its prefix, a deployment name or a batch name), "
        "list its runs: date (UTC), model/checkpoint tag, score overall and per group, makespan and its "
        "ratio to the lower bound, failed samples, and the priors each run was admitted with.",
    )
    p.add_argument("suite", nargs="?", default=None, metavar="SUITE|NAME", help="suite key, deployment or batch name")
    p.add_argument("--limit", type=int, default=20, help="latest runs shown per suite (default 20)")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_db_option(p)
    p.set_defaults(func=quiet_on_closed_pipe(main))


def _list_suites(store: Store, as_json: bool) -> int:
    from dataclasses import asdict

    from agentbatch.db.history import list_suites

    suites = list_suites(store)
    if as_json:
        print(json.dumps([asdict(s) for s in suites], indent=1))
        return 0
    if not suites:
        print("no batches in the store")
    for s in suites:
        deployed = f"; deployments {', '.join(s.deployments)}" if s.deployments else ""
        print(f"suite {s.suite_key}  {s.workload_kind}, {s.tasks} tasks, {s.runs} run(s), last batch "
              f"{s.last_batch}; names {', '.join(s.names)}{deployed}")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.limit < 1:
        return fail(f"--limit: expected 1 or more, got {args.limit}")
    from agentbatch.db.history import resolve_suites
    from agentbatch.db.store import Store

    store = Store(args.db)
    try:
        if args.suite is None:
            return _list_suites(store, args.json)
        keys = resolve_suites(store, args.suite)
        if not keys:
            return fail(f"no suite, deployment or batch named {args.suite!r} in {store.url} "
                        "(`agentbatch history` lists the suites)")
        return _print_runs(store, keys, args)
    finally:
        store.close()


def _print_runs(store: Store, keys: list[str], args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from agentbatch.dashboards.history import history_text, suite_history

    histories = {k: suite_history(store, k, limit=args.limit) for k in keys}
    if args.json:
        print(json.dumps({k: [asdict(r) for r in runs] for k, runs in histories.items()}, indent=1, default=str))
        return 0
    print("\n\n".join(history_text(k, runs) for k, runs in histories.items()))
    return 0
