"""The gateway process: one HTTP server with the inference gateway (`/v1/...`) and the tool gateway
(`/mcp`), one batch in the store, one coordinator.

Lifecycle: opening creates the batch (`running`), registers the workers, connects the upstream MCP
servers and starts the idle sweeper and the workers' /metrics scraper. `POST /v1/batch/finish` or
SIGTERM stops the server: requests in flight finish, the samples still open end, every record is
committed, and the batch is marked completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette

from agentbatch.db.models import BatchStatus
from agentbatch.db.store import Store
from agentbatch.db.writer import StepWriter
from agentbatch.engines.metrics import MetricsScraper
from agentbatch.environments.mcp_client import McpServerSpec
from agentbatch.gateway.cluster import Cluster, ClusterSettings
from agentbatch.gateway.forward import WorkerEndpoint, WorkerPool
from agentbatch.gateway.guard import Guard, allowed_hosts, guarded_http, mcp_security
from agentbatch.gateway.inference import ChatCompletions, routes
from agentbatch.gateway.routing import ClusterRouter
from agentbatch.gateway.samples import SampleRegistry
from agentbatch.gateway.state import GatewaySettings, GatewayState, abandon_step
from agentbatch.gateway.tools import ToolGateway
from agentbatch.scheduling.portfolio import running_policy_status
from agentbatch.tasks.coordinator import Coordinator

log = logging.getLogger("agentbatch.gateway")
# Their INFO lines (one per request and MCP session) drown the gateway's own.
NOISY_LOGGERS = ("httpx", "httpx2", "httpcore", "mcp", "mcp.server", "mcp.client")
SHUTDOWN_CANCELLED = "cancelled: the gateway shut down with the step in flight"


@dataclass
class GatewayBatch:
    """The batch a gateway records into: created from name + config, or an existing id."""

    name: str = "gateway"
    config: dict[str, Any] = field(default_factory=dict)
    batch_id: int | None = None
    flow_run_id: str | None = None  # the Prefect flow run that serves it, if any


class Gateway:
    def __init__(self, store: Store, coordinator: Coordinator, endpoints: Sequence[WorkerEndpoint], *,
                 batch: GatewayBatch | None = None, upstreams: Sequence[McpServerSpec] = (),
                 settings: GatewaySettings | None = None, cluster: ClusterSettings | None = None) -> None:
        """`cluster`: this process is one of several serving the batch `batch.batch_id` (which exists)."""
        if sorted(e.name for e in endpoints) != sorted(coordinator.workers):
            raise ValueError("the coordinator's workers and the endpoints must be the same names")
        self.store = store
        self.coordinator = coordinator
        self.endpoints = list(endpoints)
        self.batch = batch or GatewayBatch()
        self.upstreams = list(upstreams)
        self.settings = settings or GatewaySettings()
        recorder = StepWriter(store).start()
        # The batch id is known once open() has created the batch.
        self.state = GatewayState(
            batch_id=0, coordinator=coordinator, recorder=recorder, settings=self.settings,
            registry=SampleRegistry(coordinator, recorder, 0, end_on_answer=self.settings.end_on_answer,
                                    yield_min_s=self.settings.yield_min_s, yield_factor=self.settings.yield_factor),
            pool=WorkerPool(self.endpoints, self.settings.request_timeout_s),
        )
        self.state.policy = running_policy_status(self.batch.config)
        unknown = set(self.settings.per_sample_upstreams) - {u.name for u in self.upstreams}
        if unknown:
            raise ValueError(f"per-sample upstreams {sorted(unknown)} are not among the MCP upstreams "
                             f"{[u.name for u in self.upstreams]}")
        self.tools = ToolGateway(self.upstreams, self.state, per_sample=self.settings.per_sample_upstreams)
        self.on_stop: Callable[[], None] | None = None  # set by whoever runs the HTTP server
        self.opened = False
        self._sweeper: asyncio.Task[None] | None = None
        self._scraper: MetricsScraper | None = None
        self.cluster: Cluster | None = None
        self.router: ClusterRouter | None = None
        if cluster is not None:
            if self.batch.batch_id is None:
                raise ValueError("a gateway process of several serves an existing batch: give its id")
            self.cluster = Cluster(store, self.batch.batch_id, coordinator, cluster)
        self._tool_server = self.tools.server()
        self.hosts = allowed_hosts(self.settings.bind_host, self.settings.allowed_hosts)
        # Several processes: an MCP session must not be bound to one of them (stateless transport).
        self._mcp_app = self._tool_server.streamable_http_app(
            host=self.settings.bind_host, transport_security=mcp_security(self.hosts),
            max_request_body_size=self.settings.max_body_bytes, stateless_http=cluster is not None)
        for name in NOISY_LOGGERS:
            if logging.getLogger(name).level < logging.WARNING:
                logging.getLogger(name).setLevel(logging.WARNING)

    @property
    def batch_id(self) -> int:
        return self.state.batch_id

    # --- lifecycle -------------------------------------------------------------------------------------
    async def open(self) -> int:
        batch_id = await asyncio.to_thread(self._open_batch)
        self.state.batch_id = self.state.registry.batch_id = batch_id
        await self.tools.start()
        if self.cluster is not None:
            await self.cluster.start()
        if self.settings.metrics_interval_s > 0:
            self._scraper = MetricsScraper({e.name: e.base_url for e in self.endpoints}, store=self.store,
                                           batch_id=batch_id, interval_s=self.settings.metrics_interval_s)
            self.coordinator.load_hook = self._scraper.fill_loads
            await self._scraper.start()
        self._sweeper = asyncio.create_task(self._sweep(), name="agentbatch-gateway-idle")
        self.opened = True
        log.info("gateway batch %s: %d worker(s), %d tool(s) from %d MCP server(s)", batch_id,
                 len(self.endpoints), len(self.tools.tools), len(self.upstreams))
        return batch_id

    def _open_batch(self) -> int:
        # A member of several processes: whoever started the processes registered the workers.
        return open_gateway_batch(self.store, self.batch.name, self.batch.config, self.endpoints,
                                  self.batch.flow_run_id, batch_id=self.batch.batch_id,
                                  register_workers=self.cluster is None)

    async def _sweep(self) -> None:
        idle_timeout = self.settings.idle_timeout_s
        interval = max(0.05, min(5.0, idle_timeout / 4, self.settings.yield_min_s / 4))
        while True:
            await asyncio.sleep(interval)
            self.state.registry.yield_idle(idle_timeout)
            self.state.registry.end_idle(idle_timeout)

    async def close(self, status: BatchStatus = BatchStatus.COMPLETED, error: str | None = None) -> None:
        """End the open samples, commit every record, mark the batch finished."""
        if not self.opened:
            return
        self.opened = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        state = self.state
        await asyncio.sleep(0)  # handlers the server has just cancelled record their steps first
        for held in list(state.held):
            abandon_step(state, held, SHUTDOWN_CANCELLED, cancelled=True)
        state.registry.end_all("shutdown")
        if state.counters.cancelled and status == BatchStatus.COMPLETED:
            status = BatchStatus.COMPLETED_WITH_FAILURES
            error = error or f"{state.counters.cancelled} step(s) cut off (shutdown or client gone): recorded as failed"
        if self._scraper is not None:
            await self._scraper.stop()
        await state.pool.aclose()
        await self.tools.aclose()
        await state.recorder.aclose()  # every record committed ...
        if self.router is not None:
            await self.router.aclose()
        if self.cluster is not None:  # ... then the end, by the last process to leave
            await self.cluster.leave(status, error)
        else:
            await asyncio.to_thread(self.store.finish_batch, state.batch_id, status, error)

    def request_stop(self) -> None:
        if self.on_stop is not None:
            self.on_stop()

    # --- the ASGI app ----------------------------------------------------------------------------------
    def app(self) -> Guard:
        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with self._tool_server.session_manager.run():
                await self.open()
                try:
                    yield
                finally:
                    await self.close()

        mcp_routes = self.tools.mcp_routes(self._mcp_app, self._tool_server)
        extra = [self.tools.internal_route()] if self.cluster is not None else []
        # POST /mcp and a chat request go straight to their handlers, the rest through Starlette
        app: Any = self.tools.ahead_of(Starlette(routes=[*routes(self.state, self.request_stop), *mcp_routes, *extra],
                                                 lifespan=lifespan),
                                       {"/v1/chat/completions": ChatCompletions(self.state)})
        if self.cluster is not None:
            self.router = app = ClusterRouter(app, self.cluster)
            self.tools.owner_url = self.cluster.url_of
        return Guard(app, hosts=self.hosts, max_body_bytes=self.settings.max_body_bytes,
                     body_timeout_s=self.settings.body_timeout_s)

# --- running it ----------------------------------------------------------------------------------------
def open_gateway_batch(store: Store, name: str, config: dict[str, Any], endpoints: Sequence[WorkerEndpoint],
                       flow_run_id: str | None, *, batch_id: int | None = None, register_workers: bool = True) -> int:
    """The gateway's batch (created unless `batch_id` is given) marked running, its workers registered."""
    if batch_id is None:
        batch_id = store.create_batch(name, config, [])
    store.mark_batch_running(batch_id, flow_run_id)
    if register_workers:
        for e in endpoints:
            store.upsert_worker(batch_id, e.name, "engine", endpoint=e.base_url)
    return batch_id


