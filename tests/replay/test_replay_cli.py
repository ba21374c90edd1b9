"""`agentbatch replay` has the defaults of `agentbatch run`, every policy knob as a flag, and pins
every policy input of a live replay (admission order, priors from --priors only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentbatch.flows.cli import build_parser
from agentbatch.flows.cli import main as cli
from agentbatch.flows.commands.replay import _params, live_batch_config
from agentbatch.flows.config import BatchConfig
from agentbatch.sim.virtual_time import PolicySpec, VirtualConfig, simulate
from agentbatch.traces import chain_priors, generate, write_trace


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("replay-cli")
    write_trace(generate("mcp_like", 12, seed=5, tasks=6, epoch=0), d / "before.parquet")
    write_trace(generate("mcp_like", 12, seed=5, tasks=6, epoch=1), d / "now.parquet")
    return d / "before.parquet", d / "now.parquet"


def _args(*argv: str):  # noqa: ANN202
    return build_parser().parse_args(["replay", *argv])


def test_live_replay_has_the_run_defaults_and_pins_priors(traces: tuple[Path, Path]) -> None:
    before, now = traces
    args = _args(str(now), "--mode", "live")
    sched = live_batch_config(args, _params(args)).scheduling
    defaults = BatchConfig().scheduling
    assert sched.model_dump(exclude={"priors", "policy"}) == defaults.model_dump(exclude={"priors", "policy"})
    assert defaults.priors is None and sched.priors == {}  # run: the store's history; replay: pinned (none)
    assert defaults.policy == "auto" and sched.policy == "configured"  # replay: the flags, pinned

    args = _args(str(now), "--mode", "live", "--priors", str(before), "--admission-order", "arrival",
                 "--env-queue", "caas_history", "--policy-param", "priority.use_prior=true", "--no-coupled")
    sched = live_batch_config(args, _params(args)).scheduling
    base = chain_priors(generate("mcp_like", 12, seed=5, tasks=6, epoch=0))
    assert sched.admission_order == "arrival" and sched.env_queue.name == "caas_history"
    assert sched.priority.params == {"use_prior": True}
    # repeated task ids are "id#k" in the recorded workload; each gets its base id's prior
    assert sched.priors and all(sched.priors[t] == base[t.split("#")[0]] for t in sched.priors)
    assert len(sched.priors) == 12


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli(["replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in (("--max-active", 32), ("--env-slots", 8), ("--admission-order", "longest_prior_first"),
                          ("--router", "trajectory_aware"), ("--env-queue", "caas_history"), ("--priority", "chain_progress")):
        assert flag in text and f"(default: {default})" in text


def test_virtual_history_row_from_the_cli(traces: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    before, now = traces
    argv = ["replay", str(now), "--priors", str(before), "--env-queue", "caas_history", "--policy-param",
            "priority.use_prior=true", "--env-slots", "2", "--max-active", "6", "--json"]
    assert cli(argv) == 0
    got = json.loads(capsys.readouterr().out)
    from agentbatch.traces import read_trace

    cfg = VirtualConfig(env_slots=2, max_active=6, env_queue=PolicySpec("caas_history"),
                        priority=PolicySpec("chain_progress", {"use_prior": True}),
                        priors=chain_priors(read_trace(before)))  # fmt: skip
    assert got["makespan_s"] == simulate(read_trace(now), cfg).summary.makespan_s


@pytest.mark.parametrize("argv, message", [
    (["--policy-param", "nope=1"], "--policy-param"),
    (["--priors", "missing.parquet"], "--priors"),
    (["--env-queue", "lifo"], "--env-queue"),
    (["--mode", "live", "--engine", "openai"], "--endpoint"),
])  # fmt: skip
def test_bad_input_exits_2_naming_the_argument(traces: tuple[Path, Path], argv: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    assert cli(["replay", str(traces[1]), *argv]) == 2
    assert message in capsys.readouterr().err
