"""The engine model against hand-computable cases and vLLM's documented prefix-cache semantics."""

from __future__ import annotations

import random

import pytest

from agentbatch.sim import CostModel, EngineModel, EngineProfile, SimRequest
from agentbatch.sim.drive import drive

COST = CostModel(c0=0.010, c_prefill=0.001, c_decode=0.002, c_attn=0.0)


def prof(**kw) -> EngineProfile:
    base = dict(
        name="test",
        block_size=4,
        num_kv_blocks=100,
        max_num_seqs=16,
        max_num_batched_tokens=64,
        state_slots=None,
        state_checkpoints=0,
        cost=COST,
    )
    base.update(kw)
    return EngineProfile(**base)


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def req(
    rid: str, prompt: list[int], out: int = 1, sample: int | None = None, priority: int = 0
) -> SimRequest:
    return SimRequest(rid, hash(rid) % 1000 if sample is None else sample, prompt, out, priority=priority)


def run_all(model: EngineModel, now: float = 0.0) -> tuple[float, list]:
    done = []
    while model.has_work():
        r = model.run_iteration(now)
        now += r.duration
        done.extend(r.finished)
        model.check_invariants()
    return now, done


# --- prefix caching -----------------------------------------------------------------------------


def test_shared_prefix_is_computed_once_in_the_same_step():
    m = EngineModel(prof())
    m.add_request(req("a", toks(100, 10), sample=1), 0.0)
    m.add_request(req("b", toks(100, 8) + [1, 2], sample=2), 0.0)
    first = m.run_iteration(0.0)
    # A computes its 10 tokens; B finds A's two full blocks (8 tokens) and computes only 2.
    assert first.prefill_tokens == 12
    _, done = run_all(m, first.duration)
    stats = {s.request_id: s for s in first.finished + done}
    assert stats["a"].cached_prompt_tokens == 0
    assert stats["b"].cached_prompt_tokens == 8
    met = m.metrics()
    assert met["prefix_cache_queries_total"] == 20
    assert met["prefix_cache_hits_total"] == 8


def test_shared_prefix_hits_after_the_first_request_finished():
    m = EngineModel(prof())
    m.add_request(req("a", toks(100, 10)), 0.0)
    now, _ = run_all(m)
    m.add_request(req("b", toks(100, 9) + [7]), now)
    _, done = run_all(m, now)
    assert done[0].cached_prompt_tokens == 8
    assert done[0].recomputed_tokens == 0  # another sample: nothing of its own was lost


@pytest.mark.parametrize(
    ("prompt_len", "expected_hit"),
    [(3, 0), (4, 0), (5, 4), (7, 4), (8, 4), (9, 8), (16, 12), (17, 16)],
)
def test_hits_are_full_blocks_and_never_the_last_token(prompt_len, expected_hit):
    """vLLM: only full blocks are cached, a hit is a multiple of block_size, and the last prompt token
    is always computed (a block-aligned identical prompt recomputes its last block)."""
    m = EngineModel(prof())
    m.add_request(req("a", toks(0, prompt_len)), 0.0)
    now, _ = run_all(m)
    m.add_request(req("b", toks(0, prompt_len)), now)
    _, done = run_all(m, now)
    assert done[0].cached_prompt_tokens == expected_hit
    assert done[0].cached_prompt_tokens % 4 == 0


def test_prefix_caching_off_never_hits():
    m = EngineModel(prof(enable_prefix_caching=False))
    m.add_request(req("a", toks(0, 20)), 0.0)
    now, _ = run_all(m)
    m.add_request(req("b", toks(0, 20)), now)
    _, done = run_all(m, now)
    assert done[0].cached_prompt_tokens == 0


def test_holds_prefix_reports_the_samples_cached_tokens():
    m = EngineModel(prof(num_kv_blocks=10))
    assert m.holds_prefix(1) == 0
    m.add_request(req("a", toks(0, 10), sample=1), 0.0)
    now, _ = run_all(m)
    assert m.holds_prefix(1) == 8
    # another sample's 40-token prompt needs all 10 blocks: sample 1's blocks are evicted
    m.add_request(req("b", toks(500, 39), sample=2), now)
    run_all(m, now)
    assert m.holds_prefix(1) == 0


# --- eviction and recompute ---------------------------------------------------------------------


