"""What the live runner spends of its own, measured from a batch it recorded, as virtual-time config.

The live runner spends time of its own on every step (the HTTP round trip and tokenizing of a call,
the store's commit, the gap until the sample's next step is queued) and in starting the sample
chains; at a compressed engine speed (serve-sim's time scale) or on a busy machine that is a large
share of a step. `runner_cost` and `start_costs` measure both from a recorded trace (wall seconds);
`with_runner_costs` puts them in a VirtualConfig (engine seconds), so that a prediction models the
runner that recorded the batch (`agentbatch whatif`, policy auto's choice).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from agentbatch.sim.virtual_time.simulation import VirtualConfig
from agentbatch.traces.schema import Trace


@dataclass(frozen=True)
class StartCosts:
    """What the runner spends starting sample chains (wall seconds, measured from a recorded batch)."""

    offset_s: float  # from the first admission to the batch's first step, beyond latency and spacing
    spacing_s: float  # between the first steps of the samples admitted at the start (median)
    latency_s: float  # from a later admission to the sample's first step (median; 0 if none was later)


def start_costs(trace: Trace) -> StartCosts:
    """How the runner started the recorded chains. The samples admitted at the start (before any
    finished) are admitted together, but each first stamps its admission and writes it to the store,
    so their stamps are spread while their first steps are queued close together after the batch's
    start-up: the spacing of those first steps, not of the stamps, is what the simulation needs. A
    sample admitted later (a slot freed) queues its first step a latency after its admission."""
    known = _chains(trace)
    if not known:
        return StartCosts(0.0, 0.0, 0.0)
    t0 = min(a for a, _, _ in known)
    first_end = min(f for _, f, _ in known)
    wave = sorted(q for a, _, q in known if a < first_end)
    late = [q - a for a, _, q in known if a >= first_end]
    spacing = statistics.median([b - a for a, b in zip(wave, wave[1:], strict=False)]) if len(wave) > 1 else 0.0
    latency = max(0.0, statistics.median(late)) if late else 0.0
    return StartCosts(max(0.0, wave[0] - t0 - latency - spacing), spacing, latency)


def _chains(trace: Trace) -> list[tuple[float, float, float]]:
    """(admitted, finished, first step queued) of each sample that ran."""
    out = []
    for s in trace.samples:
        queued = s.steps[0].enqueued_at if s.steps else None
        if s.admitted_at is not None and s.finished_at is not None and queued is not None:
            out.append((s.admitted_at, s.finished_at, queued))
    return out


def runner_cost(trace: Trace) -> float:
    """Mean wall seconds per step the runner spent beyond the engine's and the tool's own time: an
    inference call's duration less its prefill, decode and engine queue, plus the gap until the
    sample's next step is queued."""
    total, steps = 0.0, 0
    for s in trace.samples:
        for i, st in enumerate(s.steps):
            steps += 1
            if st.kind == "inference" and st.prefill_s is not None:
                engine = (st.prefill_s or 0.0) + (st.decode_s or 0.0) + (st.engine_queue_s or 0.0)
                total += max(0.0, (st.duration_s or 0.0) - engine)
            nxt = s.steps[i + 1] if i + 1 < len(s.steps) else None
            if nxt is not None and nxt.enqueued_at is not None and st.finished_at is not None:
                total += max(0.0, nxt.enqueued_at - st.finished_at)  # not its wait for a slot: that is scheduling
    return total / steps if steps else 0.0


def with_runner_costs(cfg: VirtualConfig, traces: Sequence[Trace], time_scale: float) -> VirtualConfig:
    """`cfg` with the runner's costs measured in the recorded batches (the median over them), in engine
    seconds (wall seconds / the engines' time scale)."""
    if not traces:
        return cfg
    starts = [start_costs(t) for t in traces]
    return replace(cfg, step_latency_s=statistics.median(runner_cost(t) for t in traces) / time_scale,
                   sample_start_s=statistics.median(s.spacing_s for s in starts) / time_scale,
                   sample_start_latency_s=statistics.median(s.latency_s for s in starts) / time_scale)  # fmt: skip
