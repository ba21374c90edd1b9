"""The conversation of a trace sample: recorded messages where the trace has them, otherwise
deterministic filler text with the recorded token counts (synthetic traces).

Filler words are a space and four letters, exactly one token of agentbatch's tokenizer, so a
synthesized message has the recorded number of tokens (plus the chat template's few). Samples of
one prefix group get the same system text, so real engines see the shared prefix too.
"""

from __future__ import annotations

import functools
import threading
import zlib
from typing import Any

import numpy as np

from agentbatch.traces.schema import TraceSample, TraceStep

_GENERATORS = threading.local()  # one Mersenne Twister per thread (environments may run in threads)


@functools.lru_cache(maxsize=64)  # a prefix group's system text, asked for by each of its samples
def filler(n_tokens: int, key: str) -> str:
    """`n_tokens` one-token words, the same for the same key.

    The text of `random.Random(crc32(key))` drawing `rng.choices(string.ascii_lowercase, k=4)` per
    word: numpy's legacy generator is the same Mersenne Twister, seeded the same way from a one-word
    key array, and makes the same doubles, floor(random() * 26) each, in the same order; drawn in
    bulk, because replayed assistant turns and observations are made on the runner's hot path.
    """
    n = max(0, n_tokens)
    rng: np.random.RandomState | None = getattr(_GENERATORS, "rng", None)
    if rng is None:
        rng = _GENERATORS.rng = np.random.RandomState(0)
    rng.seed([zlib.crc32(key.encode())])  # a list: init_by_array, as random.seed(int) does
    draws = rng.random_sample(4 * n)
    draws *= 26.0
    words = np.full((n, 5), ord(" "), dtype=np.uint8)
    words[:, 1:] = draws.reshape(n, 4)  # truncated: floor for these non-negative values
    words[:, 1:] += ord("a")
    return words.tobytes().decode("ascii")


def initial_messages(sample: TraceSample) -> list[dict[str, Any]]:
    if sample.messages is not None:
        return [dict(m) for m in sample.messages]
    first = sample.steps[0].prompt_tokens if sample.steps and sample.steps[0].prompt_tokens else 0
    user_tokens = max(1, first - sample.shared_prefix_tokens)
    return [
        {"role": "system", "content": filler(sample.shared_prefix_tokens, f"system/{sample.prefix_group}")},
        {"role": "user", "content": filler(user_tokens, f"task/{sample.index}/{sample.task_id}")},
    ]


def assistant_message(sample: TraceSample, step: TraceStep) -> dict[str, Any]:
    if step.message is not None:
        return dict(step.message)
    return {"role": "assistant", "content": filler(step.output_tokens or 1, f"out/{sample.index}/{step.index}")}


def observation_messages(sample: TraceSample, step: TraceStep) -> list[dict[str, Any]]:
    if step.observation is not None:
        return [dict(m) for m in step.observation]
    if not step.obs_tokens:
        return []
    # A user message rather than a tool message: synthetic assistants make no tool calls to answer.
    return [{"role": "user", "content": filler(step.obs_tokens, f"obs/{sample.index}/{step.index}")}]
