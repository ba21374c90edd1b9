"""`agentbatch serve-sim`: the simulated engine behind an OpenAI-compatible HTTP server, in real time."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve-sim",
        help="serve the simulated engine over the OpenAI HTTP API (real time)",
        description="Serve a simulated engine worker (continuous batching, paged KV with prefix caching, "
        "recurrent-state slots, preemption) as an OpenAI-compatible endpoint on 127.0.0.1: "
        "/v1/chat/completions, /v1/models, /health, /metrics (vLLM metric names). Point live batches or "
        "other tools at http://127.0.0.1:PORT/v1.",
    )
    p.add_argument(
        "--profile", default="llama3-8b-h100", help="profile name or a profile JSON (agentbatch calibrate)"
    )
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--workers-name", default="sim-0", help="worker name reported in responses (default sim-0)"
    )
    p.add_argument(
        "--served-model-name", default=None, help="model id of /v1/models (default: the profile name)"
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="wall seconds per engine second (<1: faster than real time)",
    )
    p.add_argument(
        "--scheduling-policy", choices=["priority", "fcfs"], default="priority",
        help="as vLLM's --scheduling-policy (default priority: requests' `priority` is honoured)",
    )  # fmt: skip
    p.add_argument(
        "--default-max-tokens", type=int, default=64, help="output length when a request sets none"
    )
    p.add_argument("--num-kv-blocks", type=int, default=None, help="override the profile's KV cache size")
    p.add_argument(
        "--max-num-seqs", type=int, default=None, help="override the profile's max running sequences"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from agentbatch.engines.sim_server import SimServer, serve
    from agentbatch.flows.commands._common import fail

    overrides = {}
    if args.num_kv_blocks:
        overrides["num_kv_blocks"] = args.num_kv_blocks
    if args.max_num_seqs:
        overrides["max_num_seqs"] = args.max_num_seqs
    try:
        server = SimServer(
            args.profile,
            time_scale=args.time_scale,
            worker_name=args.workers_name,
            served_model_name=args.served_model_name,
            policy=args.scheduling_policy,
            default_max_tokens=args.default_max_tokens,
            **overrides,
        )
    except (ValueError, OSError) as exc:
        return fail(str(exc))
    p = server.profile
    print(
        f"agentbatch serve-sim: {p.name} ({p.description or 'custom profile'}) as model {server.model_name!r} "
        f"on http://{args.host}:{args.port}/v1, time scale {args.time_scale}, "
        f"{p.num_kv_blocks} KV blocks of {p.block_size}, max {p.max_num_seqs} sequences",
        flush=True,
    )
    try:
        serve(server, host=args.host, port=args.port)
    except KeyboardInterrupt:
        pass
    return 0