def _eviction_case(num_kv_blocks: int):
    m = EngineModel(prof(num_kv_blocks=num_kv_blocks))
    p1 = toks(0, 16)
    m.add_request(req("s1-0", p1, sample=1), 0.0)
    now, _ = run_all(m)  # 4 full blocks cached for sample 1
    m.add_request(req("s2-0", toks(1000, 32), sample=2), now)
    now, _ = run_all(m, now)  # needs 8 blocks: with 10 in all, 2 of sample 1's are evicted
    m.add_request(req("s1-1", p1 + toks(5000, 8), sample=1), now)
    _, done = run_all(m, now)
    return m, done[0]


def test_eviction_under_memory_pressure_causes_counted_recompute():
    m, turn2 = _eviction_case(num_kv_blocks=10)
    # sample 1's tail blocks went first (LRU, tail before head): 2 of its 4 blocks survive
    assert turn2.cached_prompt_tokens == 8
    assert turn2.recomputed_tokens == 8
    met = m.metrics()
    assert met["recomputed_tokens_total"] == 8
    assert met["evicted_blocks_total"] >= 2


def test_no_pressure_no_recompute():
    m, turn2 = _eviction_case(num_kv_blocks=100)
    assert turn2.cached_prompt_tokens == 16
    assert turn2.recomputed_tokens == 0
    assert m.metrics()["evicted_blocks_total"] == 0


@pytest.mark.parametrize(("caching", "recomputed"), [(False, 12), (True, 4)])
def test_preemption_frees_blocks_and_counts_the_recompute(caching, recomputed):
    """6 blocks of 4 tokens; two requests of 4 + 12 tokens need 4 blocks each. At step 9 both need
    their 4th block with none free: the newest (b, 12 tokens computed in 3 blocks) is preempted and a
    takes one of b's freed blocks (b's tail: LRU evicts a sequence's tail first). Without prefix
    caching b recomputes all 12 tokens on resume; with it (vLLM V1 keeps freed blocks cached) b finds
    its first 2 blocks again and recomputes only the 4 tokens of the block a took."""
    m = EngineModel(prof(num_kv_blocks=6, enable_prefix_caching=caching))
    m.add_request(req("a", toks(0, 4), out=12), 0.0)
    m.add_request(req("b", toks(100, 4), out=12), 0.0)
    _, done = run_all(m)
    stats = {s.request_id: s for s in done}
    assert stats["a"].preemptions == 0
    assert stats["b"].preemptions == 1
    assert stats["b"].recomputed_tokens == recomputed
    assert stats["a"].finished < stats["b"].finished
    assert stats["b"].output_tokens == 12
    assert m.metrics()["num_preemptions_total"] == 1


def test_priority_preempts_the_lowest_priority_not_the_newest():
    def run(policy: str) -> dict:
        m = EngineModel(prof(num_kv_blocks=6), policy=policy)
        m.add_request(req("low", toks(0, 4), out=12, priority=5), 0.0)
        m.add_request(req("high", toks(100, 4), out=12, priority=0), 0.0)
        _, done = run_all(m)
        return {s.request_id: s.preemptions for s in done}

    # priority admits "high" first (it is the newest running one under FCFS rules as well)
    assert run("priority") == {"low": 1, "high": 0}
    assert run("fcfs") == {"low": 0, "high": 1}


# --- hybrid models: state slots and checkpoints ---------------------------------------------------


def test_full_state_slot_pool_queues_new_sequences():
    m = EngineModel(prof(state_slots=2, state_checkpoints=4))
    for i in range(3):
        m.add_request(req(f"r{i}", toks(100 * i, 8), out=5), 0.0)
    m.run_iteration(0.0)
    met = m.metrics()
    assert met["kv_cache_usage_perc"] == m.kv_cache_usage() == 4 / 100  # 2 blocks each of the two
    assert met["num_requests_running"] == 2
    assert met["num_requests_waiting"] == 1
    _, done = run_all(m, 0.0)
    stats = {s.request_id: s for s in done}
    assert stats["r2"].first_scheduled == pytest.approx(min(stats["r0"].finished, stats["r1"].finished))
    assert stats["r2"].queue_s > 0


def test_dense_model_runs_all_at_once():
    m = EngineModel(prof())
    for i in range(3):
        m.add_request(req(f"r{i}", toks(100 * i, 8), out=5), 0.0)
    m.run_iteration(0.0)
    assert m.metrics()["num_requests_running"] == 3


