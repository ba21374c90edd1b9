"""A small deterministic tokenizer and chat rendering, for engines that have no real tokenizer.

Used by the scripted engine (token counts), the simulated engine (prefix-cache block hashes) and
trace generators. Pieces are words (with their leading space), runs of punctuation and whitespace, cut into pieces
of at most 4 characters, so token counts are close to a BPE tokenizer's (~4 chars/token on English
and JSON). Tokenizing a prefix of a text gives a prefix of its tokens, except for the last piece,
which is what prefix caching needs.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

_PIECE = re.compile(r" ?\w{1,4}| ?[^\w\s]{1,4}|\s+")
VOCAB_SIZE = 1 << 20


def tokenize(text: str) -> list[int]:
    return [zlib.crc32(p.encode()) % VOCAB_SIZE for p in _PIECE.findall(text)]


def count_tokens(text: str) -> int:
    return len(_PIECE.findall(text))


def render_message(message: dict[str, Any]) -> str:
    """One message as the text an engine would see (a ChatML-like template)."""
    parts = [f"<|{message.get('role', 'user')}|>\n"]
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if content:
        parts.append(str(content))
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        parts.append(f"<tool_call>{fn.get('name', '')}{fn.get('arguments', '')}</tool_call>")
    parts.append("<|end|>\n")
    return "".join(parts)


def render_chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    head = f"<|tools|>\n{json.dumps(tools, sort_keys=True)}<|end|>\n" if tools else ""
    return head + "".join(render_message(m) for m in messages)


def chat_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    return tokenize(render_chat(messages, tools))
