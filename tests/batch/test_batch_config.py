"""Bad config files: a clear error naming the file and the field, exit code 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentbatch.flows.cli import main

CASES = {
    "unknown_field.yaml": ("name: x\nschedulng: {env_slots: 2}\n", "schedulng"),
    "bad_type.yaml": ("scheduling: {env_slots: many}\n", "scheduling.env_slots"),
    "zero.toml": ("[scheduling]\nmax_active_samples = 0\n", "scheduling.max_active_samples"),
    "policy.yaml": ("scheduling: {env_queue: {name: lifo}}\n", "scheduling.env_queue.name"),
    "workload.yaml": ("workload: {kind: nope}\n", "workload.kind"),
    "syntax.yaml": ("name: [unclosed\n", "cannot parse"),
    "list.yaml": ("- a\n- b\n", "top level must be a mapping"),
    "format.ini": ("[x]\n", "unknown config format"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_config_exits_2_and_writes_nothing(name: str, tmp_path: Path, capsys) -> None:
    text, expected = CASES[name]
    path = tmp_path / name
    path.write_text(text)
    db = tmp_path / "store.sqlite"
    code = main(["run", str(path), "--db", f"sqlite:///{db}"])
    err = capsys.readouterr().err
    assert code == 2
    assert str(path) in err and expected in err, err
    assert not db.exists()  # nothing written, not even an empty store


def test_missing_file(tmp_path: Path, capsys) -> None:
    assert main(["run", str(tmp_path / "absent.yaml"), "--db", f"sqlite:///{tmp_path / 's.sqlite'}"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_bad_workload_params_write_nothing(tmp_path: Path, capsys) -> None:
    path = tmp_path / "cats.yaml"
    path.write_text("workload: {kind: bfcl, params: {categories: [multi_turn_nope]}}\n")
    db = tmp_path / "s.sqlite"
    assert main(["run", str(path), "--db", f"sqlite:///{db}"]) == 2
    assert "multi_turn_nope" in capsys.readouterr().err
    assert not db.exists()


def test_resume_unknown_batch(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "s.sqlite"
    assert main(["resume", "99", "--db", f"sqlite:///{missing}"]) == 2
    assert "no store at" in capsys.readouterr().err and not missing.exists()  # resume never creates one
    from agentbatch.db.store import Store

    Store(f"sqlite:///{missing}").close()
    assert main(["resume", "99", "--db", f"sqlite:///{missing}"]) == 2
    assert "no batch 99" in capsys.readouterr().err


def test_strict_types_and_whole_config_in_one_pass(tmp_path: Path, capsys) -> None:
    path = tmp_path / "many.yaml"
    path.write_text("name: x\nscheduling: {env_slots: true}\nlimits: {step_timeout_s: .inf}\n"
                    "engine: {params: {workers: 0}}\nworkload: {params: {limt: 2}}\n")
    assert main(["run", str(path), "--db", f"sqlite:///{tmp_path / 's.sqlite'}"]) == 2
    err = capsys.readouterr().err
    # the schema's problems first; the plugins' params are checked once the schema holds
    assert "scheduling.env_slots" in err and "limits.step_timeout_s" in err and "Traceback" not in err
    path.write_text("name: x\nengine: {params: {workers: 0}}\nworkload: {params: {limt: 2}}\n")
    assert main(["run", str(path), "--db", f"sqlite:///{tmp_path / 's.sqlite'}"]) == 2
    err = capsys.readouterr().err
    assert "engine.params.workers" in err and "workload.params.limt" in err and "2 problem(s)" in err
