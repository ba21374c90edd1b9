"""Chain-length priors from earlier batches of the same tasks (history-aware CAAS).

Evaluations rerun the same benchmark on every checkpoint: the recorded chain lengths of a task id
predict how long its next run will be. The prior is the mean `steps_done` of the task's completed
samples in other batches; SampleProgress.prior_chain_steps takes it.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import func, select

from agentbatch.db.models import Sample, SampleStatus
from agentbatch.db.store import Store


def prior_chain_steps(
    store: Store, task_ids: Iterable[str], exclude_batch_id: int | None = None
) -> dict[str, float]:
    ids = sorted(set(task_ids))
    if not ids:
        return {}
    out: dict[str, float] = {}
    with store.session() as s:
        for i in range(0, len(ids), 500):  # keep IN lists of a sane size
            q = (
                select(Sample.task_id, func.avg(Sample.steps_done))
                .where(Sample.task_id.in_(ids[i : i + 500]), Sample.status == SampleStatus.COMPLETED)
                .group_by(Sample.task_id)
            )
            if exclude_batch_id is not None:
                q = q.where(Sample.batch_id != exclude_batch_id)
            out.update({task: float(avg) for task, avg in s.execute(q)})
    return out
