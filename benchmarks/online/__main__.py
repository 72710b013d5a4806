"""`python -m benchmarks.online <command>`: how well a head learned from served traffic predicts.

  offline  replay the dataset through predictor.online's learner: learning curve, drift, the
           install rule without recency weights ("recency") and an ablation of the learner's
           design choices; --parts picks some (features from the shared cache, extracted once on
           one thread if missing)
  real     a cold start on the real stack (predictor.checkpoint: online): held-out ShareGPT traffic at
           a calm load, when the learned head is trusted, live error per 100 requests, then the same
           trace with learning off (throughput, TTFT); about 1 h here
  report   rebuild online.{md,png} from online.json; --note TEXT (repeatable) sets the reading of
           the figures that the report prints (a rerun of offline clears it: the figures changed)

Each command replaces its own part of benchmarks/results/online.json and rewrites the report.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from benchmarks import parts as parts_file
from benchmarks.online import report

RESULTS = Path(__file__).resolve().parents[1] / "results"
CHECKPOINTS = [50, 100, 200, 300, 500, 1000, 1500, 2000, 2500, 3000]
DRIFT_CHECKPOINTS = [0, 25, 50, 100, 150, 200, 300, 400, 500, 600, 700, 800, 1000, 1200]
DRIFTS = {"chat_to_rl": ("chat", "rl"), "rl_to_chat": ("rl", "chat")}
PARTS = ("learning_curve", "drift", "recency", "ablation")


def references(results: Path, requests) -> dict:
    """The offline head's cross-validated MAE and the noise floors, averaged over scenarios as the
    accuracy benchmark reports them and weighted by this dataset's traffic mix as the replay sees it."""
    accuracy = json.loads((results / "predictor_accuracy.json").read_text())
    forelen = json.loads((results / "forelen_dataset.json").read_text())
    mix = {s: sum(r.scenario == s for r in requests) / len(requests) for s in {r.scenario for r in requests}}
    weighted = lambda per: sum(mix[s] * per[s] for s in mix)  # noqa: E731
    best = accuracy["toward_ceiling"]["last_ens5"]
    return {"offline_cv_mae": best["avg"]["mae"],
            "offline_cv_mae_traffic_weighted": weighted({s: best[s]["mae"] for s in mix}),
            "offline_cv_mae_by_scenario": {s: best[s]["mae"] for s in sorted(mix)},
            "noise_floor_traffic_weighted": {
                "in_sample": weighted(forelen["noise_floor_mae"]),
                "leave_one_out": weighted(accuracy["noise_floor_mae_leave_one_out"])},
            "noise_floor_mae": forelen["noise_floor_mae"], "traffic_mix": mix}


def _offline(args) -> dict:
    from benchmarks.online.features import load_requests
    from benchmarks.online.stream import ablation, drift, learning_curve
    from predictor.fit import FitConfig
    from predictor.head import LengthBins
    from predictor.online import OnlineLearner, online_bins
    from predictor.online.learner import RECIPE

    torch.set_num_threads(1)
    requests, dataset = load_requests()
    max_tokens, extraction = dataset["max_tokens"], dataset["extraction"]
    fit = RECIPE.fit if args.members is None else FitConfig.model_validate({**RECIPE.fit.model_dump(),
                                                                          "members": args.members})

    def make_learner(state_dir: Path, **changes) -> OnlineLearner:
        return OnlineLearner(state_dir, requests[0].vector.numel(), **{
            "capacity": args.capacity, "floor": args.floor, "model_id": dataset["model_id"],
            "model_hash": dataset["model_hash"], "max_tokens": max_tokens, "heldout_share": args.heldout_share,
            "recency_half_life": args.half_life, "fit": fit, **changes})

    settings = {"seeds": args.seeds, "window": args.window, "drift_window": args.drift_window,
                "capacity": args.capacity, "floor": args.floor, "recency_half_life": args.half_life,
                "recipe": f"last_ens5 (members {fit.members})", "bins": "log-spaced with a spike bin at the cap",
                "bin_edges": online_bins(max_tokens).edges, "heldout_share": args.heldout_share,
                "drift_warmup_every": args.warmup_every, "max_tokens": max_tokens}
    parts = {"settings": settings, "notes": []}
    minutes = parts_file.load(args.out, "online").get("run_minutes", {})
    for part in args.parts:
        start = time.perf_counter()
        if part == "learning_curve":
            curve = learning_curve(requests, make_learner, args.seeds, args.checkpoints, args.window, max_tokens)
            parts[part] = {**references(args.out, requests), **curve}
            seconds = {str(round(p["samples"])): p["refit_seconds"] for p in curve["points"]}
            seconds[str(args.capacity)] = refit_at_capacity(make_learner, requests, args.capacity, max_tokens)
            parts["refit_seconds"] = seconds
        elif part in ("drift", "recency"):
            plain = part == "recency"  # the install rule without recency weights, on the chat-to-RL switch
            parts[part] = {name: drift(requests, before, after,
                                       partial(make_learner, recency_half_life=None) if plain else make_learner,
                                       args.seeds, args.warmup_every, args.drift_checkpoints, args.drift_window,
                                       max_tokens)
                           for name, (before, after) in DRIFTS.items() if not plain or name == "chat_to_rl"}
        else:
            variants = {
                "default": lambda d, seen: make_learner(d),
                "survival likelihood at the cap": lambda d, seen: make_learner(d, cap_as_exact=False),
                "quantile bins of the requests seen": lambda d, seen: make_learner(
                    d, bins=LengthBins.from_lengths([r.tokens for r in seen], k=20, max_tokens=max_tokens)),
            }
            parts[part] = ablation(requests, variants, args.seeds[:2], [300, 1000, 3000], 800, max_tokens)
        minutes[part] = (time.perf_counter() - start) / 60
    parts["run_minutes"] = minutes
    if extraction["extracted"]:
        parts["feature_extraction"] = extraction
    return parts_file.update(args.out, "online", report.markdown, report.plot, **parts)


