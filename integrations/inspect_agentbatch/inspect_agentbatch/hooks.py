"""When inspect finishes a sample, the gateway finishes it too, with its score: the sample's
admission slot goes to the next sample at once, and the score is in the gateway's batch."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import httpx
from inspect_ai.hooks import Hooks, SampleEnd, hooks

from inspect_agentbatch.identity import started

log = logging.getLogger(__name__)


def _score(sample: Any) -> tuple[float | None, dict[str, Any]]:
    """The first scorer's value as a number (C/I, yes/no, booleans and numbers convert), and every
    scorer's value as recorded."""
    from inspect_ai.scorer import value_to_float

    values: dict[str, Any] = {}
    first: float | None = None
    for name, score in (sample.scores or {}).items():
        values[name] = score.value if isinstance(score.value, str | int | float | bool) else str(score.value)
        if first is None:
            try:
                first = float(value_to_float()(score.value))
            except (TypeError, ValueError):
                first = None
    return first, values


@hooks(name="agentbatch", description="Finish each sample on the agentbatch gateway with its score.")
class AgentbatchHooks(Hooks):
    async def on_sample_end(self, data: SampleEnd) -> None:
        entry = started.pop(data.sample.uuid or "", None)
        if entry is None:  # it never went through the gateway
            return
        root, key = entry
        score, scores = _score(data.sample)
        body: dict[str, Any] = {"score": score, "result": {"scores": scores, "epoch": data.sample.epoch}}
        if data.sample.error is not None:
            body["error"] = data.sample.error.message
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                r = await http.post(f"{root}/v1/samples/{quote(key, safe='')}/finish", json=body)
            if r.status_code >= 400:
                log.warning("agentbatch gateway: finishing sample %s: HTTP %s %s", key, r.status_code, r.text[:200])
        except httpx.HTTPError as exc:
            log.warning("agentbatch gateway: finishing sample %s failed: %s", key, exc)
