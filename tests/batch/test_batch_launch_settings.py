"""A script that runs several batches points Prefect's settings at the chosen API once, not once per
batch; settings changed in between are pointed at it again."""

from __future__ import annotations

from prefect.settings import PREFECT_LOGGING_LEVEL, get_current_settings, temporary_settings

from agentbatch.flows.launch import _prefect_api
from agentbatch.flows.prefect_server import PrefectApi


def test_settings_pointed_at_the_api_are_built_once_per_settings() -> None:
    api = PrefectApi(url="http://127.0.0.1:9/api", source="started")
    before = get_current_settings()
    with _prefect_api(api):
        first = get_current_settings()
    with _prefect_api(api):
        again = get_current_settings()
    assert str(first.api.url) == api.url and again is first
    assert get_current_settings() is before  # outside, the process's own settings
    with temporary_settings(updates={PREFECT_LOGGING_LEVEL: "ERROR"}), _prefect_api(api):
        changed = get_current_settings()
    assert changed is not first and changed.logging.level == "ERROR" and str(changed.api.url) == api.url