def refit_at_capacity(make_learner, requests, capacity: int, max_tokens: int) -> float:
    """Seconds of one refit of a full reservoir (requests repeated under new ids to fill it)."""
    import tempfile

    from benchmarks.online.stream import feed

    filler = [replace(r, request_id=f"{r.request_id}/{i}", prompt_id=f"{r.prompt_id}/{i}")
              for i in range(capacity // len(requests) + 1) for r in requests][:capacity]
    with tempfile.TemporaryDirectory() as tmp:
        learner = make_learner(Path(tmp))
        feed(learner, filler, max_tokens)
        return learner.refit().seconds


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(prog="python -m benchmarks.online", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    o = sub.add_parser("offline")
    o.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                   help="which parts to (re)compute; the others stay as they are in online.json")
    o.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    o.add_argument("--checkpoints", type=int, nargs="+", default=CHECKPOINTS)
    o.add_argument("--drift-checkpoints", type=int, nargs="+", default=DRIFT_CHECKPOINTS)
    o.add_argument("--warmup-every", type=int, default=400, help="refits while learning the traffic before a switch")
    o.add_argument("--window", type=int, default=500, help="requests each refit is scored on (learning curve)")
    o.add_argument("--drift-window", type=int, default=300, help="the same before a drift's switch")
    o.add_argument("--half-life", type=float, default=300.0, help="recency half-life of the install rule")
    o.add_argument("--capacity", type=int, default=4096)
    o.add_argument("--floor", type=float, default=0.55)
    o.add_argument("--heldout-share", type=float, default=0.2)
    o.add_argument("--members", type=int, help="ensemble size (default: last_ens5's)")
    live = sub.add_parser("real")
    live.add_argument("--requests", type=int, default=600)
    live.add_argument("--load", type=float, default=0.8,
                      help="arrival rate as a share of the capacity the dataset bursts measured")
    live.add_argument("--dispatched-share", type=float, default=0.5,
                      help="requests dispatched at once that are predicted for learning anyway")
    live.add_argument("--compare", type=int, help="requests (the trace's first) replayed with learning off (default: all)")
    live.add_argument("--rate", type=float, help="requests/s (default: --load x the capacity the fixed-length bursts measured)")
    r = sub.add_parser("report")
    r.add_argument("--note", action="append", help="a line of the report's reading of the figures")
    for sp in (o, live, r):
        sp.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.command == "report" and args.note:
        parts_file.update(args.out, "online", report.markdown, report.plot, notes=args.note)
    elif args.command == "report":
        parts_file.write(args.out, "online", parts_file.load(args.out, "online"), report.markdown, report.plot)
    elif args.command == "real":
        from benchmarks.online.real import cold_start
        from benchmarks.workloads import burst_capacity_rps

        rate = args.rate or args.load * burst_capacity_rps()
        parts_file.update(args.out, "online", report.markdown, report.plot,
                          real=cold_start(args.requests, rate, args.dispatched_share, args.compare))
    else:
        _offline(args)


if __name__ == "__main__":
    main()
