"""Fixtures of the sandbox tests: a real Docker engine with the project's image, or a clean skip."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from agentbatch.environments.docker_pool import DEFAULT_IMAGE, list_labelled, remove_labelled

IMAGE = os.environ.get("AGENTBATCH_SANDBOX_IMAGE", DEFAULT_IMAGE)


def _docker_or_reason():
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - no engine, no socket, no permission: skip
        return None, f"no Docker engine ({exc.__class__.__name__}: {exc}); run .ci/setup_docker.sh"
    try:
        client.images.get(IMAGE)
    except Exception:  # noqa: BLE001
        client.close()
        return None, f"image {IMAGE} missing; run .ci/setup_docker.sh"
    return client, None


@pytest.fixture(scope="session")
def docker_client():
    client, reason = _docker_or_reason()
    if reason:
        pytest.skip(reason)
    yield client
    client.close()


@pytest.fixture
def batch_label(docker_client) -> Iterator[str]:
    """A fresh batch label; the test must leave no container with it (checked here too)."""
    label = f"test-{uuid.uuid4().hex[:10]}"
    yield label
    left = list_labelled(docker_client, label)
    remove_labelled(docker_client, label)
    assert not left, f"containers left behind: {[c['Names'] for c in left]}"
