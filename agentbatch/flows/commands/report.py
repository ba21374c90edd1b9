"""`agentbatch report BATCH_ID [--compare OTHER ...] [--out DIR] [--db URL]`: write the HTML/PNG
report of a batch (optionally against others, of this store or another) and print its summary.

OTHER is a batch id of this store, `URL#ID` (another store's batch), `PATH#ID` (a SQLite store
file's batch), or `URL`/`PATH` alone when that store holds one batch."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbatch.flows.commands._common import EXIT_USAGE, add_db_option, fail, quiet_on_closed_pipe
from agentbatch.flows.commands._inputs import out_dir_error

if TYPE_CHECKING:
    from agentbatch.db.store import Store


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
    p.add_argument("--compare", nargs="+", default=[], metavar="OTHER",
                   help="batches to compare against (same tasks, other policies or runs): an id of this store, "
                   "URL#ID or PATH#ID of another store (PATH: a SQLite file), or URL/PATH alone for a store "
                   "holding one batch")
    p.add_argument("--out", type=Path, default=None, help="output folder (default ./reports/batch-<id>/)")
    p.add_argument("--screenshot", action="store_true",
                   help="also save screenshot.png of the page's top (headless Chromium, when installed)")
    add_db_option(p)
    p.set_defaults(func=quiet_on_closed_pipe(run))


@dataclass
class OtherBatch:
    """A --compare value: a batch id, and the store when it is not the report's own."""

    batch_id: int | None  # None: the only batch of `url`
    url: str | None = None
    label: str = ""  # how the report names that store


def parse_other(value: str) -> OtherBatch:
    """`7`, `URL#7`, `PATH#7`, `URL` or `PATH` (raises ValueError with what was expected)."""
    from agentbatch.flows.commands._inputs import db_url_error

    if value.strip().isdigit():
        return OtherBatch(int(value))
    where, sep, ident = value.rpartition("#") if "#" in value else (value, "", "")
    if sep and not ident.strip().isdigit():
        raise ValueError(f"--compare {value!r}: expected ID, URL#ID or PATH#ID (ID a batch id), got {ident!r} after '#'")
    if "://" in where:
        if error := db_url_error(where, arg="--compare"):
            raise ValueError(error)
        url = where
    else:
        path = Path(where).expanduser()
        if not path.is_file():
            raise ValueError(f"--compare {value!r}: no store file {path} (expected ID, URL#ID or PATH#ID)")
        url, where = f"sqlite:///{path.resolve()}", str(path)
    from sqlalchemy.engine import make_url

    label = where if "://" not in where else make_url(where).render_as_string(hide_password=True)
    return OtherBatch(int(ident) if sep else None, url, label)


def _only_batch(store: Store, label: str) -> int:
    ids = _batch_ids(store)
    if len(ids) != 1:
        held = ", ".join(map(str, ids[:20])) or "none"
        raise ValueError(f"--compare {label}: the store holds batches {held}: name one as {label}#ID")
    return ids[0]


def _batch_ids(store: Store) -> list[int]:
    from sqlalchemy import select

    from agentbatch.db.models import Batch

    with store.session() as s:
        return list(s.scalars(select(Batch.id).order_by(Batch.id)))


def load_others(store: Store, values: list[str], opened: list[Store]) -> list[tuple[Any, Store]]:
    """(BatchAnalysis, its store) for each --compare value; other stores are opened read-only and
    appended to `opened` (the caller closes them). Raises ValueError or db.store.UnknownBatch."""
    from agentbatch.dashboards.analytics import BatchAnalysis
    from agentbatch.dashboards.frames import load_batch
    from agentbatch.db.engine import StoreUnavailable
    from agentbatch.db.store import Store

    out = []
    for value in values:
        other = parse_other(value)
        where = store
        if other.url is not None:
            try:
                where = Store(other.url, read_only=True)
            except StoreUnavailable as exc:
                raise ValueError(f"--compare {other.label}: {exc}") from None
            opened.append(where)
        data = load_batch(where, other.batch_id if other.batch_id is not None else _only_batch(where, other.label))
        data.source = other.label if where is not store else ""
        out.append((BatchAnalysis(data), where))
    return out


def _write(analyses: list[Any], out: Path, stores: list[Store]) -> Path | str:
    """The report's index page, or what stopped it being written."""
    from agentbatch.dashboards.report import write_report_for

    try:
        return write_report_for(analyses, out, store=stores[0], stores=stores)
    except OSError as exc:  # the folder was checked; it can still fail (disk full, removed meanwhile)
        return f"report: --out {out}: cannot write: {exc.strerror or exc}"


def run(args: argparse.Namespace) -> int:
    # Imported here: the CLI loads every command module, and pandas is slow to import.
    from agentbatch.dashboards.analytics import BatchAnalysis
    from agentbatch.dashboards.compare import compare
    from agentbatch.dashboards.frames import load_batch
    from agentbatch.dashboards.report import default_out_dir
    from agentbatch.dashboards.sections import hints
    from agentbatch.dashboards.summary import summary_from_analysis
    from agentbatch.db.store import UnknownBatch
    from agentbatch.flows.commands.status import open_store_or_explain
    from agentbatch.flows.stored_plugins import plugins_line

    if error := out_dir_error(args.out, "--out"):
        return fail(f"report: {error}")
    store = open_store_or_explain(args.db, "report")
    if store is None:
        return EXIT_USAGE
    opened: list[Store] = []
    try:
        try:
            main = BatchAnalysis(load_batch(store, args.batch_id))
            others = load_others(store, args.compare, opened)
        except (UnknownBatch, ValueError) as exc:
            return fail(f"report: {exc}")
        analyses = [main, *(a for a, _ in others)]
        index = _write(analyses, args.out or default_out_dir(args.batch_id), [store, *(s for _, s in others)])
        if isinstance(index, str):
            return fail(index)
        for a in analyses:
            print(summary_from_analysis(a).to_text())
            print(plugins_line(a.data.config))
        if len(analyses) > 1:
            print(compare(analyses).to_text())
        for h in hints(analyses[0]):
            print(f"hint: {h.finding} {h.action[:1].upper() + h.action[1:]}.")
        print(f"report: {index.resolve()}")
        print(f"samples: {index.resolve()}#samples (each links to its transcript; `agentbatch show "
              f"{args.batch_id} SAMPLE` prints one here)")
        print(f"charts: {', '.join(str(p) for p in sorted(index.parent.glob('*.png')))}")
        if args.screenshot:
            from agentbatch.dashboards.browser import screenshot

            shot = screenshot(index, index.parent / "screenshot.png")
            print(f"screenshot: {shot.resolve()} (top of the page in headless Chromium: summary, figures, "
                  "tail and latency charts)" if shot else "screenshot: skipped (chromium not installed or failed)")
        return 0
    finally:
        for other in opened:
            other.close()
        store.close()
