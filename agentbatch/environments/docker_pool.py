"""A pool of hardened Docker sandboxes with capacity limits, spread over one or more Docker hosts.

Two separate limits, as the coordination policies assume: live containers (a sample holds one from
its reset to its end) and concurrent executions (commands and file transfers running at once). The
docker SDK is blocking, so its calls run on the pool's own thread pool (sized to the limits, not the
small default executor). Every container carries the labels `agentbatch.owner=agentbatch` and
`agentbatch.batch=<label>`, so `cleanup_containers` finds leftovers of a batch, even one that crashed.

Docker API errors, a dead container and a host-side timeout raise `EnvironmentFailure` (retried by
the flow); a command's non-zero exit code or its own timeout is a result, not an error.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import posixpath
import re
import shlex
import struct
import tarfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions
from docker.types import DriverConfig, Mount, Ulimit

from agentbatch.environments.capacity import CapacityLimiter
from agentbatch.protocols.environment import EnvironmentFailure

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "agentbatch-sandbox:1"  # built by .ci/setup_docker.sh
OWNER_LABEL = "agentbatch.owner"
BATCH_LABEL = "agentbatch.batch"
SAMPLE_LABEL = "agentbatch.sample"
TIMEOUT_EXIT = 124  # coreutils/busybox `timeout` exit status
KILLED_EXITS = (None, -1, 137, 143)  # killed: by `timeout -k`, or with the container


@dataclass(frozen=True)
class _ExecOutcome:
    """What the engine reports of one exec. `started` is false when the runtime never started its
    process (exec Pid 0: e.g. the container was being killed, or an unknown user); the engine then
    reports exit status 126, which must not reach the model as the command's own."""

    exit_code: int | None
    out: bytes
    err: bytes
    started: bool

T = TypeVar("T")


class SandboxDied(EnvironmentFailure):
    """The sample's container is gone or stopped (killed, OOM, daemon restart)."""


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    """How each container is made. The defaults are the hardened ones."""

    image: str = DEFAULT_IMAGE
    user: str = "1000:1000"  # non-root; numeric so images without the user still work
    network: bool = False  # False: network mode "none" (only lo)
    network_mode: str | None = None  # explicit mode (e.g. a user network) when network=True
    memory: str = "512m"
    cpus: float = 1.0
    pids_limit: int = 256
    read_only: bool = True  # read-only root; the work dir and /tmp stay writable
    workdir: str = "/work"
    workdir_mount: str = "volume"  # "volume" (anonymous, removed with the container) or "tmpfs"
    workdir_size: str = "256m"  # the work dir's size limit (volume and tmpfs alike)
    tmp_size: str = "64m"  # /tmp: tmpfs, noexec
    # Per-process limits (setrlimit): open files, largest file written (bytes), no core dumps.
    ulimits: Mapping[str, int] = field(default_factory=lambda: {"nofile": 1024, "fsize": 256 << 20, "core": 0})
    command: tuple[str, ...] = ("sleep", "infinity")  # keeps the container alive between steps
    shell: tuple[str, ...] = ("bash", "-c")  # ("sh", "-c") for busybox images
    environment: Mapping[str, str] = field(default_factory=dict)
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    init: bool = True  # docker-init as PID 1: reaps zombies, exits on SIGTERM
    max_output_bytes: int = 16_384  # per stream, for observations

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SandboxSettings:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(params) - known
        if unknown:
            raise ValueError(f"unknown sandbox settings {sorted(unknown)}; expected some of {sorted(known)}")
        values = dict(params)
        for key in ("command", "shell"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)

    def uid_gid(self) -> tuple[int, int]:
        uid, _, gid = self.user.partition(":")
        return (int(uid), int(gid or uid)) if uid.isdigit() else (0, 0)


