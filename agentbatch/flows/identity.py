"""How a batch is named in Prefect: its flow run `batch-<id>-<name>`, tags that tell batches of
different stores apart (on the flow run only: tagged task runs cost a concurrency round trip each)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from agentbatch.dashboards.artifacts import store_tag


def slug(text: str, limit: int = 60) -> str:
    """Lowercase letters, digits and dashes (Prefect artifact keys allow no more)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit] or "batch"


def flow_run_name(batch_id: int, name: str) -> str:
    return f"batch-{batch_id}-{slug(name)}"


def batch_tags(store_url: str, batch_id: int) -> list[str]:
    return ["agentbatch", f"batch-{batch_id}", f"store-{store_tag(store_url)}"]


@contextlib.contextmanager
def untagged_task_runs() -> Iterator[None]:
    """Run the chains' task runs without the flow run's tags. Prefect acquires a tag concurrency
    slot (two blocking server calls) for every tagged task run, which cost ~8x in steps/s; the
    flow run keeps the batch tags and task-run names (`s<index>-...`) tell samples apart."""
    from prefect.context import TagsContext

    with TagsContext(current_tags=set()):
        yield
