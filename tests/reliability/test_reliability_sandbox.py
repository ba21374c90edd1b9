"""Finding 6 (sandboxes): /tmp is noexec,nosuid; the work directory is bounded in size; ulimits are set;
packed file names are normalised and refused outside the work directory. Against the real Docker engine."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from agentbatch.environments.docker_pool import (
    DEFAULT_IMAGE,
    DockerPool,
    SandboxSettings,
    member_name,
    remove_labelled,
)

pytestmark = pytest.mark.docker


@pytest.fixture
def batch_label() -> Iterator[str]:
    import docker

    try:
        client = docker.from_env(timeout=10)
        client.ping()
        client.images.get(DEFAULT_IMAGE)
        client.close()
    except Exception as exc:  # noqa: BLE001 - no engine or no image (CI=true turns this skip into a failure)
        pytest.skip(f"no Docker engine with {DEFAULT_IMAGE} ({exc.__class__.__name__}); run .ci/setup_docker.sh")
    label = f"test-{uuid.uuid4().hex[:10]}"
    yield label
    client = docker.from_env(timeout=30)
    remove_labelled(client, label)
    client.close()


def test_member_names_are_normalised_and_confined() -> None:
    assert member_name("a/./b/../c.txt") == "a/c.txt"
    assert member_name("dir//f") == "dir/f"
    for bad in ("../escape", "a/../../escape", "/etc/passwd", "..", ".", "", "a\0b"):
        with pytest.raises(ValueError, match="outside the sandbox's work directory"):
            member_name(bad)


async def _probe(label: str) -> dict[str, object]:
    pool = DockerPool(SandboxSettings(workdir_size="8m", tmp_size="8m"), batch_label=label, max_containers=1,
                      max_exec=1)
    try:
        sandbox = await pool.start("hardening")
        try:
            out: dict[str, object] = {}
            await pool.put_files(sandbox, {"sub/./hello.sh": "echo hi\n"})
            out["packed"] = (await pool.exec(sandbox, "cat sub/hello.sh")).stdout
            with pytest.raises(ValueError):
                await pool.put_files(sandbox, {"../outside.txt": "x"})
            out["outside"] = (await pool.exec(sandbox, "ls / ; ls /work")).stdout
            out["tmp_exec"] = await pool.exec(sandbox, "printf '#!/bin/sh\\necho ran\\n' > /tmp/x.sh && "
                                                       "chmod +x /tmp/x.sh && /tmp/x.sh")
            out["mounts"] = (await pool.exec(sandbox, "grep -E ' /tmp | /work ' /proc/mounts")).stdout
            out["fill"] = await pool.exec(sandbox, "dd if=/dev/zero of=/work/big bs=1M count=32 2>&1; echo rc=$?")
            out["nofile"] = (await pool.exec(sandbox, "ulimit -n")).stdout.strip()
            out["core"] = (await pool.exec(sandbox, "ulimit -c")).stdout.strip()
            return out
        finally:
            await pool.remove(sandbox)
    finally:
        await pool.aclose()


def test_sandbox_limits_in_force(batch_label: str) -> None:
    out = asyncio.run(_probe(batch_label))
    assert out["packed"] == "echo hi\n"
    assert "outside.txt" not in str(out["outside"])
    tmp_exec = out["tmp_exec"]
    assert tmp_exec.exit_code != 0 and "ran" not in tmp_exec.stdout  # noexec: not executed
    mounts = str(out["mounts"])
    tmp_line = next(line for line in mounts.splitlines() if " /tmp " in line)
    assert "noexec" in tmp_line and "nosuid" in tmp_line
    work_line = next(line for line in mounts.splitlines() if " /work " in line)
    assert "size=8192k" in work_line or "size=8m" in work_line, work_line
    assert "No space left" in out["fill"].stdout or "File too large" in out["fill"].stdout, out["fill"].stdout
    assert out["nofile"] == "1024" and out["core"] == "0"
