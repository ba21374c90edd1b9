"""A plan as text (the reasoning table, settings, SGLang comparison, recompute curve) or as a JSON document."""

from __future__ import annotations

from typing import Any

from agentbatch.planning.inputs import GIB, Hardware
from agentbatch.planning.model_shape import ModelShape
from agentbatch.planning.resource_model import Plan
from agentbatch.planning.workload import Workload


def _curve_lines(p: Plan) -> list[str]:
    out = [
        "Recompute as a function of concurrency:",
        f"  {'N':>7}  {'cache demand':>12}  {'evicted':>8}  {'returns hit':>11}  {'recompute/step':>14}  {'rate':>7}",
    ]
    for c in p.recompute_curve:
        mark = "  <- N_ref" if c.concurrency == p.reference_concurrency else ""
        mark += "  (running set alone overflows: preemption)" if c.running_overflows else ""
        out.append(
            f"  {c.concurrency:>7,.0f}  {c.demand_gib:>8,.1f} GiB  {c.evicted_fraction:>8.3f}  "
            f"{c.returning_evicted:>11.3f}  "
            f"{c.recompute_tokens_per_step:>14,.0f}  {100 * c.recompute_ratio:>6.2f}%{mark}"
        )
    return out


def render_plan(p: Plan, shape: ModelShape, hw: Hardware, wl: Workload) -> str:
    out = [
        f"agentbatch plan: {shape.name} ({shape.family}{', hybrid' if shape.is_hybrid else ''}) on "
        f"{hw.gpu_mem_bytes / GIB:g} GiB GPU, workload from {wl.source}",
        f"config fields read: {', '.join(shape.fields_read)}",
        "",
        p.table(),
        "",
        f"Reference sample concurrency: {p.reference_concurrency} (bound by {p.binding}; "
        f"N_mem={p.n_mem}, N_busy={p.n_busy}"
        + (f", N_goodput={p.n_goodput}" if p.n_goodput is not None else "")
        + f"); admission limit max_active_samples={p.max_active_samples}",
        f"Expected recompute at N_ref: {p.recompute_tokens_per_step:,.0f} tokens per inference step "
        f"({100 * p.recompute_ratio:.2f} % of prompt tokens)",
        "",
        "vLLM:   " + p.vllm_command(),
        "SGLang: " + p.sglang_command(),
        "",
        "Against SGLang's balance point:",
        *("  - " + line for line in p.comparison),
        "",
        *_curve_lines(p),
    ]
    if p.notes:
        out += ["", "Notes:", *("  - " + n for n in p.notes)]
    return "\n".join(out)


def plan_document(p: Plan, shape: ModelShape) -> dict[str, Any]:
    """The plan as a JSON-ready dict, with the model shape and both launch commands."""
    return p.to_dict() | {
        "model_shape": {
            "name": shape.name,
            "family": shape.family,
            "layers": shape.num_layers,
            "attention_layers": shape.attention_layers,
            "state_layers": shape.state_layer_count,
            "kv_bytes_per_token": shape.kv_bytes_per_token,
            "state_bytes_per_seq": shape.state_bytes_per_seq,
            "weights_bytes": shape.weights_bytes,
            "fields_read": list(shape.fields_read),
        },
        "vllm_command": p.vllm_command(),
        "sglang_command": p.sglang_command(),
    }