def listen_socket(host: str, port: int, *, shared: bool = False) -> socket.socket:
    """A bound socket for the server (port 0: a free one); OSError when the address is taken.
    `shared`: other processes may listen on the same port (SO_REUSEPORT: the kernel spreads the
    connections among them)."""
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY on accepted connections only for sockets that say so
    # (without it, small responses wait for delayed ACKs: +40 ms a request).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def uvicorn_server(gateway: Gateway, *, graceful_s: float = 30.0) -> Any:
    """A uvicorn server for the gateway (serve it with `server.serve(sockets=[listen_socket(...)])`);
    POST /v1/batch/finish stops it as SIGTERM does."""
    import uvicorn

    # Idle keep-alive connections are kept 75 s by default (uvicorn's default is 5 s, the same as httpx's
    # client expiry): a client then always drops an idle connection before the server closes it under a
    # request. A connection that never sends a whole request head is closed after header_timeout_s.
    settings = gateway.settings
    config = uvicorn.Config(gateway.app(), log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=graceful_s,  # type: ignore[arg-type]  # typed int; a float works
                            timeout_keep_alive=settings.keep_alive_s,
                            http=guarded_http(settings.header_timeout_s))
    server = uvicorn.Server(config)

    def stop() -> None:
        server.should_exit = True

    gateway.on_stop = stop
    # uvicorn re-raises a captured SIGTERM after its shutdown, which would end the process before the
    # caller prints its summary: here a signal only stops the server (a second SIGINT forces it).
    server.capture_signals = lambda: _stop_on_signals(server)  # type: ignore[method-assign]  # see the comment above
    return server


@contextlib.contextmanager
def _stop_on_signals(server: Any) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return

    def handle(sig: int, frame: Any) -> None:
        if server.should_exit and sig == signal.SIGINT:
            server.force_exit = True
        server.should_exit = True

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class RunningGateway:
    gateway: Gateway
    base_url: str  # http://HOST:PORT (the OpenAI base URL is base_url + "/v1", MCP at base_url + "/mcp")
    batch_id: int


@contextlib.contextmanager
def running_gateway(gateway: Gateway, host: str = "127.0.0.1", *, graceful_s: float = 30.0) -> Iterator[RunningGateway]:
    """Serve a gateway in a background thread on a free port (tests, notebooks, benchmarks). Leaving
    the block stops it the way SIGTERM does (requests in flight get `graceful_s` to finish), and
    waits until every record is committed."""
    sock = listen_socket(host, 0)
    server = uvicorn_server(gateway, graceful_s=graceful_s)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True,
                              name="agentbatch-gateway")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError("the gateway did not start")
        time.sleep(0.01)
    try:
        yield RunningGateway(gateway, f"http://{host}:{sock.getsockname()[1]}", gateway.batch_id)
    finally:
        server.should_exit = True
        thread.join(timeout=120)
        sock.close()