def test_hybrid_prefix_hit_needs_a_state_checkpoint():
    def second_hit(checkpoints: int, budget: int, shared: int) -> int:
        p = prof(state_slots=4, state_checkpoints=checkpoints, max_num_batched_tokens=budget, max_num_seqs=4)
        m = EngineModel(p)
        m.add_request(req("a", toks(0, 16)), 0.0)
        now, _ = run_all(m)
        m.add_request(req("b", toks(0, shared) + toks(900, 8)), now)
        _, done = run_all(m, now)
        return done[0].cached_prompt_tokens

    assert second_hit(checkpoints=4, budget=64, shared=16) == 16  # state saved at the end of the prefill
    assert second_hit(checkpoints=0, budget=64, shared=16) == 0  # KV blocks cached, but no state
    # prefill in chunks of 8 tokens saves states at blocks 2 and 4: a 12-token match is cut back to 8
    assert second_hit(checkpoints=4, budget=8, shared=12) == 8
    # one saved state at the end only: a 12-token match has no usable state
    assert second_hit(checkpoints=4, budget=64, shared=12) == 0


def test_dense_model_hits_mid_prompt():
    m = EngineModel(prof())
    m.add_request(req("a", toks(0, 16)), 0.0)
    now, _ = run_all(m)
    m.add_request(req("b", toks(0, 12) + toks(900, 8)), now)
    _, done = run_all(m, now)
    assert done[0].cached_prompt_tokens == 12


# --- batching and timing --------------------------------------------------------------------------


def test_single_request_time_split():
    m = EngineModel(prof(cost=CostModel(c0=0.01, c_prefill=0.0, c_decode=0.0, c_attn=0.0)))
    m.add_request(req("a", toks(0, 10), out=5), 2.0)
    _, done = run_all(m, 2.5)
    s = done[0]
    assert s.queue_s == pytest.approx(0.5)
    assert s.prefill_s == pytest.approx(0.01)  # one step computes the prompt and samples token 1
    assert s.decode_s == pytest.approx(0.04)  # four decode steps for tokens 2..5
    assert s.output_tokens == 5
    assert s.queue_s + s.prefill_s + s.decode_s == pytest.approx(s.finished - s.arrival)


def test_batching_raises_throughput_until_the_token_budget():
    """Prefill-only requests of 16 tokens, budget 64 tokens per step: n requests take ceil(16n/64)
    steps; throughput rises with n until a step is full (n = 4), then stays at the full-step rate."""
    budget = 64
    p = prof(max_num_batched_tokens=budget, max_num_seqs=64, num_kv_blocks=2000)

    def throughput(n: int, out: int) -> float:
        arrivals = [(0.0, req(f"r{i}", toks(1000 * i, 16), out=out)) for i in range(n)]
        res = drive(p, arrivals)
        return n * (16 + out - 1) / res.makespan

    tp = {n: throughput(n, out=1) for n in (1, 2, 3, 4, 8, 16, 32)}
    for n in (1, 2, 3, 4):
        assert tp[n] == pytest.approx(16 * n / COST.iteration_time(16 * n, 0, 0))
    assert tp[1] < tp[2] < tp[3] < tp[4]
    full = budget / COST.iteration_time(budget, 0, 0)
    for n in (4, 8, 16, 32):
        assert tp[n] == pytest.approx(full)
    # decode: more sequences per step share the fixed cost c0, so tokens/s keep rising with n
    dec = [throughput(n, out=32) for n in (1, 4, 16, 48)]
    assert dec == sorted(dec) and dec[-1] > 3 * dec[0]


def test_priority_order_and_ties_by_arrival():
    def order(policy: str) -> list[str]:
        m = EngineModel(prof(max_num_seqs=1), policy=policy)
        for rid, pr in [("p5", 5), ("p1", 1), ("p3", 3), ("p1b", 1)]:
            m.add_request(req(rid, toks(hash(rid) % 10_000 * 10, 8), out=3, priority=pr), 0.0)
        _, done = run_all(m)
        return [s.request_id for s in done]

    assert order("priority") == ["p1", "p1b", "p3", "p5"]
    assert order("fcfs") == ["p5", "p1", "p3", "p1b"]


