"""`agentbatch plan` end to end: presets, config files, CSV and Parquet workloads, JSON, errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentbatch.flows.cli import main
from agentbatch.traces.generators import generate
from agentbatch.traces.parquet import write_trace

STATS = [
    "--mean-context",
    "20000",
    "--p95-context",
    "40000",
    "--env-fraction",
    "0.6",
    "--shared-prefix",
    "2000",
]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_hybrid_preset_prints_reasoning_and_settings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--model", "ring-flash-linear-2.0", "--gpu-mem-gib", "141", *STATS)
    assert code == 0, err
    for needle in (
        "KV bytes per token kv",
        "state bytes per sequence s",
        "56.00 MiB",
        "reference concurrency N_ref",
        "--mamba-cache-mode align",
        "--block-size 1024",
        "--max-mamba-cache-size",
        "--mamba-full-memory-ratio",
        "balance point r*",
        "Recompute as a function of concurrency",
        "<- N_ref",
    ):
        assert needle in out, needle


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--model",
        "llama-3-8b",
        "--gpu-mem-gib",
        "80",
        "--gpu-util",
        "0.92",
        "--mean-context",
        "6000",
        "--env-fraction",
        "0.5",
        "--json",
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["model_shape"]["kv_bytes_per_token"] == 131072
    assert doc["vllm_args"]["--gpu-memory-utilization"] == 0.92
    assert doc["reference_concurrency"] == min(doc["n_mem"], doc["n_busy"])
    assert doc["vllm_args"]["--max-num-seqs"] == doc["max_num_seqs"]
    assert {r["quantity"] for r in doc["rows"]} >= {
        "memory for caches C",
        "N_mem (all admitted cached)",
        "N_busy",
    }


def test_config_file_and_weights_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(cfg))
    code, out, err = run(
        capsys,
        "--model",
        str(tmp_path / "tiny"),
        "--gpu-mem-gib",
        "11",
        "--gpu-util",
        "1",
        "--reserve-gib",
        "0",
        "--weights-gib",
        "1",
        "--mean-context",
        "10000",
        "--env-fraction",
        "0.5",
        "--target-running",
        "100",
        "--json",
    )
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["n_mem"], doc["n_busy"], doc["reference_concurrency"]) == (1047, 200, 200)


def test_csv_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.csv"
    path.write_text(
        "sample_id,context_tokens,env_fraction,shared_prefix\n"
        + "".join(f"{i},{8000 + 100 * i},0.5,1000\n" for i in range(20))
    )
    code, out, err = run(
        capsys, "--model", "llama-3-8b", "--gpu-mem-gib", "141", "--trace", str(path), "--json"
    )
    assert code == 0, err
    doc = json.loads(out)
    row = {r["quantity"]: r for r in doc["rows"]}
    assert row["env fraction f"]["value"] == pytest.approx(0.5)
    assert row["shared prefix P"]["value"] == 1000
    assert row["mean context mu"]["value"] == pytest.approx(8950)
    assert doc["reference_concurrency"] <= 20  # 20 samples in the batch


def test_parquet_trace_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = generate("swe_like", samples=30, seed=3)
    path = write_trace(trace, tmp_path / "swe.parquet")
    code, out, err = run(
        capsys, "--model", "ring-flash-linear-2.0", "--gpu-mem-gib", "141", "--trace", str(path), "--json"
    )
    assert code == 0, err
    doc = json.loads(out)
    row = {r["quantity"]: r for r in doc["rows"]}
    assert 0 < row["env fraction f"]["value"] < 1
    assert row["shared prefix P"]["value"] == trace.samples[0].shared_prefix_tokens
    contexts = [s.prompt_tokens + s.output_tokens for x in trace.samples for s in x.inference_steps]
    assert min(contexts) <= row["mean context mu"]["value"] <= max(contexts)
    assert doc["reference_concurrency"] <= 30
    # an explicit env fraction overrides the trace's
    code, out, _ = run(
        capsys,
        "--model",
        "llama-3-8b",
        "--gpu-mem-gib",
        "141",
        "--trace",
        str(path),
        "--env-fraction",
        "0.25",
        "--json",
    )
    assert {r["quantity"]: r for r in json.loads(out)["rows"]}["env fraction f"]["value"] == 0.25


@pytest.mark.parametrize(
    ("setup", "argv", "words"),
    [
        (lambda d: None, ["--model", "no-such-model"], ["no-such-model", "presets"]),
        (
            lambda d: (d / "bad.json").write_text("{not json"),
            ["--model", "{d}/bad.json"],
            ["bad.json", "not valid JSON"],
        ),
        (
            lambda d: (d / "c.json").write_text(
                json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})
            ),
            ["--model", "{d}/c.json"],
            ["c.json", "num_hidden_layers"],
        ),
        (
            lambda d: (d / "w.csv").write_text("ctx\n100\n"),
            ["--model", "llama-3-8b", "--trace", "{d}/w.csv"],
            ["w.csv", "context_tokens"],
        ),
        (
            lambda d: (d / "w.csv").write_text("context_tokens\n1000\n"),
            ["--model", "llama-3-8b", "--trace", "{d}/w.csv"],
            ["w.csv", "env_fraction"],
        ),
        (
            lambda d: (d / "w.csv").write_text("context_tokens,env_fraction\nmany,0.5\n"),
            ["--model", "llama-3-8b", "--trace", "{d}/w.csv"],
            ["w.csv", "row 2", "context_tokens", "many"],
        ),
        (
            lambda d: (d / "t.parquet").write_bytes(b"nope"),
            ["--model", "llama-3-8b", "--trace", "{d}/t.parquet"],
            ["t.parquet", "trace"],
        ),
        (lambda d: None, ["--model", "llama-3-8b"], ["--mean-context", "--trace"]),
        (lambda d: None, ["--model", "ring-flash-linear-2.0", "--gpu-mem-gib-override"], []),
    ],
)
def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], setup, argv, words) -> None:
    setup(tmp_path)
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    if "--gpu-mem-gib-override" in argv:  # argparse's own errors exit 2 as well
        with pytest.raises(SystemExit) as info:
            main(["plan", "--model", "llama-3-8b", "--gpu-mem-gib", "lots"])
        assert info.value.code == 2
        return
    code, out, err = run(capsys, *argv, "--gpu-mem-gib", "141")
    assert code == 2
    for w in words:
        assert w in err, (w, err)


def test_weights_too_big_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--model", "ring-flash-linear-2.0", "--gpu-mem-gib", "80", *STATS)
    assert code == 2 and "no memory left for caches" in err


def test_goodput_pick_from_token_counts(capsys: pytest.CaptureFixture[str]) -> None:
    base = [
        "--model",
        "llama-3-8b",
        "--gpu-mem-gib",
        "80",
        "--mean-context",
        "16000",
        "--p95-context",
        "40000",
        "--env-fraction",
        "0.7",
        "--shared-prefix",
        "2400",
        "--json",
    ]
    code, out, _ = run(capsys, *base)
    strict = json.loads(out)
    assert code == 0 and strict["n_goodput"] is None and strict["reference_concurrency"] == strict["n_mem"]
    code, out, _ = run(capsys, *base, "--output-tokens", "200", "--new-tokens", "600")
    doc = json.loads(out)
    assert code == 0 and doc["n_goodput"] is not None
    assert doc["n_mem"] <= doc["reference_concurrency"] <= doc["n_busy"]
