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


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value).encode()
