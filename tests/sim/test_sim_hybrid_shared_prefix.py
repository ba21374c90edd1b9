"""Regression: a request whose first blocks were cached by another sample still caches its own later
blocks, so the next turn of its sample gets a prefix hit (dense and hybrid alike)."""

from __future__ import annotations

import random

import pytest

from agentbatch.sim.model import EngineModel, SimRequest
from agentbatch.sim.profiles import get_profile


def run(profile: str) -> list[tuple[int, int]]:
    model = EngineModel(get_profile(profile))
    rng = random.Random(0)

    def toks(n: int) -> list[int]:
        return [rng.randrange(1 << 20) for _ in range(n)]

    shared = toks(3000)
    x1 = shared + toks(300)  # another sample with the same system prompt
    y1 = shared + toks(300)
    y2 = y1 + toks(400)  # y's next turns extend its own conversation
    y3 = y2 + toks(400)
    now, out = 0.0, []
    for i, (sample, prompt) in enumerate([(1, x1), (2, y1), (2, y2), (2, y3)]):
        model.add_request(SimRequest(f"r{i}", sample, prompt, 10, arrival=now), now)
        while model.has_work():
            it = model.run_iteration(now)
            now += it.duration
            out += [(s.cached_prompt_tokens, s.recomputed_tokens) for s in it.finished]
        model.check_invariants()
    return out


@pytest.mark.parametrize("profile", ["llama3-8b-h100", "ling-flash-2.0-h200"])
def test_turns_after_a_shared_prefix_hit_their_own_prefix(profile: str) -> None:
    bs = get_profile(profile).block_size
    (_, _), (_, _), (c2, r2), (c3, r3) = run(profile)
    # y2 reuses y1's full blocks (3300 tokens), y3 reuses y2's (3700): whole blocks only
    assert c2 == (3300 // bs) * bs and c3 == (3700 // bs) * bs
    assert r2 == r3 == 0
