"""The gateway's address and the name of the sample running now."""

from __future__ import annotations

import os

SAMPLE_HEADER = "X-Agentbatch-Sample"
BASE_URL_VAR = "AGENTBATCH_BASE_URL"
DEFAULT_ROOT = "http://127.0.0.1:8100"

# Samples that sent a request: inspect's sample uuid -> (gateway root URL, the gateway's sample id).
# The hook finishes exactly these when inspect finishes them.
started: dict[str, tuple[str, str]] = {}


def gateway_root(base_url: str | None = None) -> str:
    """The gateway's root URL (`http://host:port`) from `base_url` or AGENTBATCH_BASE_URL, with or
    without its `/v1`."""
    url = (base_url or os.environ.get(BASE_URL_VAR) or DEFAULT_ROOT).rstrip("/")
    return url.removesuffix("/v1")


def active_gateway_root() -> str:
    """The gateway of the model this sample uses (`agentbatch/<model>`), else `gateway_root()`."""
    from inspect_ai.model import get_model

    try:
        api = get_model().api
    except Exception:  # noqa: BLE001 - no active model: the environment decides
        return gateway_root()
    return getattr(api, "gateway", None) or gateway_root()


def current_sample_key() -> str | None:
    """`<task>/<sample id>/<epoch>` of the sample running in this task, None outside a sample. Two
    epochs of one sample are two samples on the gateway; the same sample in a later eval has the
    same id, so the gateway's history-aware policies and `report --compare` match them."""
    from inspect_ai.log._samples import sample_active

    active = sample_active()
    if active is None:
        return None
    return f"{active.task}/{active.sample.id}/{active.epoch}"[:200]


def note_started(root: str) -> str | None:
    """The current sample's key, remembered for the end-of-sample hook."""
    from inspect_ai.log._samples import sample_active

    key = current_sample_key()
    active = sample_active()
    if key is not None and active is not None:
        started.setdefault(active.sample_uuid, (root, key))
    return key
