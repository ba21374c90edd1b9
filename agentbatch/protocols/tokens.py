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
from array import array
from collections.abc import Iterator, Sequence
from functools import lru_cache
from itertools import chain
from typing import Any, overload

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


def render_tools(tools: list[dict[str, Any]] | None) -> str:
    return f"<|tools|>\n{json.dumps(tools, sort_keys=True)}<|end|>\n" if tools else ""


def render_chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    return render_tools(tools) + "".join(render_message(m) for m in messages)


def chat_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    return ChatPrompt(messages, tools).ids


# Every rendered message starts with "<|" and ends with "<|end|>\n", so no piece crosses a message
# boundary: a chat's tokens are its parts' tokens end to end, and each part is tokenized once.
@lru_cache(maxsize=16384)
def _text_tokens(text: str) -> array[int]:
    return array("I", tokenize(text))  # 4 bytes a token (ids < 2**20)


class _ToolsMemo:
    """The tools header's tokens by the tools list's identity: agents pass one list object for a
    whole conversation, and rendering it (10-20 kB of JSON) is most of a step's tokenizing. Entries
    hold their list, so an id is never reused while cached; the lists are treated as read-only."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._by_id: dict[int, tuple[list[dict[str, Any]], array[int]]] = {}

    def tokens(self, tools: list[dict[str, Any]]) -> array[int]:
        hit = self._by_id.get(id(tools))
        if hit is not None and hit[0] is tools:
            return hit[1]
        ids = _text_tokens(render_tools(tools))
        if len(self._by_id) >= self.size:
            self._by_id.clear()  # cheap and rare; a conversation re-renders its tools once
        self._by_id[id(tools)] = (tools, ids)
        return ids


_TOOLS = _ToolsMemo()


class ChatPrompt(Sequence[int]):
    """A chat's prompt tokens: counted from cached per-part tokens, listed only when asked
    (a timing model that needs only the length never builds the list)."""

    __slots__ = ("_parts", "_len", "_ids")

    def __init__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> None:
        parts = [_TOOLS.tokens(tools)] if tools else []
        parts.extend(_text_tokens(render_message(m)) for m in messages)
        self._parts = parts
        self._len = sum(map(len, parts))
        self._ids: list[int] | None = None

    @property
    def ids(self) -> list[int]:
        if self._ids is None:
            self._ids = list(chain.from_iterable(self._parts))
        return self._ids

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        return self.ids[index]

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self._parts)
