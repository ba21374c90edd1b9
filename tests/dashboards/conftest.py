"""Fixtures of the dashboards tests. `store` comes from tests/conftest.py (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest
from dashboards_batches import KNOWN_CONFIG, known_samples, write_batch

from agentbatch.db.store import Store


@pytest.fixture
def known_batch():
    def make(store: Store, **kw: Any) -> int:
        scores = kw.pop("scores", (1.0, 0.0, 1.0, 1.0))
        return write_batch(store, known_samples(scores), config=KNOWN_CONFIG, workers=("w0", "w1"), **kw)
    return make
