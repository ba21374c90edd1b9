"""JSON on the gateway's hot path: orjson (a tenth of the standard library's CPU on long
conversations), with the standard library for what orjson refuses (integers past 64 bits, keys that
are not strings), so every body the standard library takes is still taken."""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: bytes | str) -> Any:
    """Raises ValueError (json.JSONDecodeError) on a body that is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def loads_passable(data: bytes) -> tuple[Any, bool]:
    """`loads`, and whether keys can be appended to `data` as it is (`add_keys`): a non-empty object
    in strict UTF-8 JSON (what orjson takes without the fallback), `{` its first byte, `}` its last."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data), False
    return value, bool(value) and isinstance(value, dict) and data[:1] == b"{" and data[-1:] == b"}"


def add_keys(data: bytes, keys: dict[str, Any]) -> bytes:
    """The object `data` (passable: `loads_passable`) with `keys`, none of which it has, appended:
    its bytes copied once instead of the whole body serialised again."""
    if not keys:
        return data
    return b"".join((memoryview(data)[:-1], b",", dumps(keys)[1:]))


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value).encode()
