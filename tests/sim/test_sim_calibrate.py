"""Calibration: fit the cost model to request timings, from a table or from a batch in the store.

The timings come from the engine model itself with known coefficients, so the fit has a true answer;
the base profile starts far from it.
"""

from __future__ import annotations

import random

import pandas as pd
import pytest
from testkit import commit_writes

from agentbatch.db.step_records import StepAttempt, StepOutcome
from agentbatch.flows.cli import main
from agentbatch.sim import SimRequest, get_profile
from agentbatch.sim.calibrate import fit_cost_model, timings_from_records
from agentbatch.sim.drive import drive
from agentbatch.sim.profiles import save_profile

TRUE = get_profile("llama3-8b-h100")
BASE = get_profile(
    "llama3-8b-h100",
    cost={"c0": 0.012, "c_prefill": 1.5e-5, "c_decode": 5e-5, "c_attn": 1e-7, "c_prefill_attn": 1e-10},
)


def _measured(n: int = 300, seed: int = 0, workers: int = 1, true=TRUE) -> list[dict]:
    rng = random.Random(seed)
    system = list(range(1000))
    records = []
    for w in range(workers):
        arrivals, t = [], 0.0
        for i in range(n):
            t += rng.expovariate(4.0 if i % 50 < 25 else 0.5)  # bursts and lulls: varied batch sizes
            prompt = system + list(range(10_000 * (i + 1), 10_000 * (i + 1) + rng.randrange(50, 4000)))
            arrivals.append((t, SimRequest(f"w{w}-r{i}", i, prompt, rng.randrange(2, 600))))
        for s in drive(true, arrivals).stats:
            records.append(
                {
                    "prompt_tokens": s.prompt_tokens,
                    "cached_prompt_tokens": s.cached_prompt_tokens,
                    "output_tokens": s.output_tokens,
                    "started_at": 1000.0 + s.arrival,
                    "finished_at": 1000.0 + s.finished,
                    "engine_queue_s": s.queue_s,
                    "prefill_s": s.prefill_s,
                    "decode_s": s.decode_s,
                    "worker": f"w{w}",
                }
            )
    return records


@pytest.fixture(scope="module")
def measured() -> list[dict]:
    return _measured()


def _close(fitted: float, true: float, tol: float) -> bool:
    return abs(fitted - true) <= tol * true


def test_fit_recovers_the_coefficients_from_split_timings(measured):
    fit = fit_cost_model(timings_from_records(measured), BASE)
    c = fit.coefficients
    assert _close(c["c0"], TRUE.cost.c0, 0.15)
    assert _close(c["c_prefill"], TRUE.cost.c_prefill, 0.15)
    assert _close(c["c_attn"], TRUE.cost.c_attn, 0.25)
    assert all(v >= 0 for v in c.values())
    assert fit.mape < 0.03
    assert fit.rel_rms < fit.rel_rms_base / 5
    assert fit.profile.num_kv_blocks == BASE.num_kv_blocks  # memory settings are the base's
    assert "c_prefill" in fit.to_text()


def test_fit_of_the_hybrid_moe_profile_keeps_its_expert_read_term():
    true = get_profile("ling-flash-2.0-h200")
    base = get_profile(
        "ling-flash-2.0-h200",
        cost={"c0": 0.006, "c_prefill": 3e-5, "c_decode": 1e-4, "c_attn": 5e-9, "c_prefill_attn": 3e-10},
    )
    fit = fit_cost_model(timings_from_records(_measured(n=200, seed=1, true=true)), base)
    assert _close(fit.coefficients["c0"], true.cost.c0, 0.2)
    assert _close(fit.coefficients["c_prefill"], true.cost.c_prefill, 0.2)
    assert fit.profile.cost.moe_weight_s == true.cost.moe_weight_s  # fixed, not fitted
    assert fit.mape < 0.05


def test_fit_from_total_latency_only_beats_the_base(measured):
    totals = [{k: v for k, v in r.items() if k not in ("prefill_s", "decode_s")} for r in measured]
    fit = fit_cost_model(timings_from_records(totals), BASE)
    assert set(fit.per_phase) == {"request"}
    assert fit.rel_rms < fit.rel_rms_base / 2
    assert _close(fit.coefficients["c0"], TRUE.cost.c0, 0.6)


