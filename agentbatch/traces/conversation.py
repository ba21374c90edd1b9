"""The conversation of a trace sample: recorded messages where the trace has them, otherwise
deterministic filler text with the recorded token counts (synthetic traces).

Filler words are a space and four letters, exactly one token of agentbatch's tokenizer, so a
synthesized message has the recorded number of tokens (plus the chat template's few). Samples of
one prefix group get the same system text, so real engines see the shared prefix too.
"""

from __future__ import annotations

import functools
import random
import string
import zlib
from itertools import islice
from typing import Any

from agentbatch.traces.schema import TraceSample, TraceStep

_LETTERS = string.ascii_lowercase
_TABLE = bytes(range(ord("a"), ord("a") + 26)).ljust(256, b"?")  # 0..25 -> a..z


@functools.lru_cache(maxsize=64)  # a prefix group's system text, asked for by each of its samples
def filler(n_tokens: int, key: str) -> str:
    """`n_tokens` one-token words, the same for the same key.

    The text of `rng.choices(_LETTERS, k=4)` per word (the same random() draws, floor(random() * 26)
    each, in the same order), drawn in C loops: replayed observations are made on the runner's hot path.
    """
    n = max(0, n_tokens)
    rand = random.Random(zlib.crc32(key.encode())).random
    letters = bytes(map(int, map((26.0).__mul__, islice(iter(rand, None), 4 * n)))).translate(_TABLE)
    out = bytearray(b" " * (5 * n))
    for i in range(4):
        out[i + 1::5] = letters[i::4]
    return out.decode("ascii")


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
