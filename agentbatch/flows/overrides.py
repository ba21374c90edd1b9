"""`--param KEY=VALUE` overrides of a batch config (dotted fields, validated with the config schema)
and the check that keeps secrets out of what a deployment stores. No Prefect import: `deploy`
validates its input before it picks a Prefect server."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from agentbatch.flows.config import BatchConfig

TAG_KEY = "tag"  # `--param tag=...`: the run's checkpoint/model tag, not a config field


class OverrideError(ValueError):
    """A `--param key=value` that cannot be applied; the message names it."""


def parse_value(text: str) -> Any:
    """JSON when the text is JSON (numbers, true/false/null, lists, objects), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _set_path(node: Any, parts: list[str], value: Any, item: str) -> None:
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, dict):
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
        elif isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise OverrideError(f"--param {item}: {'.'.join(parts[:i + 1])}: expected a list index below "
                                    f"{len(node)}")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        else:
            raise OverrideError(f"--param {item}: {'.'.join(parts[:i])} is a {type(node).__name__}, not a "
                                "mapping or list")


def apply_overrides(config: BatchConfig, items: list[str]) -> tuple[BatchConfig, str | None]:
    """Set dotted config fields ("engine.params.endpoints.0.model=ckpt-12") and validate the result
    with the config schema; `tag=...` is returned apart. Raises OverrideError naming the item."""
    data = config.model_dump(mode="json")
    tag = None
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not p for p in key.split(".")):
            raise OverrideError(f"--param {item!r}: expected KEY=VALUE with a dotted KEY, e.g. "
                                "engine.params.endpoints.0.model=my-checkpoint")
        if key == TAG_KEY:
            tag = raw
            continue
        _set_path(data, key.split("."), parse_value(raw), item)
    try:
        return BatchConfig.model_validate(data), tag
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
                             for e in exc.errors())
        raise OverrideError(f"--param: the config with these overrides is invalid: {problems}") from exc


def find_secrets(node: Any) -> list[str]:
    """Dotted paths of secrets given as values (a `${VAR}` reference is not one): `protocols/secrets.py`."""
    from agentbatch.protocols.secrets import literal_secrets

    return literal_secrets(node)


def override_secrets(items: list[str]) -> list[str]:
    """The `--param KEY=VALUE` items whose value is a secret: a secret-named KEY, or a URL with a password."""
    from agentbatch.protocols.secrets import literal_secrets

    found = []
    for item in items:
        key, _, raw = item.partition("=")
        parts = key.strip().split(".")
        if literal_secrets({parts[-1]: raw}):
            found.append(key.strip())
    return found
