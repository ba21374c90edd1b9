"""Synthetic conversation text is made on the runner's hot path (every replayed observation): the fast
filler must be the very text of its definition, word by word `rng.choices(letters, k=4)`, so that
traces, replays and prefix caches see the same prompts as before."""

from __future__ import annotations

import random
import string
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from agentbatch.traces.conversation import filler


def reference(n_tokens: int, key: str) -> str:
    rng = random.Random(zlib.crc32(key.encode()))
    return "".join(" " + "".join(rng.choices(string.ascii_lowercase, k=4)) for _ in range(max(0, n_tokens)))


@pytest.mark.parametrize("n", [-2, 0, 1, 2, 5, 1000, 12_345])
@pytest.mark.parametrize("key", ["", "system/g0", "obs/17/3", "task/4/ünïcode"])
def test_filler_is_the_reference_text(n: int, key: str) -> None:
    text = filler(n, key)
    assert text == reference(n, key)
    assert len(text.split()) == max(0, n) and all(len(w) == 4 for w in text.split())


def test_filler_matches_for_many_keys() -> None:
    """Every seed, not a lucky few: keys whose crc32 spans the 32-bit range."""
    for i in range(300):
        key = f"obs/{i}/{i * 7919}"
        assert filler.__wrapped__(i % 50 + 1, key) == reference(i % 50 + 1, key)


def test_filler_from_threads_is_the_reference_text() -> None:
    """Blocking environments make filler in their own threads: one generator per thread."""
    keys = [f"obs/t/{i}" for i in range(64)]
    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(lambda k: filler.__wrapped__(300, k), keys))
    assert texts == [reference(300, k) for k in keys]
