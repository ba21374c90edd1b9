"""The launcher's command lines, environments and config handling (no process is started)."""

from __future__ import annotations

import json

import pytest

from agentbatch.engines.vllm_workers import (
    WorkerProcess,
    WorkersConfig,
    WorkersError,
    load_workers_config,
    plan_launch,
    procs_path,
    read_endpoints,
    read_processes,
    write_endpoints,
)


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_cpu_plan_has_the_cpu_recipe_and_launch_settings(tmp_path):
    cfg = WorkersConfig.model_validate({
        "model": str(tmp_path), "served_model_name": "tiny", "count": 2, "device": "cpu", "base_port": 9100,
        "settings": {"max_num_seqs": 8, "block_size": 128, "kv_cache_space_gib": 2},
    })
    plans = plan_launch(cfg)
    assert [p.port for p in plans] == [9100, 9101]
    assert [p.name for p in plans] == ["vllm-0", "vllm-1"]
    argv, env = plans[0].argv, plans[0].env
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--model") == str(tmp_path.resolve())
    assert _flag(argv, "--max-num-seqs") == "8" and _flag(argv, "--block-size") == "128"
    assert _flag(argv, "--scheduling-policy") == "priority"
    assert "--enable-prefix-caching" in argv and "--enforce-eager" in argv
    assert _flag(argv, "--tool-call-parser") == "hermes"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_NO_USAGE_STATS"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert "--gpu-memory-utilization" not in argv


def test_gpu_plan_gives_each_worker_its_own_devices():
    cfg = WorkersConfig.model_validate({
        "model": "some/model", "count": 2, "device": "gpu", "gpus_per_worker": 2,
        "settings": {"gpu_memory_utilization": 0.85, "mamba_cache_mode": "align", "enable_prefix_caching": False},
    })
    p0, p1 = plan_launch(cfg)
    assert p0.env["CUDA_VISIBLE_DEVICES"] == "0,1" and p1.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert _flag(p0.argv, "--tensor-parallel-size") == "2"
    assert _flag(p0.argv, "--gpu-memory-utilization") == "0.85"
    assert _flag(p0.argv, "--mamba-cache-mode") == "align"
    assert "--no-enable-prefix-caching" in p0.argv and "--enforce-eager" not in p0.argv
    assert "VLLM_CPU_KVCACHE_SPACE" not in p0.env
    assert _flag(p0.argv, "--model") == "some/model"  # not a local directory: passed through


def test_per_worker_overrides_merge_over_the_defaults():
    cfg = WorkersConfig.model_validate({
        "model": "m", "count": 2, "device": "cpu",
        "settings": {"max_num_seqs": 8, "env": {"A": "1"}},
        "workers": [{}, {"name": "big", "port": 9200, "devices": "1",
                         "settings": {"max_num_seqs": 32, "env": {"B": "2"}}}],
    })
    p0, p1 = plan_launch(cfg)
    assert _flag(p0.argv, "--max-num-seqs") == "8" and _flag(p1.argv, "--max-num-seqs") == "32"
    assert p1.name == "big" and p1.port == 9200
    assert p1.env["A"] == "1" and p1.env["B"] == "2" and "B" not in p0.env
    assert p1.env["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_duplicate_ports_are_refused():
    cfg = WorkersConfig.model_validate({"model": "m", "count": 2, "workers": [{"port": 9000}, {"port": 9000}]})
    with pytest.raises(WorkersError, match="unique"):
        plan_launch(cfg)


def test_bad_config_file_names_the_field(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("model: m\ncount: 0\nsettings: {scheduling_policy: lifo}\n")
    with pytest.raises(WorkersError) as err:
        load_workers_config(path)
    assert "count" in str(err.value) and "scheduling_policy" in str(err.value)
    with pytest.raises(WorkersError, match="no such file"):
        load_workers_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_endpoints_file_round_trip(tmp_path, suffix):
    workers = [WorkerProcess("w0", 11, 11, 8000, "/tmp/w0.log", "http://127.0.0.1:8000/v1", "tiny", ["py"]),
               WorkerProcess("w1", 12, 12, 8001, "/tmp/w1.log", "http://127.0.0.1:8001/v1", "tiny", ["py"])]
    path = write_endpoints(tmp_path / f"endpoints{suffix}", workers)
    eps = read_endpoints(path)
    assert [(e.name, e.base_url, e.model) for e in eps] == [
        ("w0", "http://127.0.0.1:8000/v1", "tiny"), ("w1", "http://127.0.0.1:8001/v1", "tiny")]
    assert read_processes(path) == workers
    if suffix == ".json":  # the endpoints list is plain: exactly the engine's `endpoints` param
        assert json.loads(path.read_text())[0] == {"name": "w0", "base_url": "http://127.0.0.1:8000/v1", "model": "tiny"}
    assert procs_path(path).name == f"endpoints{suffix}.procs.json"


def test_settings_come_from_the_resource_model_plan_unless_set(tmp_path):
    plan = {"reference_concurrency": 40, "vllm_args": {
        "--gpu-memory-utilization": 0.9, "--max-num-seqs": 24, "--block-size": 544, "--enable-prefix-caching": True,
        "--max-num-batched-tokens": 8192, "--max-model-len": 32768, "--scheduling-policy": "priority",
        "--mamba-cache-mode": "align", "--mamba-ssm-cache-dtype": "float32"}}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    cfg = WorkersConfig.model_validate({"model": "m", "device": "gpu", "plan": str(path),
                                        "settings": {"max_model_len": 4096, "extra_args": ["--seed", "7"]}})
    (p,) = plan_launch(cfg)
    assert _flag(p.argv, "--max-num-seqs") == "24" and _flag(p.argv, "--block-size") == "544"
    assert _flag(p.argv, "--gpu-memory-utilization") == "0.9"
    assert _flag(p.argv, "--mamba-cache-mode") == "align"
    assert _flag(p.argv, "--max-model-len") == "4096"  # set in the config: the config wins
    assert p.argv[-4:] == ["--mamba-ssm-cache-dtype", "float32", "--seed", "7"]
    with pytest.raises(WorkersError, match="vllm_args"):
        plan_launch(WorkersConfig.model_validate({"model": "m", "plan": {"n": 1}}))


def test_cpu_workers_fork_their_model_worker_and_gpu_workers_do_not():
    cpu = plan_launch(WorkersConfig.model_validate({"model": "m", "device": "cpu"}))[0]
    assert cpu.env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    gpu = plan_launch(WorkersConfig.model_validate({"model": "m", "device": "gpu"}))[0]
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in gpu.env
    back = plan_launch(WorkersConfig.model_validate(
        {"model": "m", "device": "cpu", "settings": {"env": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}}}))[0]
    assert back.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
