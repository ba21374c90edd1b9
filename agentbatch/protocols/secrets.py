"""Secrets never stored or printed: API keys and passwords inside URLs.

- One rule says what a secret is, wherever it arrives (a config file, a `--param` override, a
  Python API argument, a store URL): a field named like a secret (`api_key`, `password`, `token`,
  `secret`, ...), the password of a URL (`scheme://user:PASSWORD@host`) and a secret-named query
  parameter of a URL (`?password=...`, `&api_key=...`). `${VAR}` references are never secrets. `to_stored(config)` returns the config as it is persisted: a
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
# `?password=...` / `&api_key=...` in a URL (libpq and SQLAlchemy accept a password there)
URL_QUERY_SECRET = re.compile(r"(?P<head>[?&](?P<key>password|passwd|pwd|api_?key|token|secret|auth)=)"
                              r"(?P<password>[^&#\s'\"]+)", re.IGNORECASE)
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
    text = URL_QUERY_SECRET.sub(lambda m: m["head"] + (m["password"] if ENV_REF.fullmatch(m["password"])
                                                       else MASK), text)
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

    def reference(m: re.Match[str], field: str) -> str:
        """The URL with the matched password (userinfo or query) replaced by a reference."""
        if ENV_REF.fullmatch(m["password"]):
            return m[0]
        name = _ref_name(f"{path}.{field}")
        os.environ[name] = m["password"]
        # Not remembered as a bare value: the URL patterns mask it inside URLs, and a password such as
        # the user or database name would otherwise mask every mention of that word.
        return m[0][: m.start("password") - m.start()] + f"${{{name}}}" + m[0][m.end("password") - m.start():]

    stored = URL_PASSWORD.sub(lambda m: reference(m, "password"), value)
    query = "query_" if stored != value else ""  # both a userinfo and a query password: two variables
    return URL_QUERY_SECRET.sub(lambda m: reference(m, query + m["key"]), stored)


def to_stored(config: dict[str, Any]) -> dict[str, Any]:
    """The config as it may be persisted: every secret an environment reference (see module doc)."""
    stored: dict[str, Any] = _walk(config, "", _store_leaf)
    return stored


def _resolve_leaf(value: str, path: str, secret_field: bool) -> str:
    if not (secret_field or "${" in value):
        return value
    if not secret_field and not (URL_PASSWORD.search(value) or URL_QUERY_SECRET.search(value)):
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


def has_literal_secret(text: str) -> bool:
    """A URL password or secret query parameter given as a value, not as a `${VAR}` reference."""
    return any(not ENV_REF.fullmatch(m["password"])
               for pattern in (URL_PASSWORD, URL_QUERY_SECRET) for m in pattern.finditer(text))


def literal_secrets(value: Any) -> list[str]:
    """Dotted paths of the secrets given as values, not as `${VAR}` references (see module doc)."""
    found: list[str] = []

    def leaf(text: str, path: str, secret_field: bool) -> str:
        if (secret_field and text and not ENV_REF.fullmatch(text)) or (not secret_field and has_literal_secret(text)):
            found.append(path)
        return text

    _walk(value, "", leaf)
    return found


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
