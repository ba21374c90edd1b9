"""One hardened sandbox against the real Docker engine: isolation in force, exec semantics, files,
labels and removal."""

from __future__ import annotations

import asyncio
import select
import socket
import threading

import pytest

from agentbatch.environments.docker_pool import (
    BATCH_LABEL,
    OWNER_LABEL,
    DockerPool,
    SandboxSettings,
    cleanup_containers,
    list_labelled,
)

pytestmark = pytest.mark.docker


def run(coro):
    return asyncio.run(coro)


async def _with_sandbox(label: str, body, **settings):
    pool = DockerPool(SandboxSettings(**settings), batch_label=label, max_containers=2, max_exec=2)
    try:
        sandbox = await pool.start("probe")
        try:
            return await body(pool, sandbox)
        finally:
            await pool.remove(sandbox)
    finally:
        await pool.aclose()


def test_isolation_is_in_force(batch_label: str) -> None:
    async def body(pool, sb):
        attrs = sb.container.attrs["HostConfig"]
        out = {"attrs": attrs}
        for key, cmd in {
            "uid": "id -u",
            "ifaces": "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
            "connect": "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\"",
            "root_write": "touch /usr/x",
            "work_write": "touch /work/x && echo ok",
            "caps": "grep CapEff /proc/self/status",
            "mem": "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max",
            "pids": "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max",
            "fork_bomb": "for i in $(seq 1 200); do sleep 1 & done; wait",
        }.items():
            out[key] = await pool.exec(sb, cmd, timeout_s=20)
        return out

    out = run(_with_sandbox(batch_label, body, memory="256m", pids_limit=64, cpus=0.5))
    attrs = out["attrs"]
    assert attrs["NetworkMode"] == "none"
    assert attrs["CapDrop"] == ["ALL"] and not attrs.get("CapAdd")
    assert attrs["ReadonlyRootfs"] is True
    assert attrs["Memory"] == 256 * 2**20 and attrs["PidsLimit"] == 64 and attrs["NanoCpus"] == 500_000_000
    assert "no-new-privileges" in attrs["SecurityOpt"]
    assert out["uid"].stdout.strip() != "0" and out["uid"].stdout.strip() == "1000"
    assert out["ifaces"].stdout.split() == ["lo"]  # no interface but loopback
    assert out["connect"].exit_code != 0 and "OSError" in out["connect"].stderr + out["connect"].stdout
    assert out["root_write"].exit_code != 0 and "Read-only file system" in out["root_write"].stderr
    assert out["work_write"].ok and out["work_write"].stdout.strip() == "ok"
    assert out["caps"].stdout.split()[-1] == "0000000000000000"
    assert int(out["mem"].stdout.strip()) == 256 * 2**20
    assert out["pids"].stdout.strip() == "64"
    assert "Resource temporarily unavailable" in out["fork_bomb"].stderr  # the pids limit bites


def test_network_only_when_asked(batch_label: str) -> None:
    async def body(pool, sb):
        res = await pool.exec(sb, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        return sb.container.attrs["HostConfig"]["NetworkMode"], res.stdout.split()

    mode, ifaces = run(_with_sandbox(batch_label, body, network=True))
    assert mode == "bridge" and "eth0" in ifaces


def test_exec_results_files_and_timeouts(batch_label: str) -> None:
    async def body(pool, sb):
        await pool.put_files(sb, {"repo/a.txt": "hello\n", "repo/sub/b.bin": b"\x00\x01"})
        return {
            "ls": await pool.exec(sb, "stat -c '%U %n' repo repo/a.txt repo/sub/b.bin"),
            "mixed": await pool.exec(sb, "echo out; echo err >&2; exit 3"),
            "slow": await pool.exec(sb, "sleep 30", timeout_s=1),
            "edit": await pool.exec(sb, "echo changed > repo/a.txt"),
            "a": await pool.read_file(sb, "/work/repo/a.txt"),
            "b": await pool.read_file(sb, "/work/repo/sub/b.bin"),
        }

    out = run(_with_sandbox(batch_label, body))
    assert out["ls"].stdout.split("\n")[:3] == ["agent repo", "agent repo/a.txt", "agent repo/sub/b.bin"]
    mixed = out["mixed"]
    assert (mixed.exit_code, mixed.stdout, mixed.stderr) == (3, "out\n", "err\n") and not mixed.ok
    assert out["slow"].timed_out and out["slow"].exit_code == 124 and out["slow"].duration_s < 25
    assert out["edit"].ok and out["a"] == b"changed\n" and out["b"] == b"\x00\x01"


def test_tmpfs_workdir_receives_files(batch_label: str) -> None:
    async def body(pool, sb):
        await pool.put_files(sb, {"repo/x.py": "print('hi')\n"})
        return await pool.exec(sb, "cd repo && python3 x.py && mount | grep ' /work '")

    res = run(_with_sandbox(batch_label, body, workdir_mount="tmpfs"))
    assert res.ok and res.stdout.startswith("hi\n") and "tmpfs" in res.stdout


def test_labels_and_cleanup_of_leftovers(docker_client, batch_label: str) -> None:
    async def leave_two():
        pool = DockerPool(batch_label=batch_label)
        await pool.start("a")
        await pool.start("b")
        for host in pool.hosts():  # a crashed run: the pool object is gone, its containers are not
            host.client.close()
        pool._executor.shutdown(wait=False)

    run(leave_two())
    left = list_labelled(docker_client, batch_label)
    assert len(left) == 2
    assert all(c["Labels"][OWNER_LABEL] == "agentbatch" and c["Labels"][BATCH_LABEL] == batch_label for c in left)
    assert cleanup_containers(batch_label) == 2
    assert list_labelled(docker_client, batch_label) == []


def test_removal_frees_the_slot_and_the_volume(docker_client, batch_label: str) -> None:
    async def body():
        pool = DockerPool(batch_label=batch_label, max_containers=1)
        try:
            first = await pool.start("one")
            volumes = [m["Name"] for m in first.container.attrs["Mounts"] if m["Type"] == "volume"]
            waiter = asyncio.create_task(pool.start("two"))
            await asyncio.sleep(0.5)
            blocked = not waiter.done()  # only one live container allowed
            await pool.remove(first)
            second = await asyncio.wait_for(waiter, 60)
            await pool.remove(second)
            return volumes, blocked, pool.stats()
        finally:
            await pool.aclose()

    volumes, blocked, stats = run(body())
    assert blocked and stats["containers"]["peak"] == 1 and stats["containers"]["created"] == 2
    assert len(volumes) == 1
    assert not [v for v in docker_client.volumes.list() if v.name in volumes]  # removed with the container


class TcpToUnixProxy:
    """127.0.0.1:<port> -> the local engine's unix socket: a second "remote" Docker host over TCP.
    `coalesce_s`: the engine's answers are held that long and sent on in one piece (as a busy network
    delivers a response's headers and its first data together)."""

    def __init__(self, socket_path: str = "/var/run/docker.sock", coalesce_s: float = 0.0) -> None:
        self.socket_path = socket_path
        self.coalesce_s = coalesce_s
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.socket_path)
            self.conns += [client, upstream]
            for a, b, hold in ((client, upstream, 0.0), (upstream, client, self.coalesce_s)):
                threading.Thread(target=self._pipe, args=(a, b, hold), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, hold_s: float) -> None:
        try:
            while data := src.recv(65536):
                while hold_s and select.select([src], [], [], hold_s)[0] and (more := src.recv(65536)):
                    data += more
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        self.server.close()
        for c in self.conns:
            c.close()


