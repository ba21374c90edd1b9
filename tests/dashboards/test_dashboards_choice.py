"""The policy `scheduling.policy: auto` chose (sim/portfolio.py `decide`, stored by the flow as
`scheduling.choice`) in the text summary, summary.json and the report; absent for a batch without one."""

from __future__ import annotations

import json
from pathlib import Path

from dashboards_batches import KNOWN_CONFIG, known_samples, write_batch

from agentbatch.dashboards.analytics import BatchAnalysis
from agentbatch.dashboards.frames import load_batch
from agentbatch.dashboards.report import write_report
from agentbatch.dashboards.sections import choice_html
from agentbatch.dashboards.summary import summarize
from agentbatch.db.store import Store
from agentbatch.sim.portfolio import Member, decide
from agentbatch.sim.virtual_time import VirtualConfig
from agentbatch.sim.virtual_time.simulation import context_priors
from agentbatch.traces import chain_priors, generate


def _real_choice() -> dict:
    """A choice as the flow makes it: every candidate simulated on two earlier runs."""
    earlier = [generate("mcp_like", 8, seed=s, epoch=0) for s in (3, 4)]
    members = [Member(t, chain_priors(t), context_priors(t)) for t in earlier]
    base = VirtualConfig(workers=1, profile="llama3-8b-h100", env_slots=2)
    return decide(members, base, n_ref=4).to_dict()


def _batch_with_choice(store: Store, choice: dict) -> int:
    batch_id = write_batch(store, known_samples(), config=KNOWN_CONFIG, workers=("w0", "w1"))
    config = json.loads(json.dumps(KNOWN_CONFIG))
    config["scheduling"]["choice"] = choice
    store.set_batch_config(batch_id, config)  # as flows/batch.py keeps the choice with the batch
    return batch_id


def _worst(choice: dict, name: str) -> float:
    row = next(r for r in choice["candidates"] if r["name"] == name)
    return max(row["predicted_makespan_s"])


def test_the_choice_is_in_the_summary_summary_json_and_the_report(store: Store, tmp_path: Path) -> None:
    choice = _real_choice()
    choice["rule"] += " <script>alert(1)</script>"  # recorded text is shown, never run
    batch_id = _batch_with_choice(store, choice)

    text = summarize(store, batch_id).to_text()
    line = next(x for x in text.splitlines() if x.startswith("  policy "))
    assert f"auto chose {choice['chosen']} " in line
    assert f"{_worst(choice, choice['chosen']):.1f} s" in line
    assert f"decided in {choice['decide_s']:.2f} s ({choice['simulations']} simulations on 2 earlier" in line
    if choice["chosen"] != choice["fallback"]:
        assert f"best baseline {choice['fallback']} {_worst(choice, choice['fallback']):.1f} s" in line

    index = write_report(store, [batch_id], tmp_path / "r")
    row = json.loads((tmp_path / "r" / "summary.json").read_text())[0]
    got = row["policy_choice"]
    assert got["chosen"] == choice["chosen"] and got["rule"] == choice["rule"]
    assert got["candidates"] == choice["candidates"] and got["decide_s"] == choice["decide_s"]
    assert got["chosen_predicted_s"] == _worst(choice, choice["chosen"])
    assert got["fallback_predicted_s"] == _worst(choice, choice["fallback"])

    page = index.read_text()
    section = page[page.index('<section id="policy-choice">'):]
    section = section[:section.index("</section>")]
    table = section[section.index("<tbody>"):]
    assert table.count("<tr") == len(choice["candidates"])  # every candidate, the cut ones too
    for r in choice["candidates"]:
        assert f"<td>{r['name']}</td>" in table
    assert f'<tr class="good"><td>{choice["chosen"]}</td>' in table
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in section and "<script>alert" not in page


def test_a_batch_without_a_choice_shows_none(store: Store, tmp_path: Path) -> None:
    configured = json.loads(json.dumps(KNOWN_CONFIG))
    configured["scheduling"]["choice"] = {"mode": "auto", "chosen": "configured", "reason": "no earlier batch"}
    plain = write_batch(store, known_samples(), config=KNOWN_CONFIG, workers=("w0", "w1"))
    why_not = write_batch(store, known_samples(), config=configured, workers=("w0", "w1"))
    for batch_id in (plain, why_not):
        assert "auto chose" not in summarize(store, batch_id).to_text()
        assert summarize(store, batch_id).as_json().keys() == summarize(store, batch_id).as_row().keys()
        assert choice_html([BatchAnalysis(load_batch(store, batch_id))]) == ""
    page = write_report(store, [plain], tmp_path / "r").read_text()
    assert 'id="policy-choice"' not in page
    assert "policy_choice" not in json.loads((tmp_path / "r" / "summary.json").read_text())[0]
