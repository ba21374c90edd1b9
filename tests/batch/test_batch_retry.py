"""The one retry rule (protocols/retry.py): what is retried, how often, and what giving up says."""

from __future__ import annotations

import asyncio

import pytest

from agentbatch.protocols.engine import EngineFailure
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