def test_least_loaded_placement_over_several_hosts(batch_label: str) -> None:
    """Two hosts, the local engine and the same engine reached over TCP like a remote DOCKER_HOST:
    new sandboxes go to the host with fewer live ones, and commands run on either."""
    proxy = TcpToUnixProxy()

    async def body():
        pool = DockerPool(batch_label=batch_label, hosts=[None, f"tcp://127.0.0.1:{proxy.port}"])
        try:
            boxes = [await pool.start(f"h{i}") for i in range(4)]
            outputs = [(await pool.exec(b, "echo on $(hostname)")).stdout for b in boxes]
            spread = {h: s["live"] for h, s in pool.stats()["hosts"].items()}
            await pool.remove(boxes[0])
            await pool.remove(boxes[2])  # both on the first host
            again = await pool.start("h4")
            return spread, boxes, outputs, again
        finally:
            await pool.aclose()

    try:
        spread, boxes, outputs, again = run(body())
    finally:
        proxy.close()
    assert sorted(spread.values()) == [2, 2] and f"tcp://127.0.0.1:{proxy.port}" in spread
    assert boxes[0].host.name != boxes[1].host.name  # alternated
    assert all(o.startswith("on ") for o in outputs) and proxy.accepted > 0
    assert again.host.name == boxes[0].host.name  # the host that had fewer live containers


def test_output_that_arrives_with_the_response_headers_is_kept(batch_label: str) -> None:
    """A TCP host whose answers come in one piece: the exec's output frames arrive in the same read
    as the HTTP headers, and must still reach the caller (docker-py's exec_start lost them: an exec
    that printed looked like one that printed nothing)."""
    proxy = TcpToUnixProxy(coalesce_s=0.1)

    async def body():
        pool = DockerPool(batch_label=batch_label, hosts=[f"tcp://127.0.0.1:{proxy.port}"])
        try:
            box = await pool.start("c0")
            return [await pool.exec(box, f"echo out {i}; echo err {i} >&2") for i in range(3)]
        finally:
            await pool.aclose()

    try:
        results = run(body())
    finally:
        proxy.close()
    assert [(r.exit_code, r.stdout, r.stderr) for r in results] == [(0, f"out {i}\n", f"err {i}\n") for i in range(3)]


def test_cli_lists_and_cleans_up(docker_client, batch_label: str, capsys) -> None:
    from agentbatch.flows.cli import main

    async def leave_one():
        pool = DockerPool(batch_label=batch_label)
        await pool.start("cli")
        pool._executor.shutdown(wait=False)

    run(leave_one())
    assert main(["sandbox", "ls", "--batch", batch_label]) == 0
    out = capsys.readouterr().out
    assert f"batch={batch_label}" in out and "sample=cli" in out and "running" in out
    assert main(["sandbox", "cleanup", "--batch", batch_label]) == 0
    assert "removed 1 container" in capsys.readouterr().out
    assert list_labelled(docker_client, batch_label) == []
