"""Scores by task group (a workload's suite or category, `TaskSpec.group`, kept in samples.task_group),
for the terminal: `status`, the report's summary and `--compare`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentbatch.db.store import GroupTally


@dataclass(frozen=True, slots=True)
class GroupScore:
    group: str
    samples: int
    scored: int  # samples with a score (completed)
    mean: float | None  # mean score of the scored ones

    def text(self) -> str:
        mean = "-" if self.mean is None else f"{self.mean:.3f}"
        return f"{self.group} {mean} ({self.scored}/{self.samples})"


def group_scores(samples: Iterable[Any]) -> dict[str, GroupScore]:
    """Per group, from sample rows (ORM rows or DataFrame tuples with task_group, score); empty when
    no sample has a group."""
    acc: dict[str, list[float | None]] = {}
    for s in samples:
        group = getattr(s, "task_group", None)
        if group is None or group != group:  # None or NaN (a DataFrame's missing value)
            continue
        score = getattr(s, "score", None)
        acc.setdefault(str(group), []).append(None if score is None or score != score else float(score))
    out = {}
    for group, scores in sorted(acc.items()):
        scored = [x for x in scores if x is not None]
        out[group] = GroupScore(group, len(scores), len(scored), sum(scored) / len(scored) if scored else None)
    return out


def tallied_group_scores(tallies: Mapping[str, GroupTally]) -> dict[str, GroupScore]:
    """`group_scores` from the store's per-group aggregates (`Store.group_tallies`), in group order."""
    return {g: GroupScore(g, t.samples, t.scored, t.mean if t.scored else None) for g, t in sorted(tallies.items())}


def group_line(scores: dict[str, GroupScore], label: str = "  by group      ") -> str | None:
    if not scores:
        return None
    return label + "; ".join(g.text() for g in scores.values())


def compare_lines(batches: list[tuple[str, dict[str, GroupScore]]]) -> list[str]:
    """One line per group: its mean score in each batch, the first batch as the reference."""
    groups = sorted({g for _, scores in batches for g in scores})
    lines = []
    for g in groups:
        cells = []
        for title, scores in batches:  # "batch 3"
            s = scores.get(g)
            cells.append(f"{title} {'-' if s is None or s.mean is None else f'{s.mean:.3f}'}")
        lines.append(f"  group {g}: " + ", ".join(cells))
    return lines
