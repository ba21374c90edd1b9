"""Secrets never stored or printed: API keys and passwords inside URLs.

- In a batch config, a field named like a secret (`api_key`, `password`, `token`, `secret`, ...) and
  the password of a URL are secrets. `to_stored(config)` returns the config as it is persisted: a
  secret already given as an environment reference (`${OPENAI_API_KEY}`) stays a reference; a
  literal secret becomes a reference to `AGENTBATCH_SECRET_<DOTTED_PATH>`, which this process sets
  (so the run itself works) and a later `resume` in another process must set.
  `from_stored(config)` resolves the references when the config is used, and says which variable
  is missing.
- `redact_text(text)` hides URL passwords, bearer tokens and every secret value this process has
  seen; `install_log_redaction()` applies it to every log record.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any

SECRET_KEY = re.compile(r"(^|_)(api_?key|password|passwd|secret|token|authorization|auth)$", re.IGNORECASE)
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)(?P<password>[^@\s/]+)(?P<at>@)")
BEARER = re.compile(r"(?P<head>Bearer\s+)(?P<token>[A-Za-z0-9._~+/\-=]{6,})")
MASK = "***"
REF_PREFIX = "AGENTBATCH_SECRET_"

_known: set[str] = set()
_lock = threading.Lock()


class MissingSecret(ValueError):
    """A stored secret reference whose environment variable is not set."""


def remember(value: str) -> None:
    """Mask this value wherever `redact_text` runs (log records included)."""
    if value and len(value) >= 4 and value != MASK and not ENV_REF.fullmatch(value):
        with _lock:
            _known.add(value)


def redact_text(text: str) -> str:
    """The text with URL passwords, bearer tokens and known secret values replaced by ***."""
    if not text:
        return text
    text = URL_PASSWORD.sub(lambda m: m["head"] + (m["password"] if ENV_REF.fullmatch(m["password"]) else MASK)
                            + m["at"], text)
    text = BEARER.sub(lambda m: m["head"] + MASK, text)
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, MASK)
    return text


def is_secret_key(key: str) -> bool:
    return bool(SECRET_KEY.search(key))


def _ref_name(path: str) -> str:
    return REF_PREFIX + re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_").upper()


def _walk(value: Any, path: str, leaf: Callable[[str, str, bool], str]) -> Any:
    """Apply `leaf(text, dotted path, is a secret field)` to every string of a JSON-like value."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            secret = is_secret_key(str(key)) and isinstance(item, str)
            out[key] = leaf(item, sub, True) if secret else _walk(item, sub, leaf)
        return out
    if isinstance(value, list):
        return [_walk(v, f"{path}.{i}", leaf) for i, v in enumerate(value)]
    if isinstance(value, str):
        return leaf(value, path, False)
    return value


def _store_leaf(value: str, path: str, secret_field: bool) -> str:
    if secret_field:
        if not value or ENV_REF.fullmatch(value):
            return value
        name = _ref_name(path)
        os.environ[name] = value  # this process runs the batch with it; the store keeps the name
        remember(value)
        return f"${{{name}}}"

    def url_password(m: re.Match[str]) -> str:
        if ENV_REF.fullmatch(m["password"]):
            return m[0]
        name = _ref_name(f"{path}.password")
        os.environ[name] = m["password"]
        # Not remembered as a bare value: URL_PASSWORD masks it inside URLs, and a password such as
        # the user or database name would otherwise mask every mention of that word.
        return f"{m['head']}${{{name}}}{m['at']}"

    return URL_PASSWORD.sub(url_password, value)


def to_stored(config: dict[str, Any]) -> dict[str, Any]:
    """The config as it may be persisted: every secret an environment reference (see module doc)."""
    stored: dict[str, Any] = _walk(config, "", _store_leaf)
    return stored


def _resolve_leaf(value: str, path: str, secret_field: bool) -> str:
    if not (secret_field or "${" in value):
        return value
    if not secret_field and not URL_PASSWORD.search(value):
        return value  # only secret fields and URL passwords hold references

    def env(m: re.Match[str]) -> str:
        name = m[1]
        if name not in os.environ:
            raise MissingSecret(f"{path}: the store keeps this secret as ${{{name}}}; set the environment "
                                f"variable {name}")
        if secret_field:  # URL passwords: see _store_leaf
            remember(os.environ[name])
        return os.environ[name]

    return ENV_REF.sub(env, value)


def from_stored(config: dict[str, Any]) -> dict[str, Any]:
    """The stored config with its secret references resolved from the environment (MissingSecret
    names the field and the variable when one is not set)."""
    resolved: dict[str, Any] = _walk(config, "", _resolve_leaf)
    return resolved


def redact_value(value: Any) -> Any:
    """A JSON-like value as it may be shown or kept where nothing resolves references: secret fields
    ***, URL passwords and known secrets hidden in every string."""
    return _walk(value, "", lambda text, _path, secret: MASK if secret and text else redact_text(text))


class _RedactingRecords:
    """A log record factory that hides secrets in each record's final message."""

    def __init__(self, inner: Callable[..., logging.LogRecord]) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: leave it to logging's own report
            return record
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return record


def install_log_redaction() -> None:
    """Hide secrets in every log record of this process, whatever logger or handler (idempotent)."""
    factory = logging.getLogRecordFactory()
    if not isinstance(factory, _RedactingRecords):
        logging.setLogRecordFactory(_RedactingRecords(factory))
