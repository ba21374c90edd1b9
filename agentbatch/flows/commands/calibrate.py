"""`agentbatch calibrate`: fit the simulated engine's cost model to measured request timings."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="fit a simulated-engine profile to measured request timings",
        description="Fit the cost model of a simulated-engine profile (iteration time = c0 + c_prefill x prefill "
        "tokens + c_decode x decoding sequences + c_attn x attended context + c_prefill_attn x prefill attention "
        "pairs) by least squares to the inference steps of a recorded batch (e.g. one run against a real vLLM "
        "server), or to a CSV / Parquet table of request timings. Writes a profile JSON that --profile options "
        "and the 'simulated' timing model accept.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--batch", type=int, help="batch id in the store whose inference steps to fit")
    src.add_argument(
        "--timings", metavar="FILE",
        help="CSV or Parquet with prompt_tokens, output_tokens, started_at, finished_at and optionally "
        "cached_prompt_tokens, prefill_s, decode_s, engine_queue_s, worker",
    )  # fmt: skip
    p.add_argument(
        "--db",
        metavar="URL",
        default=None,
        help="store URL (default: AGENTBATCH_DB_URL or ./agentbatch.sqlite)",
    )
    p.add_argument(
        "--base", default="llama3-8b-h100", help="profile whose memory settings to keep (name or JSON)"
    )
    p.add_argument("--out", required=True, help="where to write the fitted profile (JSON)")
    p.add_argument("--name", default=None, help="name of the fitted profile (default: BASE-calibrated)")
    p.add_argument(
        "--prior-strength", type=float, default=1e-3,
        help="pull towards the base coefficients, for coefficients the data cannot pin down (default 1e-3)",
    )  # fmt: skip
    p.add_argument(
        "--check", action="store_true",
        help="re-run the measured requests through the fitted profile and print the latency error",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from agentbatch.flows.commands._common import fail
    from agentbatch.sim.calibrate import fit_cost_model, timings_from_file, timings_from_store
    from agentbatch.sim.profiles import get_profile, save_profile

    try:
        base = get_profile(args.base)
    except ValueError as exc:
        return fail(str(exc))
    try:
        if args.timings:
            timings = timings_from_file(args.timings)
        else:
            from agentbatch.db.store import Store

            store = Store(args.db)
            try:
                if store.get_batch(args.batch) is None:
                    return fail(f"no batch {args.batch} in {store.url}")
                timings = timings_from_store(store, args.batch)
            finally:
                store.close()
        fit = fit_cost_model(timings, base, prior_strength=args.prior_strength)
    except ValueError as exc:
        return fail(str(exc))
    profile = fit.profile if not args.name else fit.profile.replace(name=args.name)
    fit.profile = profile
    print(fit.to_text())
    extra = {"fit": {k: v for k, v in fit.to_dict().items() if k != "profile"}}
    if args.check:
        from agentbatch.sim.calibrate import compare_to_measured

        for label, prof in (("base", base), ("fitted", profile)):
            c = compare_to_measured(prof, timings)
            extra[f"check_{label}"] = c
            print(
                f"  re-run with the {label} profile: per-request latency MAPE {c['latency_mape']:.1%}, "
                f"median simulated/measured {c['latency_median_ratio']:.3f}, total {c['total_latency_ratio']:.3f}, "
                f"cached tokens {c['cached_tokens_ratio']:.3f}"
            )
    save_profile(profile, args.out, extra=extra)
    print(
        f"wrote {args.out} (use it as --profile {args.out} or {{'kind': 'simulated', 'profile': '{args.out}'}})"
    )
    return 0
