"""`python -m benchmarks.continuous <command>`: where length predictions pay under continuous batching.

  sim      the simulator at 10/100/1,000 replicas x loads x arrival processes x policies (~1 h here)
  design   the sweeps behind the router's defaults: aging bound, ranking statistic, replica choice
  bare     held-out ShareGPT prompts, 24 in flight, on a bare vLLM server and on the stack (what the
           stack costs or buys; ~30 min here)
  burst    128 dataset val/test requests at once onto the default stack: ray_default, last_work,
           ceiling, oracle_work (and on request last_told: the head's order without its prefill),
           3 interleaved repeats (~10 min a run); per-request records in benchmarks/results/runs/,
           resumable
  lean     the same burst, ray_default against last_work, with the lean predictor
  fixed    the same burst with every answer held to its sample's length, the router not told:
           the policies meet the same workload (default ray_default and last_work)
  estp     the fixed-length burst, ray_default against estp_work: ESTP's own head, on a stack
           serving that head alone
  early    the same burst, ray_default against early_work: the last token's head at layer 4 of 30
           (the prefill stops there), on a stack serving that head alone (--trace sharegpt: the
           ShareGPT burst)
  stock    the same burst on Ray Serve LLM's own OpenAI app with the same engines (its own process:
           one Ray driver per cluster)
  sharegpt the same with 128 held-out ShareGPT prompts: ray_default against last_work
  load     300 val/test requests at fixed lengths arriving at a share of the session's capacity
           (a probe scales the fixed bursts' capacity; Poisson, Azure-like): ray_default against
           last_work, 3 interleaved repeats, resumable (the trace's capacity is kept beside its runs)
  simburst the simulator, validated against the real runs, on bursts of 4x the slots at 2, 4, 10
           and 100 replicas (10 seeds each)
  report   rebuild continuous.{md,png} from continuous.json

Each command replaces its own part of benchmarks/results/continuous.json and rewrites the report,
so the parts can run at different times (and a failed one rerun alone). `sim` and `design` only
simulate (run `python -m benchmarks.simulator predict` after retraining a head); `real` needs the
whole machine.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import asdict
from functools import partial
from pathlib import Path

from benchmarks import parts as parts_file
from benchmarks.continuous import report, simulated

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _update(out: Path, **parts) -> dict:
    return parts_file.update(out, "continuous", report.markdown, report.plot, **parts)


def _bare(args) -> dict:
    """The held-out ShareGPT burst, a fixed number in flight, against a bare vLLM server and the stack."""
    import ray
    from transformers import AutoTokenizer

    from benchmarks.continuous import real
    from benchmarks.replay.__main__ import drain
    from benchmarks.replay.actors import connect, spawn_actors
    from benchmarks.replay.stack import RunningStack
    from predictor.model_files import resolve_model_source

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source("embedded"))
    burst_trace = real.held_out_chat(tokenizer)
    # The bare server first: its few minutes tell early whether the long stack part can be compared.
    with tempfile.TemporaryDirectory() as tmp, real.bare_vllm(Path(tmp)) as url:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        actors = spawn_actors(url, args.actors, 1800)
        bare = real.burst_summary(real.closed_loop(url, burst_trace, actors, real.BURST_INFLIGHT, "bare_vllm"))
        ray.shutdown()
    _update(args.out, bare_vllm={"throughput_tok_s": bare["throughput_tok_s"]})
    with tempfile.TemporaryDirectory() as tmp:
        with RunningStack(Path(tmp), {"router": {"benchmark_headers": True}}) as stack:
            os.environ["RAY_ADDRESS"] = "auto"
            connect()
            actors = spawn_actors(stack.base_url, args.actors, 1800)
            bursts = {}
            for mode in ("waiting", "all"):  # predict only requests that wait, or every one (its CPU cost)
                drain(stack.base_url)
                records = real.closed_loop(stack.base_url, burst_trace, actors, real.BURST_INFLIGHT, f"stack/{mode}",
                                           policy=args.policy, extra_headers={"X-Predict": mode})
                bursts[mode] = real.burst_summary(records)
            ray.shutdown()
    stack_burst = bursts["waiting"]
    ratio = lambda a, b: None if not a or not b else a / b
    return _update(
        args.out,
        burst={"requests": len(burst_trace), "stack": stack_burst, "stack_predict_all": bursts["all"],
               "bare_vllm": bare, "fallback_rate": stack_burst["fallback_rate"],
               "p50_ttft_ratio_vs_bare": ratio(stack_burst["p50_ttft_s"], bare["p50_ttft_s"])},
        bare_vllm={"throughput_ratio": ratio(stack_burst["throughput_tok_s"], bare["throughput_tok_s"]),
                   "throughput_tok_s": bare["throughput_tok_s"]},
    )


def _runs(args, name: str, trace, policies: list[str], traces: dict | None = None) -> None:
    """Each repeat's policies back to back on one default stack (benchmark headers, request log on,
    the heads of these policies only);
    runs already on disk are skipped; continuous.json's bursts are rewritten after every run.
    `trace`: the requests, or a function of the running stack's (base_url, actors) that makes them
    (a load's rate needs the machine probed); `traces`: a run label's own trace, run as the router
    policy bursts.TOLD_AS names."""
    from benchmarks.continuous import bursts
    from benchmarks.replay.__main__ import drain
    from benchmarks.replay.actors import connect, spawn_actors
    from benchmarks.replay.runs import execute, run_path
    from benchmarks.replay.stack import RunningStack

    todo = [(k, p) for k in range(args.repeats) for p in policies if not run_path(f"{name}/{p}/r{k}").exists()]
    if not todo:
        return
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "requests.jsonl"
        with RunningStack(Path(tmp), bursts.stack_overrides(policies, log)) as stack:
            os.environ["RAY_ADDRESS"] = "auto"
            connect()
            actors = spawn_actors(stack.base_url, args.actors, bursts.RUN_TIMEOUT_S)
            if callable(trace):
                trace = trace(stack.base_url, actors)
            for k, policy in todo:
                drain(stack.base_url)
                execute(f"{name}/{policy}/r{k}", stack.base_url, actors, (traces or {}).get(policy, trace),
                        bursts.TOLD_AS.get(policy, policy), log)
                _write_runs(args)
            import ray

            ray.shutdown()


def _stock(args, name: str, trace) -> None:
    """Ray Serve LLM's own app on the same trace (its router, its ingress, the same engines)."""
    import ray
    import yaml

    from benchmarks.continuous import bursts
    from benchmarks.replay.actors import connect, spawn_actors
    from benchmarks.replay.runs import execute, run_path
    from benchmarks.replay.stack import REPO, RunningStack
    from router.serving.config import StackConfig

    todo = [k for k in range(args.repeats) if not run_path(f"{name}/{bursts.STOCK}/r{k}").exists()]
    if not todo:
        return
    app = yaml.safe_load((REPO / "ray_config.yaml").read_text())["applications"][0]
    application = bursts.stock_application(StackConfig.model_validate(app["args"]), app.get("runtime_env", {}))
    with tempfile.TemporaryDirectory() as tmp, RunningStack(Path(tmp), application=application) as stack:
        os.environ["RAY_ADDRESS"] = "auto"
        connect()
        actors = spawn_actors(stack.base_url, args.actors, bursts.RUN_TIMEOUT_S)
        for k in todo:
            execute(f"{name}/{bursts.STOCK}/r{k}", stack.base_url, actors, trace, None, None, label=bursts.STOCK)
            _write_runs(args)
        ray.shutdown()


def _probed_load(name: str, process: str, share: float, requests: int, base_url: str, actors: list) -> list:
    """A load workload's trace on the running stack: its first run probes the machine for the capacity."""
    from benchmarks.continuous import bursts
    from benchmarks.replay.actors import START_LEAD_S
    from benchmarks.replay.probe import measure

    probe = lambda: measure(base_url, actors, f"{name}/capacity", START_LEAD_S)["step_s"]
    return bursts.load_trace(name, process, share, requests, probe)


def _sharegpt_burst():
    """128 held-out ShareGPT first turns, at once."""
    from transformers import AutoTokenizer

    from benchmarks.continuous import bursts, real
    from predictor.model_files import resolve_model_source

    return real.held_out_chat(AutoTokenizer.from_pretrained(resolve_model_source("embedded")), n=bursts.BURST)


def _write_runs(args) -> dict:
    """continuous.json's `bursts` from every run on disk."""
    from benchmarks.continuous import bursts
    from benchmarks.replay.probe import read_probe
    from benchmarks.replay.runs import read_run, run_path, summary

    def table(name: str, policies, observed: bool) -> dict | None:
        repeats = []
        for k in range(bursts.repeats_on_disk(name)):
            rep = {}
            for p in policies:
                run = f"{name}/{p}/r{k}"
                if run_path(run).exists():
                    records = read_run(run)
                    probe = read_probe(run_path(run))
                    rep[p] = {**bursts.keep(summary(bursts.observed_lengths(records) if observed else records)),
                              "probe_step_s": probe.run_step_s if probe else None}
            if rep:
                repeats.append(rep)
        if not repeats:
            return None
        changes = {p: {m: bursts.spread(repeats, p, m) for m in ("mean_jct_s", "short_p99_jct_s", "p99_jct_s",
                                                                  "mean_ttft_s", "throughput_tok_s")}
                   for p in policies if p != "ray_default" and any(p in rep for rep in repeats)}
        return {"requests": sum(rep[p]["completed"] + rep[p]["failed"] for p in rep) // len(rep)
                if (rep := repeats[0]) else 0, "repeats": repeats, "changes_vs_ray_default": changes,
                "lost_requests": sum(rep[p]["failed"] for rep in repeats for p in rep)}

    blocks = {
        "real": table("dataset_burst", (*bursts.DATASET_POLICIES, bursts.HEAD_TOLD, bursts.STOCK), False),
        "real_lean": table(bursts.LEAN, bursts.LEAN_POLICIES, False),
        "real_fixed": table(bursts.FIXED, bursts.DATASET_POLICIES, False),
        "real_fixed_estp": table(bursts.FIXED_ESTP, bursts.ESTP_POLICIES, False),
        "real_early": table(bursts.EARLY, bursts.EARLY_POLICIES, False),
        "sharegpt_early": table(bursts.EARLY_SHAREGPT, bursts.EARLY_POLICIES, True),
        "sharegpt": table("sharegpt_burst", ("ray_default", "last_work"), True),
    }
    current = parts_file.load(args.out, "continuous")
    loads = {name.removeprefix("load_"): table(name, ("ray_default", "last_work", "estp_work"), False)
             for name in bursts.run_names("load_")}
    loads = {k: {**v, **bursts.kept_capacity(f"load_{k}")} for k, v in loads.items() if v}
    return _update(args.out, bursts={**current.get("bursts", {}), **{k: v for k, v in blocks.items() if v}},
                   **({"real": loads} if loads else {}))


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(prog="python -m benchmarks.continuous", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sim")
    s.add_argument("--replicas", type=int, nargs="+", default=list(simulated.REPLICAS))
    s.add_argument("--loads", type=float, nargs="+", default=list(simulated.LOADS))
    s.add_argument("--arrivals", nargs="+", default=list(simulated.ARRIVALS))
    s.add_argument("--policies", nargs="+", default=list(simulated.GRID_POLICIES))
    d = sub.add_parser("design")
    d.add_argument("--replicas", type=int, default=simulated.DESIGN_REPLICAS)
    for sp in (s, d):
        sp.add_argument("--workers", type=int, default=2)
        sp.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("bare")
    r.add_argument("--policy", default="last_work")
    r.add_argument("--actors", type=int, default=2)
    b = sub.add_parser("burst")
    b.add_argument("--policies", nargs="+", default=["ray_default", "last_work", "ceiling", "oracle_work"],
                   help="router policies, or last_told: last_work's order with its offline predictions told up front")
    ln = sub.add_parser("lean", help="the dataset burst, ray_default against last_work, with the lean predictor")
    fx = sub.add_parser("fixed", help="the dataset burst, every answer held to its sample's length")
    fx.add_argument("--policies", nargs="+", default=["ray_default", "last_work"],
                    choices=["ray_default", "last_work", "ceiling", "oracle_work"])
    es = sub.add_parser("estp", help="the fixed-length burst, ray_default against estp_work (ESTP's head)")
    ea = sub.add_parser("early", help="the dataset burst, ray_default against early_work (the layer-4 head)")
    ea.add_argument("--trace", choices=["dataset", "sharegpt"], default="dataset")
    k = sub.add_parser("stock")
    g = sub.add_parser("sharegpt")
    g.add_argument("--policies", nargs="+", default=["ray_default", "last_work"])
    lo = sub.add_parser("load")
    lo.add_argument("--policies", nargs="+", default=["ray_default", "last_work"])
    lo.add_argument("--arrivals", nargs="+", default=["poisson", "azure"])
    lo.add_argument("--shares", type=float, nargs="+", default=[0.95], help="of the capacity at the session's probe")
    lo.add_argument("--requests", type=int, default=300)
    for sp in (b, ln, fx, es, ea, k, g, lo):
        sp.add_argument("--repeats", type=int, default=3)
        sp.add_argument("--actors", type=int, default=2)
    sb = sub.add_parser("simburst")
    sb.add_argument("--replicas", type=int, nargs="+", default=list(simulated.BURST_REPLICAS))
    sb.add_argument("--seeds", type=int, default=10)
    sb.add_argument("--workers", type=int, default=2)
    sub.add_parser("report")
    for sp in (s, d, r, b, ln, fx, es, ea, k, g, lo, sb):
        sp.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    out = getattr(args, "out", RESULTS)
    if args.command == "report":
        parts_file.write(out, "continuous", parts_file.load(out, "continuous"), report.markdown, report.plot)
        return
    if args.command == "bare":
        _bare(args)
        return
    if args.command == "burst":
        from benchmarks.continuous import bursts

        trace = bursts.dataset_burst()
        _runs(args, "dataset_burst", trace, args.policies, {bursts.HEAD_TOLD: bursts.told_head(trace)})
        _write_runs(args)
        return
    if args.command == "fixed":
        from benchmarks.continuous import bursts

        _runs(args, bursts.FIXED, bursts.fixed_lengths(bursts.dataset_burst()), args.policies)
        _write_runs(args)
        return
    if args.command == "estp":
        from benchmarks.continuous import bursts

        _runs(args, bursts.FIXED_ESTP, bursts.fixed_lengths(bursts.dataset_burst()), list(bursts.ESTP_POLICIES))
        _write_runs(args)
        return
    if args.command == "lean":
        from benchmarks.continuous import bursts

        _runs(args, bursts.LEAN, bursts.dataset_burst(), list(bursts.LEAN_POLICIES))
        _write_runs(args)
        return
    if args.command == "early":
        from benchmarks.continuous import bursts

        if args.trace == "dataset":
            _runs(args, bursts.EARLY, bursts.dataset_burst(), list(bursts.EARLY_POLICIES))
        else:
            _runs(args, bursts.EARLY_SHAREGPT, _sharegpt_burst(), list(bursts.EARLY_POLICIES))
        _write_runs(args)
        return
    if args.command == "stock":
        from benchmarks.continuous import bursts

        _stock(args, "dataset_burst", bursts.dataset_burst())
        _write_runs(args)
        return
    if args.command == "sharegpt":
        _runs(args, "sharegpt_burst", _sharegpt_burst(), args.policies)
        _write_runs(args)
        return
    if args.command == "load":
        from benchmarks.continuous import bursts

        for share in args.shares:
            for process in args.arrivals:
                name = bursts.load_name(process, share, args.requests)
                _runs(args, name, partial(_probed_load, name, process, share, args.requests), args.policies)
        _write_runs(args)
        return
    from benchmarks.simulator.setup import validated_setup

    setup = validated_setup()
    if args.command == "simburst":
        current = parts_file.load(out, "continuous").get("bursts", {})
        simulated_bursts = simulated.bursts(setup, args.replicas, seeds=args.seeds, workers=args.workers)
        _update(out, bursts={**current, "simulated": simulated_bursts,
                             "simulated_settings": {"seeds": args.seeds, "validated": setup.validated,
                                                    "requests_per_slot": simulated.BURST_PER_SLOT}})
        return
    if args.command == "sim":
        grid = simulated.grid(setup, args.replicas, args.loads, args.arrivals, args.policies, args.workers, args.seed)
        # Runs of other policies or sizes stay: a head retrained reruns only the policies that read it.
        _update(out, simulated=simulated.merge(parts_file.load(out, "continuous").get("simulated", {}), grid),
                simulated_settings={
            "prediction_quality_test_split": setup.prediction_quality("test"),
            "requests_per_size": {str(n): simulated.requests_for(n) for n in args.replicas},
            "layout": simulated.LAYOUT,
            "queue_order": asdict(setup.config.router.queue.order(setup.plan.prior_tokens)),
            "max_ongoing_requests": setup.config.pools[0].deployment.get("max_ongoing_requests")})
    else:
        _update(out, design=simulated.design(setup, args.workers, args.seed, args.replicas))


if __name__ == "__main__":
    main()
