"""`agentbatch run CONFIG`: create a batch from a config file and run it; `agentbatch create CONFIG`:
create it and start nothing (its samples are run by `join` processes or work-pool workers)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from agentbatch.flows.commands._common import add_db_option, fail
from agentbatch.flows.commands._inputs import writer_inputs_error
from agentbatch.flows.commands._launch import (
    add_progress_options,
    db_flag,
    follow_up,
    progress_mode,
    ready_prefect,
    start_prefect,
)
from agentbatch.flows.commands._outcome import add_fail_on_error, check_fail_on_error, finish_command


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run a batch from a YAML/TOML config",
        description="Create a batch from CONFIG (YAML or TOML; see examples/ and docs/config.md), run every "
        "sample through the Prefect flow, record every step in the store, and print makespan and score. "
        "A bad config is reported with the field at fault (exit 2) and nothing is written.",
    )
    p.add_argument("config", type=Path, help="batch config file (.yaml, .yml, .toml)")
    add_db_option(p)
    add_fail_on_error(p)
    p.add_argument("--report", type=Path, metavar="DIR", help="also write the HTML/PNG report to DIR")
    add_progress_options(p)
    p.set_defaults(func=main)
    c = sub.add_parser(
        "create", help="create a batch from a config and start nothing (for join / work-pool workers)",
        description="Check CONFIG as `run` does and write its batch and samples to the store; run nothing and "
        "start no Prefect server. Print the batch id: `agentbatch join BATCH_ID` (or `join --work-pool`) "
        "processes then drive it. Exit 0, or 2 on bad input with nothing written.",
    )
    c.add_argument("config", type=Path, help="batch config file (.yaml, .yml, .toml)")
    add_db_option(c)
    c.set_defaults(func=create_main)


def create_main(args: argparse.Namespace) -> int:
    from agentbatch.flows.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return fail(str(exc))
    if error := writer_inputs_error(args.db, None):
        return fail(error)
    from agentbatch.db.store import Store
    from agentbatch.flows.batch import create_batch, plan_batch

    try:  # before the store is opened: a workload that cannot run leaves nothing behind
        plan = plan_batch(config)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return fail(f"{args.config}: workload.params: {exc}")
    store = Store(args.db)
    try:
        batch_id = create_batch(plan, store)
        print(f"batch {batch_id} created ({len(plan.tasks)} samples); nothing runs it yet: start workers with\n"
              f"  agentbatch join {batch_id}{db_flag(store.url)}\n{follow_up(store.url, batch_id)}", flush=True)
    finally:
        store.close()
    return 0


def main(args: argparse.Namespace) -> int:
    from agentbatch.flows.config import ConfigError, load_config

    if error := check_fail_on_error(args.fail_on_error):
        return fail(error)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return fail(str(exc))
    if error := writer_inputs_error(args.db, args.report):
        return fail(error)
    api = start_prefect()  # before Prefect is imported; a server to start comes up meanwhile
    mode = progress_mode(args)
    from agentbatch.db.store import Store
    from agentbatch.flows.batch import create_batch, launch_batch, plan_batch

    try:  # before the store is opened: a workload that cannot run leaves nothing behind
        plan = plan_batch(config)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return fail(f"{args.config}: workload.params: {exc}")
    if error := ready_prefect(api, quiet=mode == "off"):
        return fail(error, code=1)
    store = Store(args.db)
    batch_id = create_batch(plan, store)
    print(f"batch {batch_id} created ({len(plan.tasks)} samples)\n{follow_up(store.url, batch_id)}", flush=True)
    outcome = asyncio.run(launch_batch(store, batch_id, api=api, workload=plan.workload, show_progress=mode,
                                       report_dir=args.report, fail_on_error=args.fail_on_error))
    return finish_command(store, outcome, args.fail_on_error)
