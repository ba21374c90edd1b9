"""`agentbatch show BATCH_ID SAMPLE [--index] [--full] [--db URL]`: one sample's transcript in the
terminal (messages, tool calls and observations, score and scorer output, errors, and per step
attempt its timing, worker, tokens and retries)."""

from __future__ import annotations

import argparse

from agentbatch.flows.commands._common import EXIT_USAGE, add_db_option, fail, quiet_on_closed_pipe


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "show",
        help="print one sample's transcript: conversation, tool calls, observations, score, step timings",
        description="Print a sample's transcript from the store: each step attempt with its timing "
        "(queued, running), worker, tokens and status, the messages, the tool calls with their arguments, "
        "the observations, the score and the scorer's output. Long texts are folded (--full shows them); "
        "control characters are shown escaped.",
    )
    p.add_argument("batch_id", type=int, help="batch id")
    p.add_argument("sample", type=int, help="sample id (the report's `sample` column), or with --index its index")
    p.add_argument("--index", action="store_true", help="SAMPLE is the sample's index in the batch (0, 1, ...)")
    p.add_argument("--full", action="store_true", help="do not fold long messages and observations")
    add_db_option(p)
    p.set_defaults(func=quiet_on_closed_pipe(run))


def run(args: argparse.Namespace) -> int:
    from agentbatch.dashboards.transcript import UnknownSample, load_transcript, sample_id_at
    from agentbatch.dashboards.transcript_view import to_text
    from agentbatch.flows.commands.status import open_store_or_explain

    store = open_store_or_explain(args.db, "show")
    if store is None:
        return EXIT_USAGE
    try:
        if store.get_batch(args.batch_id) is None:
            return fail(f"show: no batch with id {args.batch_id} in this store")
        try:
            sample_id = sample_id_at(store, args.batch_id, args.sample) if args.index else args.sample
            transcript = load_transcript(store, args.batch_id, sample_id)
        except UnknownSample as exc:
            hint = "" if args.index else " (use --index for the sample's index in the batch)"
            return fail(f"show: {exc}{hint}")
        print(to_text(transcript, full=args.full))
        return 0
    finally:
        store.close()