def test_chunked_prefill_respects_the_token_budget():
    m = EngineModel(prof(max_num_batched_tokens=16, num_kv_blocks=100))
    m.add_request(req("long", toks(0, 50), out=2), 0.0)
    sizes = []
    now = 0.0
    while m.has_work():
        r = m.run_iteration(now)
        now += r.duration
        sizes.append((r.prefill_tokens, r.decode_seqs))
    assert sizes == [(16, 0), (16, 0), (16, 0), (2, 0), (0, 1)]


def test_decode_first_then_prefill_of_newcomers():
    m = EngineModel(prof(max_num_batched_tokens=16))
    m.add_request(req("a", toks(0, 4), out=10), 0.0)
    r = m.run_iteration(0.0)
    m.add_request(req("b", toks(100, 40), out=2), r.duration)
    r2 = m.run_iteration(r.duration)
    assert (r2.decode_seqs, r2.prefill_tokens) == (1, 15)  # a's decode token first, then 15 of b's


# --- validation, determinism, invariants -----------------------------------------------------------


def test_rejects_requests_that_can_never_fit_and_duplicate_ids():
    m = EngineModel(prof(num_kv_blocks=4))
    with pytest.raises(ValueError, match="KV blocks"):
        m.add_request(req("big", toks(0, 20), out=1), 0.0)
    m.add_request(req("ok", toks(0, 8)), 0.0)
    with pytest.raises(ValueError, match="already"):
        m.add_request(req("ok", toks(0, 8)), 0.0)
    with pytest.raises(ValueError):
        prof(max_num_seqs=128, max_num_batched_tokens=64)
    with pytest.raises(ValueError):
        EngineModel(prof(), policy="lifo")


def _random_load(seed: int, policy: str, hybrid: bool) -> list:
    p = prof(
        num_kv_blocks=120,
        max_num_seqs=12,
        max_num_batched_tokens=96,
        state_slots=6 if hybrid else None,
        state_checkpoints=10 if hybrid else 0,
    )
    m = EngineModel(p, policy=policy)
    rng = random.Random(seed)
    shared = [rng.randrange(30) for _ in range(12)]
    prompts = {s: shared + [rng.randrange(30) for _ in range(rng.randrange(1, 60))] for s in range(25)}
    idle = list(range(25))
    now, k, out = 0.0, 0, []
    while len(out) < 150:
        while idle and rng.random() < 0.6:
            s = idle.pop(0)
            m.add_request(SimRequest(f"{s}-{k}", s, prompts[s], rng.randrange(1, 40), rng.randrange(3)), now)
            k += 1
        if not m.has_work():
            continue
        r = m.run_iteration(now)
        now += r.duration
        m.check_invariants()
        for st in r.finished:
            out.append(st)
            grown = prompts[st.sample_id] + [rng.randrange(30) for _ in range(rng.randrange(1, 30))]
            prompts[st.sample_id] = grown if len(grown) < 300 else shared[:]
            idle.append(st.sample_id)
    return out


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("hybrid", [False, True])
def test_random_load_keeps_the_books_and_is_deterministic(policy, hybrid):
    a = _random_load(7, policy, hybrid)
    b = _random_load(7, policy, hybrid)
    assert a == b
    assert sum(s.preemptions for s in a) > 0  # the load does press on memory
    assert sum(s.cached_prompt_tokens for s in a) > 0
    for s in a:
        assert s.cached_prompt_tokens % 4 == 0
        assert s.cached_prompt_tokens < s.prompt_tokens
        assert s.queue_s >= 0 and s.prefill_s > 0 and s.decode_s >= 0


def test_abort_frees_what_the_request_holds():
    m = EngineModel(prof(num_kv_blocks=20))
    m.add_request(req("a", toks(0, 30), out=50), 0.0)
    m.add_request(req("b", toks(100, 30), out=50), 0.0)
    m.add_request(req("c", toks(200, 30), out=50), 0.0)
    now = 0.0
    for _ in range(3):
        now += m.run_iteration(now).duration
    assert m.abort_request("a") and m.abort_request("c")
    assert not m.abort_request("a")
    m.check_invariants()
    _, done = run_all(m, now)
    assert [s.request_id for s in done] == ["b"]
    assert m.metrics()["kv_cache_usage_perc"] == 0.0 == m.kv_cache_usage()
