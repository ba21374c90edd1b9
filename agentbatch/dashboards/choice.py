"""The policy `scheduling.policy: auto` chose for a batch (flows/policy_choice.py stores it in the
batch config as `scheduling.choice`): one line of the text summary, an entry of summary.json and a
report section. Batches that ran a configured or named policy have no choice, and show none."""

from __future__ import annotations

import html
from typing import Any

from agentbatch.scheduling.portfolio import running_policy_status

_COLUMNS = ("candidate", "baseline", "predicted makespan per earlier run (s)", "worst (s)", "score")


def running_policy(config: dict[str, Any]) -> str:
    """The policy a batch runs, in one phrase (the gateway says it when it opens)."""
    status = running_policy_status(config)
    if status["by"] == "auto":
        return (f"{status['name']!r}, chosen by policy auto ({status['simulations']} simulations on "
                f"{status['members']} earlier run(s); the summary lists every candidate)")
    if status["name"] == "configured":
        return "the configured scheduling" + (" (policy auto could not choose: the log says why)"
                                              if status["by"] == "fallback" else "")
    return repr(status["name"])


def worst_prediction(choice: dict[str, Any], name: str) -> float | None:
    """A candidate's worst predicted makespan over the ensemble (what the minimax rule scores);
    None when it is not listed or was cut in some member (it could not win there)."""
    row = next((r for r in choice["candidates"] if r.get("name") == name), None)
    preds = row.get("predicted_makespan_s") if row else None
    if not preds or any(p is None for p in preds):
        return None
    return max(float(p) for p in preds)


def _s(x: float | None) -> str:
    return "cut" if x is None else f"{x:.1f} s"


def choice_line(choice: dict[str, Any]) -> str:
    """The text summary's `policy` line."""
    chosen, fallback = choice["chosen"], choice["fallback"]
    compare = (f"predicted {_s(worst_prediction(choice, chosen))} vs best baseline {fallback} "
               f"{_s(worst_prediction(choice, fallback))}" if chosen != fallback
               else f"the best baseline, predicted {_s(worst_prediction(choice, chosen))}")
    return (f"  policy        auto chose {chosen} ({compare}, worst earlier run; score {choice['score']} vs "
            f"{choice['fallback_score']}); decided in {choice['decide_s']:.2f} s ({choice['simulations']} "
            f"simulations on {choice['members']} earlier run(s){_harness(choice)}); rule: {choice['rule']}"
            f"{replan_text(choice)}")


def _harness(choice: dict[str, Any]) -> str:
    """How a gateway batch's samples were simulated as arriving (flows/policy_choice.py)."""
    n = choice.get("harness")
    return f", the harness sending {n} samples at a time" if n else ""


def replan_text(choice: dict[str, Any]) -> str:
    """What re-planning while the batch ran did (flows/replan.py): its switches and its cost."""
    switches = choice.get("switches") or []
    done = choice.get("replan")
    if not switches and not isinstance(done, dict):
        return ""
    moves = "; ".join(f"at {sw.get('at_wall_s', sw['at_s']):.1f} s {sw['from']} -> {sw['to']} "
                      f"(remainder predicted x{sw['predicted_ratio']})"
                      for sw in switches)  # fmt: skip
    cost = (f"{done['checkpoints']} checkpoint(s), {done['simulations']} simulations, {done['cpu_s']:.2f} s CPU"
            if isinstance(done, dict) else "")
    return f"; re-planned: {moves or 'no switch'}" + (f" ({cost})" if cost else "")


def choice_json(choice: dict[str, Any]) -> dict[str, Any]:
    """summary.json's `policy_choice`: the stored choice plus both worst predictions side by side."""
    return {**choice, "chosen_predicted_s": worst_prediction(choice, choice["chosen"]),
            "fallback_predicted_s": worst_prediction(choice, choice["fallback"])}


def _row(r: dict[str, Any], chosen: str) -> str:
    preds = r.get("predicted_makespan_s") or []
    cells = (r.get("name"), r.get("baseline") or "",
             ", ".join("cut" if p is None else f"{float(p):.1f}" for p in preds),
             "cut" if any(p is None for p in preds) or not preds else f"{max(float(p) for p in preds):.1f}",
             "cut" if r.get("score") is None else r["score"])
    mark = ' class="good"' if r.get("name") == chosen else ""
    return f"<tr{mark}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"


def choice_html(title: str, key: str, choice: dict[str, Any]) -> str:
    """One batch's choice: the summary line and every candidate's predictions (cut = could not win)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
    rows = "".join(_row(r, choice["chosen"]) for r in choice["candidates"])
    cpu = f", {choice['decide_cpu_s']:.2f} s CPU" if choice.get("decide_cpu_s") is not None else ""
    return (f"<h3>{html.escape(title)}: ran {html.escape(str(choice['chosen']))}</h3>"
            f"<p>Best baseline {html.escape(str(choice['fallback']))}; decided in {choice['decide_s']:.2f} s{cpu} "
            f"({choice['simulations']} simulations on {choice['members']} earlier run(s)). Rule: "
            f"{html.escape(str(choice['rule']))}. A cut prediction stopped where the candidate could no "
            f"longer win.{html.escape(replan_text(choice))}</p><table class=\"figures\" id=\"policy-choice-{html.escape(key)}\">"
            f"<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