@dataclass(slots=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False  # the command hit its own timeout (exit status 124)
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(slots=True)
class DockerHost:
    """One Docker engine the pool places containers on."""

    name: str
    client: docker.DockerClient
    live: int = 0  # containers of this pool on it now
    created: int = 0


@dataclass(slots=True)
class Sandbox:
    """One live container, owned by one sample."""

    id: str
    name: str
    host: DockerHost
    container: Any  # docker.models.containers.Container
    sample_key: str
    created_at: float
    removed: bool = False


def docker_client(base_url: str | None, timeout: float, pool_size: int) -> docker.DockerClient:
    if base_url is None:  # DOCKER_HOST / DOCKER_TLS_VERIFY / DOCKER_CERT_PATH, else the local socket
        return docker.from_env(timeout=int(timeout), max_pool_size=pool_size)
    return docker.DockerClient(base_url=base_url, timeout=int(timeout), max_pool_size=pool_size)


_DOCKER_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


def _safe_name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-.")[:60] or "x"


class DockerPool:
    """Creates, runs commands in and removes sandboxes, within the two capacity limits.

    hosts: Docker base URLs (`unix:///var/run/docker.sock`, `tcp://host:2376`, `ssh://...`); `None`
      in the list means the environment's DOCKER_HOST or the local engine. New containers go to the
      host with the fewest live containers of this pool.
    max_containers / max_exec: the two limits (`None`: unlimited).
    batch_label: value of the `agentbatch.batch` label on every container (default: a fresh id).
    """

    def __init__(
        self,
        settings: SandboxSettings | None = None,
        *,
        hosts: Sequence[str | None] = (None,),
        max_containers: int | None = None,
        max_exec: int | None = None,
        batch_label: str | None = None,
        api_timeout_s: float = 120.0,
        threads: int | None = None,
    ) -> None:
        self.settings = settings or SandboxSettings()
        self.batch_label = batch_label or uuid.uuid4().hex[:12]
        self.containers = CapacityLimiter(max_containers, "containers")
        self.execs = CapacityLimiter(max_exec, "exec")
        self.api_timeout_s = api_timeout_s
        n_threads = threads or min(256, 2 * ((max_containers or 32) + (max_exec or 32)) + 4)
        self._executor = ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix="agentbatch-docker")
        self._host_urls = list(hosts) or [None]
        self._hosts: list[DockerHost] | None = None
        self._pool_size = n_threads
        self._seq = itertools.count()
        self._live: dict[str, Sandbox] = {}
        self.replacements = 0  # dead containers detected (counted by the environments)

    # ----------------------------------------------------------------------------- plumbing

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def hosts(self) -> list[DockerHost]:
        if self._hosts is None:
            hosts = []
            for i, url in enumerate(self._host_urls):
                try:
                    client = docker_client(url, self.api_timeout_s, self._pool_size)
                except _DOCKER_ERRORS as exc:
                    raise EnvironmentFailure(f"cannot reach Docker host {url or 'default'}: {exc}") from exc
                hosts.append(DockerHost(name=url or f"default-{i}", client=client))
            self._hosts = hosts
        return self._hosts

    def _pick_host(self) -> DockerHost:
        # Least-loaded placement; ties go to the host that has had fewer containers so far.
        return min(self.hosts(), key=lambda h: (h.live, h.created))

    def labels(self, sample_key: str) -> dict[str, str]:
        return {
            OWNER_LABEL: "agentbatch",
            BATCH_LABEL: self.batch_label,
            SAMPLE_LABEL: sample_key[:200],
            **self.settings.extra_labels,
        }

    def create_kwargs(self, sample_key: str, name: str) -> dict[str, Any]:
        """The `containers.create` arguments: the hardening lives here."""
        s = self.settings
        mounts = []
        tmpfs = {"/tmp": f"rw,noexec,nosuid,nodev,size={s.tmp_size}"}
        uid, gid = s.uid_gid()
        if s.workdir_mount == "volume":
            # An anonymous volume of the local driver backed by a sized tmpfs: bounded, unlike a plain
            # volume on the host's disk, and reachable by the archive API (put_files), unlike --tmpfs.
            bounded = DriverConfig("local", {"type": "tmpfs", "device": "tmpfs",
                                             "o": f"size={s.workdir_size},uid={uid},gid={gid},mode=0755,nosuid,nodev"})
            mounts.append(Mount(target=s.workdir, source=None, type="volume", driver_config=bounded))
        elif s.workdir_mount == "tmpfs":
            tmpfs[s.workdir] = f"rw,nosuid,nodev,size={s.workdir_size},uid={uid},gid={gid},mode=0755"
        else:
            raise ValueError(f"workdir_mount must be 'volume' or 'tmpfs', got {s.workdir_mount!r}")
        if s.network:
            network_mode = s.network_mode or "bridge"
        else:
            network_mode = "none"
        return dict(
            image=s.image,
            command=list(s.command),
            name=name,
            labels=self.labels(sample_key),
            user=s.user,
            working_dir=s.workdir,
            environment=dict(s.environment),
            network_mode=network_mode,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            mem_limit=s.memory,
            memswap_limit=s.memory,  # no swap beyond the memory limit
            nano_cpus=int(s.cpus * 1e9),
            pids_limit=s.pids_limit,
            ulimits=[Ulimit(name=k, soft=v, hard=v) for k, v in s.ulimits.items()],
            read_only=s.read_only,
            tmpfs=tmpfs,
            mounts=mounts,
            init=s.init,
            detach=True,
        )

    # ----------------------------------------------------------------------------- lifecycle

    async def start(self, sample_key: str) -> Sandbox:
        """Wait for a container slot, then create and start a container for the sample."""
        await self.containers.acquire()
        try:
            return await self._place(sample_key)
        except BaseException:
            self.containers.release()
            raise

    async def _place(self, sample_key: str) -> Sandbox:
        """Create and start a container on the least-loaded host; the caller holds a container slot."""
        host = self._pick_host()
        host.live += 1
        host.created += 1
        name = f"agentbatch-{_safe_name(self.batch_label)}-{_safe_name(sample_key)}-{next(self._seq)}"
        try:
            container = await self._call(self._create_and_start, host, sample_key, name)
        except BaseException:
            host.live -= 1
            raise
        sandbox = Sandbox(container.id, name, host, container, sample_key, time.monotonic())
        self._live[sandbox.id] = sandbox
        return sandbox

    def _create_and_start(self, host: DockerHost, sample_key: str, name: str) -> Any:
        container = None
        try:
            container = host.client.containers.create(**self.create_kwargs(sample_key, name))
            container.start()
            return container
        except _DOCKER_ERRORS as exc:
            if container is not None:
                _force_remove(container)
            raise EnvironmentFailure(f"cannot start a sandbox on {host.name}: {exc}") from exc

    async def remove(self, sandbox: Sandbox) -> None:
        """Remove the container (and its work-dir volume) and free its slot. Idempotent."""
        if sandbox.removed:
            return
        sandbox.removed = True
        self._live.pop(sandbox.id, None)
        try:
            await self._call(_force_remove, sandbox.container)
        finally:
            sandbox.host.live -= 1
            self.containers.release()

    async def replace(self, sandbox: Sandbox) -> Sandbox:
        """Remove a (dead) sandbox and start a fresh one for the same sample, keeping its slot."""
        self.replacements += 1
        sandbox.removed = True
        self._live.pop(sandbox.id, None)
        try:
            await self._call(_force_remove, sandbox.container)
        except EnvironmentFailure as exc:  # a host that cannot even remove: leave it for cleanup()
            log.warning("replacing %s: %s", sandbox.name, exc)
        sandbox.host.live -= 1
        try:
            return await self._place(sandbox.sample_key)
        except BaseException:
            self.containers.release()
            raise

    async def alive(self, sandbox: Sandbox) -> bool:
        try:
            await self._call(sandbox.container.reload)
        except docker.errors.NotFound:
            return False
        except _DOCKER_ERRORS as exc:
            raise EnvironmentFailure(f"cannot inspect sandbox {sandbox.name}: {exc}") from exc
        return sandbox.container.status == "running"

    async def _check_alive(self, sandbox: Sandbox, doing: str, cause: BaseException | None = None) -> None:
        if not await self.alive(sandbox):
            raise SandboxDied(
                f"sandbox {sandbox.name} is gone (status {getattr(sandbox.container, 'status', '?')}) "
                f"while {doing}"
            ) from cause

    # ----------------------------------------------------------------------------- actions

    async def exec(
        self,
        sandbox: Sandbox,
        command: str,
        *,
        timeout_s: float = 60.0,
        workdir: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run a shell command in the sandbox, within the exec limit.

        The command gets `timeout_s` inside the container (exit status 124 -> `timed_out`); the host
        waits a little longer and raises `EnvironmentFailure` if even that passes (a hung engine).
        """
        shell = list(self.settings.shell)
        argv = ["timeout", "-k", "2", f"{timeout_s:g}", *shell, command]
        async with self.execs.slot():
            started = time.monotonic()
            try:
                outcome = await asyncio.wait_for(
                    self._call(self._exec_blocking, sandbox, argv, workdir, user),
                    timeout=timeout_s + 15.0,
                )
            except TimeoutError as exc:
                raise EnvironmentFailure(f"sandbox {sandbox.name}: no answer {timeout_s + 15:g} s into {command!r}") from exc
            except docker.errors.NotFound as exc:
                raise SandboxDied(f"sandbox {sandbox.name} is gone (running {command!r})") from exc
            except _DOCKER_ERRORS as exc:
                await self._check_alive(sandbox, f"running {command!r}", exc)
                raise EnvironmentFailure(f"sandbox {sandbox.name}: exec failed: {exc}") from exc
            duration = time.monotonic() - started
        exit_code, out, err = outcome.exit_code, outcome.out, outcome.err
        if not outcome.started:
            await self._check_alive(sandbox, f"starting {command!r}")
            raise EnvironmentFailure(f"sandbox {sandbox.name}: the engine could not start {command!r} "
                                     f"(exit status {exit_code}) {(out + err).decode(errors='replace').strip()[:300]}")
        if exit_code in KILLED_EXITS:
            # The engine may report the exec's end a moment before the container's: look a few times.
            for _ in range(5):
                await self._check_alive(sandbox, f"running {command!r}")
                await asyncio.sleep(0.2)
        limit = self.settings.max_output_bytes
        truncated = len(out) > limit or len(err) > limit
        return ExecResult(
            exit_code=-1 if exit_code is None else int(exit_code),
            stdout=out[:limit].decode(errors="replace"),
            stderr=err[:limit].decode(errors="replace"),
            duration_s=duration,
            timed_out=exit_code == TIMEOUT_EXIT,
            truncated=truncated,
        )

    def _exec_blocking(self, sandbox: Sandbox, argv: list[str], workdir: str | None, user: str | None) -> _ExecOutcome:
        # The low-level calls of `exec_run`, keeping the exec's inspection (its Pid says if it started).
        api = sandbox.host.client.api
        exec_id = api.exec_create(
            sandbox.id, argv, workdir=workdir or self.settings.workdir, user=user or self.settings.user
        )["Id"]
        out, err = exec_output(api, exec_id)
        info = api.exec_inspect(exec_id)
        return _ExecOutcome(info.get("ExitCode"), out, err, bool(info.get("Pid")))

    async def put_files(self, sandbox: Sandbox, files: Mapping[str, str | bytes], dest: str | None = None) -> None:
        """Write files (relative path -> content) under `dest` (default: the work dir), owned by the user."""
        dest = dest or self.settings.workdir
        data = _tar_of(files, *self.settings.uid_gid())
        async with self.execs.slot():
            if self.settings.workdir_mount == "tmpfs" and dest.startswith(self.settings.workdir):
                # The engine's archive API writes beneath a tmpfs mount, not into it: go through a shell.
                await self._put_via_shell(sandbox, data, dest)
                return
            try:
                ok = await self._call(sandbox.container.put_archive, dest, data)
            except docker.errors.NotFound as exc:
                await self._check_alive(sandbox, f"writing files to {dest}", exc)
                raise EnvironmentFailure(f"sandbox {sandbox.name}: no directory {dest}") from exc
            except _DOCKER_ERRORS as exc:
                await self._check_alive(sandbox, f"writing files to {dest}", exc)
                raise EnvironmentFailure(f"sandbox {sandbox.name}: put_archive failed: {exc}") from exc
            if not ok:
                raise EnvironmentFailure(f"sandbox {sandbox.name}: put_archive to {dest} refused")

    async def _put_via_shell(self, sandbox: Sandbox, data: bytes, dest: str) -> None:
        import base64

        encoded = base64.b64encode(data).decode()
        chunk = 96_000  # below the kernel's 128 KiB limit on one argument
        target = f"/tmp/.agentbatch-put-{uuid.uuid4().hex[:8]}.b64"
        parts = [encoded[i : i + chunk] for i in range(0, len(encoded), chunk)] or [""]
        for part in parts:
            cmd = f"printf %s {shlex.quote(part)} >> {target}"
            res = await self._call(self._exec_blocking, sandbox, [*self.settings.shell, cmd], "/", None)
            if res.exit_code != 0:
                raise EnvironmentFailure(f"sandbox {sandbox.name}: writing files failed: {res.err!r}")
        cmd = f"mkdir -p {shlex.quote(dest)} && base64 -d {target} | tar -x -C {shlex.quote(dest)} && rm -f {target}"
        res = await self._call(self._exec_blocking, sandbox, [*self.settings.shell, cmd], "/", None)
        if res.exit_code != 0:
            raise EnvironmentFailure(f"sandbox {sandbox.name}: unpacking files failed: {res.err!r}")

    async def read_file(self, sandbox: Sandbox, path: str) -> bytes:
        """The content of one file in the sandbox."""
        async with self.execs.slot():
            try:
                stream, _ = await self._call(sandbox.container.get_archive, path)
                raw = await self._call(lambda: b"".join(stream))
            except docker.errors.NotFound as exc:
                await self._check_alive(sandbox, f"reading {path}", exc)
                raise FileNotFoundError(path) from exc
            except _DOCKER_ERRORS as exc:
                await self._check_alive(sandbox, f"reading {path}", exc)
                raise EnvironmentFailure(f"sandbox {sandbox.name}: get_archive failed: {exc}") from exc
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise IsADirectoryError(path)
            fh = tar.extractfile(member)
            return fh.read() if fh else b""

    # ----------------------------------------------------------------------------- shutdown

    def stats(self) -> dict[str, Any]:
        c, e = self.containers.stats(), self.execs.stats()
        return {
            "batch_label": self.batch_label,
            "containers": {"limit": c.limit, "live": c.in_use, "peak": c.peak, "created": c.acquired},
            "exec": {"limit": e.limit, "running": e.in_use, "peak": e.peak, "count": e.acquired},
            "hosts": {h.name: {"live": h.live, "created": h.created} for h in self._hosts or []},
            "replacements": self.replacements,
        }

    async def cleanup(self) -> int:
        """Remove every container of this batch on every host (also ones of an earlier crashed run)."""
        for sandbox in list(self._live.values()):
            await self.remove(sandbox)
        removed = 0
        for host in self.hosts():
            removed += await self._call(remove_labelled, host.client, self.batch_label)
        return removed

    async def aclose(self) -> None:
        try:
            await self.cleanup()
        finally:
            for host in self._hosts or []:
                host.client.close()
            self._executor.shutdown(wait=False, cancel_futures=True)


def _force_remove(container: Any) -> None:
    try:
        container.remove(force=True, v=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "removal of container" in str(exc) and "already in progress" in str(exc):
            return
        raise EnvironmentFailure(f"cannot remove container {container.name}: {exc}") from exc


def member_name(name: str) -> str:
    """A packed file's name, normalised ("a/./b/../c" -> "a/c"); ValueError for a name that would
    land outside the destination (absolute, "..", empty) or holds a NUL."""
    clean = posixpath.normpath(name) if name else ""
    if not name or "\0" in name or clean.startswith("/") or clean in (".", "..") or clean.startswith("../"):
        raise ValueError(f"file name {name!r} is outside the sandbox's work directory (expected a relative "
                         "path without '..')")
    return clean


def _tar_of(files: Mapping[str, str | bytes], uid: int, gid: int) -> bytes:
    buf = io.BytesIO()
    now = time.time()
    dirs: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in files.items():
            rel = member_name(name)
            parts = rel.split("/")[:-1]
            for i in range(1, len(parts) + 1):  # parent directories first, owned by the user too
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, 0o755, uid, gid, now
                    tar.addfile(info)
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), 0o644, uid, gid, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _label_filter(batch_label: str | None) -> dict[str, list[str]]:
    labels = [f"{OWNER_LABEL}=agentbatch"]
    if batch_label is not None:
        labels.append(f"{BATCH_LABEL}={batch_label}")
    return {"label": labels}


def list_labelled(client: docker.DockerClient, batch_label: str | None = None) -> list[dict[str, Any]]:
    """Containers (running or not) made by agentbatch, of one batch or of all, as the engine lists
    them (`Id`, `Names`, `Labels`, `State` ...). Uses the plain list call: no per-container inspect
    that could race with a removal."""
    return client.api.containers(all=True, filters=_label_filter(batch_label))


def remove_labelled(client: docker.DockerClient, batch_label: str | None = None) -> int:
    n = 0
    for info in list_labelled(client, batch_label):
        try:
            client.api.remove_container(info["Id"], force=True, v=True)
            n += 1
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                raise
    return n


def cleanup_containers(batch_label: str | None = None, hosts: Sequence[str | None] = (None,)) -> int:
    """Remove leftover agentbatch containers of one batch (`None`: of every batch) on the given hosts."""
    removed = 0
    for url in hosts:
        client = docker_client(url, 60, 4)
        try:
            removed += remove_labelled(client, batch_label)
        finally:
            client.close()
    return removed


def exec_output(api: Any, exec_id: str) -> tuple[bytes, bytes]:
    """Start an exec and read its stdout and stderr to the end. docker-py's `exec_start` reads the
    multiplexed stream from the raw socket, past the HTTP reader's buffer: frames that arrived with
    the response headers (over TCP, under load) sat in that buffer and were lost, and the exec
    looked like one that printed nothing. This reads through the buffer. Transports without that
    reader (ssh, named pipes) keep docker-py's reading."""
    if api.base_url.startswith(("http+docker://ssh", "http+docker://localnpipe")):
        out, err = api.exec_start(exec_id, demux=True) or (None, None)
        return out or b"", err or b""
    res = api._post_json(api._url("/exec/{0}/start", exec_id), headers={"Connection": "Upgrade", "Upgrade": "tcp"},
                         data={"Tty": False, "Detach": False}, stream=True)  # fmt: skip
    try:
        api._raise_for_status(res)
        reader = res.raw._fp.fp  # the HTTP response's buffered reader over the hijacked socket
        api._disable_socket_timeout(reader.raw)  # the command's own limit bounds the wait (exec's timeout)
        streams = {1: bytearray(), 2: bytearray()}
        while len(head := reader.read(8)) == 8:
            kind, size = struct.unpack(">BxxxL", head)
            data = reader.read(size)
            streams.get(kind, streams[1]).extend(data)
            if len(data) < size:
                break
        return bytes(streams[1]), bytes(streams[2])
    finally:
        res.close()
