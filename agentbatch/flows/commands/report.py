"""`agentbatch report BATCH_ID [--compare OTHER ...] [--out DIR] [--db URL]`: write the HTML/PNG
report of a batch (optionally against others) and print its summary."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentbatch.flows.commands._common import EXIT_USAGE, add_db_option, fail
from agentbatch.flows.commands._inputs import out_dir_error


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="write a batch's HTML/PNG report and print its makespan summary",
        description="Write an offline HTML page (interactive charts) and PNG charts of a batch: makespan, "
        "lower bound, tail, phases, utilisation, cache hits, critical samples. With --compare, the "
        "other batches are shown side by side with ratios to the first, and their scores are checked "
        "per task id.",
    )
    p.add_argument("batch_id", type=int, help="batch id (see the store)")
    p.add_argument("--compare", type=int, nargs="+", default=[], metavar="OTHER",
                   help="other batch ids (same tasks, different policies) to compare against")
    p.add_argument("--out", type=Path, default=None, help="output folder (default ./reports/batch-<id>/)")
    p.add_argument("--screenshot", action="store_true",
                   help="also save screenshot.png of the page's top (headless Chromium, when installed)")
    add_db_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: the CLI loads every command module, and pandas/plotly are slow to import.
    from agentbatch.dashboards.analytics import BatchAnalysis
    from agentbatch.dashboards.compare import compare
    from agentbatch.dashboards.frames import UnknownBatch, load_batch
    from agentbatch.dashboards.report import default_out_dir, write_report_for
    from agentbatch.dashboards.sections import hints
    from agentbatch.dashboards.summary import summary_from_analysis
    from agentbatch.flows.commands.status import open_store_or_explain
    from agentbatch.flows.config import plugins_line

    if error := out_dir_error(args.out, "--out"):
        return fail(f"report: {error}")
    store = open_store_or_explain(args.db, "report")
    if store is None:
        return EXIT_USAGE
    try:
        ids = [args.batch_id, *args.compare]
        try:
            analyses = [BatchAnalysis(load_batch(store, b)) for b in ids]
        except UnknownBatch as exc:
            return fail(f"report: {exc}")
        out = args.out or default_out_dir(args.batch_id)
        index = write_report_for(analyses, out, store=store)
        for a in analyses:
            print(summary_from_analysis(a).to_text())
            print(plugins_line(a.data.config))
        if len(analyses) > 1:
            print(compare(analyses).to_text())
        for h in hints(analyses[0]):
            print(f"hint: {h.finding} {h.action[:1].upper() + h.action[1:]}.")
        print(f"report: {index.resolve()}")
        print(f"charts: {', '.join(str(p) for p in sorted(index.parent.glob('*.png')))}")
        if args.screenshot:
            from agentbatch.dashboards.browser import screenshot

            shot = screenshot(index, index.parent / "screenshot.png")
            print(f"screenshot: {shot.resolve()} (top of the page in headless Chromium: summary, figures, "
                  "tail and latency charts)" if shot else "screenshot: skipped (chromium not installed or failed)")
        return 0
    finally:
        store.close()
