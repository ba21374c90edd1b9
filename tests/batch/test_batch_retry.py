"""The one retry rule (protocols/retry.py): what is retried, how often, and what giving up says."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentbatch.db.store import Store
from agentbatch.engines.registry import make_engines
from agentbatch.flows.batch import create_batch, execute_batch
from agentbatch.flows.config import BatchConfig
from agentbatch.protocols.engine import ChatRequest, ChatResult, EngineFailure
from agentbatch.protocols.environment import EnvironmentFailure, EnvironmentUnreachable
from agentbatch.protocols.retry import Call, Effects, RetryPolicy, StepFailed

INFERENCE = Call("inference", "inference step 0")
ENVIRONMENT = Call("environment", "environment step 1")
SCORING = Call("environment", "scoring", Effects.NONE)
TOOL = Call("environment", "tool call 'x'", Effects.EXTERNAL)
IDEMPOTENT_TOOL = Call("environment", "tool call 'x'", Effects.EXTERNAL, idempotent=True)


@pytest.mark.parametrize(("exc", "call", "retried"), [
    (EngineFailure("down"), INFERENCE, True),
    (EnvironmentFailure("sandbox died"), ENVIRONMENT, True),
    (TimeoutError(), ENVIRONMENT, True),
    (ConnectionResetError(), INFERENCE, True),
    (RuntimeError("a bug"), INFERENCE, False),  # not a failure of the engine: not retried
    (RuntimeError("scorer crashed"), SCORING, True),  # scoring changes nothing: anything is retried
    (EnvironmentFailure("died during the call"), TOOL, False),  # may have run upstream
    (TimeoutError(), TOOL, False),
    (EnvironmentUnreachable("not running"), TOOL, True),  # never arrived
    (ConnectionRefusedError(), TOOL, True),
    (EnvironmentFailure("died during the call"), IDEMPOTENT_TOOL, True),  # the tool consents
    (asyncio.CancelledError(), SCORING, False),
])
def test_what_is_retried(exc: BaseException, call: Call, retried: bool) -> None:
    assert RetryPolicy.retryable(exc, call) is retried


def test_run_tries_again_until_the_retries_run_out() -> None:
    policy = RetryPolicy(environment=2, inference=1, backoff_s=0.0)
    tried: list[int] = []

    async def always(n: int) -> None:
        tried.append(n)
        raise EnvironmentFailure(f"attempt {n}")

    with pytest.raises(StepFailed, match=r"environment step 1 failed after 3 attempt\(s\): "
                                         r"EnvironmentFailure: attempt 3") as caught:
        asyncio.run(policy.run(ENVIRONMENT, always))
    assert tried == [1, 2, 3] and isinstance(caught.value.__cause__, EnvironmentFailure)

    tried.clear()
    with pytest.raises(StepFailed, match=r"failed after 2 attempt"):  # inference has its own count
        asyncio.run(policy.run(INFERENCE, always))
    assert tried == [1, 2]


def test_run_returns_the_first_success_and_stops_on_what_is_not_retried() -> None:
    policy = RetryPolicy(backoff_s=0.0)

    async def flaky(n: int) -> str:
        if n < 2:
            raise EngineFailure("503")
        return f"answer on attempt {n}"

    assert asyncio.run(policy.run(INFERENCE, flaky)) == "answer on attempt 2"

    tried: list[int] = []

    async def broken(n: int) -> None:
        tried.append(n)
        raise KeyError("choices")

    with pytest.raises(StepFailed, match=r"^inference step 0: KeyError"):
        asyncio.run(policy.run(INFERENCE, broken))
    assert tried == [1]


def test_backoff_doubles() -> None:
    policy = RetryPolicy(backoff_s=0.5)
    assert [policy.delay(i) for i in range(4)] == [0.5, 1.0, 2.0, 4.0]


class FlakyEngine:
    """A plugin engine (not an HTTP client): its first request of each inference step raises the
    protocol's EngineFailure, the next one is answered by the scripted engine it wraps."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.seen = inner, inner.name, set()

    async def complete(self, request: ChatRequest) -> ChatResult:
        key = (request.sample_id, request.step_index)
        if key not in self.seen:
            self.seen.add(key)
            raise EngineFailure(f"{self.name}: overloaded")
        return await self.inner.complete(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def build_flaky(params: dict[str, Any], workload: Any) -> list[FlakyEngine]:
    return [FlakyEngine(e) for e in make_engines("scripted", params, workload)]


def test_a_plugin_engine_failure_is_retried_by_the_runner_and_every_attempt_recorded(store: Store) -> None:
    """The runner retries what the protocol says is retryable, whatever raised it: each inference step
    has a failed attempt, then a completed one numbered after it, and every sample scores."""
    config = BatchConfig.model_validate({
        "name": "flaky", "workload": {"kind": "bfcl", "params": {"limit": 3, "seed": 3}},
        "engine": {"kind": "test_batch_retry:build_flaky", "params": {"workers": 1}},
        "retries": {"inference": 1, "environment": 0, "backoff_s": 0.0},
    })
    batch_id = create_batch(config, store)
    asyncio.run(execute_batch(store, batch_id, use_prefect=False, show_progress=False))
    assert {s.status for s in store.samples(batch_id)} == {"completed"}
    inference: dict[tuple[int, int], list[tuple[int, str]]] = {}
    for st in store.steps(batch_id):
        if st.kind == "inference":
            inference.setdefault((st.sample_id, st.index), []).append((st.attempt, st.status))
    assert inference and all(attempts == [(1, "failed"), (2, "completed")] for attempts in inference.values())
    assert all("EngineFailure: " in (st.error or "") for st in store.steps(batch_id) if st.status == "failed")
