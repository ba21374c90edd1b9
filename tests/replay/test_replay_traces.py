"""Traces: seeded generators, prefix structure, Parquet and store round trips."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentbatch.db.store import Store
from agentbatch.db.trace_io import export_batch, import_trace
from agentbatch.traces import FAMILIES, chain_priors, generate, read_trace, write_trace


def _shape(trace):
    return [(s.task_id, [(st.kind, st.prompt_tokens, st.output_tokens, st.obs_tokens, st.duration_s, st.done)
                         for st in s.steps], s.score) for s in trace.samples]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_generators_are_seeded_and_alternate(family: str) -> None:
    a, b, c = generate(family, 30, seed=5), generate(family, 30, seed=5), generate(family, 30, seed=6)
    assert _shape(a) == _shape(b)
    assert _shape(a) != _shape(c)
    for s in a.samples:
        kinds = [st.kind for st in s.steps]
        assert kinds == ["inference", "environment"] * (len(kinds) // 2)
        assert s.steps[-1].done and not any(st.done for st in s.steps[:-1])
        assert all(st.duration_s > 0 for st in s.environment_steps)


def test_prompts_grow_by_output_and_observation() -> None:
    trace = generate("swe_like", 20, seed=1)
    for s in trace.samples:
        steps = s.steps
        assert steps[0].prompt_tokens > s.shared_prefix_tokens
        for k in range(0, len(steps) - 2, 2):
            assert steps[k + 2].prompt_tokens == steps[k].prompt_tokens + steps[k].output_tokens + steps[k + 1].obs_tokens


def test_epochs_rerun_the_same_tasks() -> None:
    e0, e1 = generate("mcp_like", 40, seed=2, epoch=0), generate("mcp_like", 40, seed=2, epoch=1)
    assert [s.task_id for s in e0.samples] == [s.task_id for s in e1.samples]
    assert [s.prefix_group for s in e0.samples] == [s.prefix_group for s in e1.samples]
    assert _shape(e0) != _shape(e1)
    priors = chain_priors(e0)
    assert priors[e0.samples[3].task_id] == len(e0.samples[3].steps)
    # task-level lengths carry over: the prior predicts the rerun far better than the mean does
    import numpy as np

    l1 = np.array([len(s.steps) for s in e1.samples], dtype=float)
    p = np.array([priors[s.task_id] for s in e1.samples])
    assert np.mean(np.abs(l1 - p)) < 0.7 * np.mean(np.abs(l1 - l1.mean()))


def test_parquet_round_trip(tmp_path: Path) -> None:
    trace = generate("widesearch_like", 15, seed=3)
    trace.samples[0].steps[0].message = {"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}
    trace.samples[0].steps[1].observation = [{"role": "tool", "tool_call_id": "1", "content": "ü"}]
    trace.samples[0].steps[1].tools = [{"type": "function", "function": {"name": "added"}}]
    path = write_trace(trace, tmp_path / "t.parquet")
    back = read_trace(path)
    assert back.samples == trace.samples
    assert back.meta == trace.meta


def test_store_round_trip(store: Store, tmp_path: Path) -> None:
    trace = generate("bfcl_like", 12, seed=4)
    write_trace(trace, tmp_path / "a.parquet")
    batch_id = import_trace(store, read_trace(tmp_path / "a.parquet"), name="imported", base_time=1000.0)
    assert store.get_batch(batch_id).status == "completed"
    back = export_batch(store, batch_id)
    assert [s.task_id for s in back.samples] == [s.task_id for s in trace.samples]
    assert [s.score for s in back.samples] == [s.score for s in trace.samples]
    for a, b in zip(trace.samples, back.samples, strict=True):
        assert [(x.index, x.kind, x.prompt_tokens, x.output_tokens, x.done) for x in a.steps] == \
               [(y.index, y.kind, y.prompt_tokens, y.output_tokens, y.done) for y in b.steps]
        # durations survive as finished - started of back-to-back steps
        assert [round(x.duration_s, 6) for x in a.environment_steps] == \
               [round(y.duration_s, 6) for y in b.environment_steps]
        # the synthesized conversation was written: messages now carry the recorded token counts
        assert b.messages and b.steps[0].message["role"] == "assistant"
    # exported again it is stable: store -> parquet -> store -> parquet
    write_trace(back, tmp_path / "b.parquet")
    again = export_batch(store, import_trace(store, read_trace(tmp_path / "b.parquet"), base_time=1000.0))
    assert [[(st.kind, st.message, st.observation) for st in s.steps] for s in again.samples] == \
           [[(st.kind, st.message, st.observation) for st in s.steps] for s in back.samples]
    assert store.prior_chain_lengths([trace.samples[0].task_id], exclude_batch_id=-1) == \
        {trace.samples[0].task_id: float(len(trace.samples[0].steps))}