def test_unusable_timings_are_rejected():
    with pytest.raises(ValueError, match="no usable"):
        timings_from_records(
            [{"prompt_tokens": 5, "output_tokens": 0, "started_at": 0.0, "finished_at": 1.0}]
        )


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_calibrate_command_from_a_table(tmp_path, measured, fmt, capsys):
    table = tmp_path / f"timings.{fmt}"
    df = pd.DataFrame(measured)
    df.to_csv(table, index=False) if fmt == "csv" else df.to_parquet(table)
    base = tmp_path / "base.json"
    save_profile(BASE, base)
    out = tmp_path / "fitted.json"
    rc = main(
        ["calibrate", "--timings", str(table), "--base", str(base), "--out", str(out), "--name", "my-gpu"]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "c0" in printed and "MAPE" in printed
    prof = get_profile(str(out))
    assert prof.name == "my-gpu"
    assert _close(prof.cost.c0, TRUE.cost.c0, 0.15)
    # the fitted profile drives the timing model directly
    from agentbatch.engines.timing import make_timing

    assert make_timing({"kind": "simulated", "profile": str(out)}).profile.cost == prof.cost


def test_check_reruns_the_requests_and_the_fitted_profile_matches_better(tmp_path, measured, capsys):
    from agentbatch.sim.calibrate import compare_to_measured

    t = timings_from_records(measured)
    fitted = fit_cost_model(t, BASE).profile
    good, bad = compare_to_measured(fitted, t), compare_to_measured(BASE, t)
    assert good["requests"] == len(measured)
    assert good["latency_mape"] < 0.1 < bad["latency_mape"]
    assert good["cached_tokens_ratio"] == pytest.approx(1.0, rel=0.05)
    table = tmp_path / "timings.csv"
    pd.DataFrame(measured).to_csv(table, index=False)
    out = tmp_path / "fitted.json"
    assert (
        main(["calibrate", "--timings", str(table), "--base", "llama3-8b-h100", "--out", str(out), "--check"])
        == 0
    )
    assert "re-run with the fitted profile" in capsys.readouterr().out


def test_calibrate_command_rejects_a_table_without_the_columns(tmp_path, capsys):
    table = tmp_path / "bad.csv"
    pd.DataFrame({"prompt_tokens": [1]}).to_csv(table, index=False)
    assert main(["calibrate", "--timings", str(table), "--out", str(tmp_path / "o.json")]) == 2
    assert "missing columns" in capsys.readouterr().err


def test_calibrate_command_from_a_batch_in_the_store(store, tmp_path, capsys):
    records = _measured(n=50, seed=3, workers=2)
    batch = store.create_batch("measured", {}, [(f"t{i}", {}) for i in range(len(records))])
    samples = store.samples(batch)
    fields = ("prompt_tokens", "cached_prompt_tokens", "output_tokens", "prefill_s", "decode_s", "engine_queue_s")
    writes = [
        StepAttempt(batch_id=batch, sample=sample.id, index=0, attempt=1, kind="inference",
                    enqueued_at=r["started_at"], started_at=r["started_at"]).completed(
            StepOutcome(response={}, worker=r["worker"], **{k: r[k] for k in fields}), steps_done=1,
            finished_at=r["finished_at"])
        for sample, r in zip(samples, records, strict=True)
    ]
    commit_writes(store, writes)
    out = tmp_path / "fitted.json"
    rc = main(
        ["calibrate", "--batch", str(batch), "--db", store.url, "--base", "llama3-8b-h100", "--out", str(out)]
    )
    assert rc == 0
    prof = get_profile(str(out))
    assert _close(prof.cost.c0, TRUE.cost.c0, 0.15)
    assert _close(prof.cost.c_prefill, TRUE.cost.c_prefill, 0.2)
    assert main(["calibrate", "--batch", "999999", "--db", store.url, "--out", str(out)]) == 2


def test_burst_delivered_streams_count_only_as_total_latency() -> None:
    """A request whose decode looks free (tokens delivered in one burst) must not teach the fit that
    decode costs nothing."""
    import numpy as np

    from agentbatch.sim.calibrate import Timings, burst_delivered

    n = 6
    t = Timings(
        prompt=np.full(n, 100.0), cached=np.zeros(n), output=np.full(n, 51.0),
        start=np.arange(n, dtype=float), finish=np.arange(n, dtype=float) + 0.6,
        queue=np.zeros(n), prefill=np.array([0.1] * 5 + [0.59]),
        decode=np.array([0.5] * 5 + [0.01]), worker=np.array(["w"] * n),
    )
    assert burst_delivered(t).tolist() == [False] * 5 + [True]
    from agentbatch.sim.calibrate import design_rows
    from agentbatch.sim.profiles import get_profile

    _, _, phases, _ = design_rows(t, get_profile("tiny-cpu"))
    # five decode rows and five prefill rows for the normal requests, one whole-request row for the burst
    assert sorted(phases.tolist()) == [0] * 5 + [1] * 5 + [2]
