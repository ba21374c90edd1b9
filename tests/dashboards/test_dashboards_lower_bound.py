import math

import pytest

from agentbatch.scheduling.lower_bound import LowerBound, makespan_lower_bound


def test_chain_binding():
    lb = makespan_lower_bound([3.0, 10.0, 4.0], inference_work_s=12.0, inference_capacity=2,
                              env_work_s=9.0, env_slots=3)
    assert lb.longest_chain_s == 10.0
    assert lb.inference_bound_s == 6.0
    assert lb.environment_bound_s == 3.0
    assert lb.value == 10.0
    assert lb.binding == "chain"
    assert lb.ratio(15.0) == 1.5


def test_inference_and_environment_binding():
    lb = makespan_lower_bound([1.0], 40.0, 4, 2.0, 1)
    assert (lb.value, lb.binding) == (10.0, "inference")
    lb = makespan_lower_bound([1.0, 2.0], 4.0, 4, 30.0, 2)
    assert (lb.value, lb.binding) == (15.0, "environment")


def test_ties_prefer_chain_then_inference():
    assert LowerBound(5.0, 5.0, 5.0).binding == "chain"
    assert LowerBound(1.0, 5.0, 5.0).binding == "inference"


def test_empty_and_zero_capacity():
    lb = makespan_lower_bound([], 0.0, 0, 0.0, 0)
    assert lb.value == 0.0
    assert lb.ratio(3.0) == math.inf
    lb = makespan_lower_bound([], 1.0, 0, 0.0, 0)
    assert lb.inference_bound_s == math.inf and lb.binding == "inference"


def test_rejects_negative_and_nan():
    with pytest.raises(ValueError):
        makespan_lower_bound([-1.0], 0, 1, 0, 1)
    with pytest.raises(ValueError):
        makespan_lower_bound([1.0], float("nan"), 1, 0, 1)


def test_accepts_generator():
    lb = makespan_lower_bound((x / 2 for x in range(5)), 0, 1, 0, 1)
    assert lb.longest_chain_s == 2.0
