"""`python -m benchmarks.simulator <command>`

  predict    ESTP/EGTP predictions for every dataset prompt (cached; torch prefill)
  calibrate  measure a vLLM engine's step times, fit the step-time model (vLLM)
  sweep      routing gains vs predictor accuracy (a blurred oracle beside the heads),
             simulator_accuracy_sweep.{json,md,png}
  validate   replay the real runs' per-request records (benchmarks/results/runs/, rollout_requests.jsonl),
             fit on some, judge the others: simulator_validation.{json,md}, continuous.json's validation

predict and calibrate run the real model: run them alone on a shared machine. `sweep` only
simulates.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _validate(args) -> None:
    from fnmatch import fnmatch

    from benchmarks import parts
    from benchmarks.continuous import report
    from benchmarks.replay.runs import RUNS, read_run
    from benchmarks.simulator.setup import load_setup
    from benchmarks.simulator.validation import load_runs, validate, write

    runs = load_runs(RUNS, args.out / "rollout_requests.jsonl")
    fit = [name for name in runs if any(fnmatch(name, pattern) for pattern in args.fit)]
    records = {name: read_run(name) for name in fit if runs[name].kind == "online"}
    result = validate(load_setup(), runs, fit, records)
    write(result, args.out)
    parts.update(args.out, "continuous", report.markdown, report.plot, validation={
        "fit_runs": result["fit_runs"], "held_out_runs": result["held_out_runs"],
        "aggregate_error": {k: v["signed"] for k, v in result["aggregate"].items()},
        "aggregate_absolute_error": {k: v["absolute"] for k, v in result["aggregate"].items()},
        "noise_floor": result["noise_floor"],
        "sign_agreement": {k: result["sign_agreement"][k] for k in ("agree", "of")},
        "probed": {"runs": result["probed_held_out_runs"], "reference_step_s": result["fit"]["references"],
                   "absolute_error": {k: v["absolute"] for k, v in (result["aggregate_probed"] or {}).items()},
                   "unscaled_absolute_error": {k: v["absolute"]
                                               for k, v in (result["aggregate_probed_unscaled"] or {}).items()}}})
    print(json.dumps({k: result[k] for k in ("fit", "aggregate", "sign_agreement")}, indent=1)[:3000])


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulator", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("predict", help="ESTP/EGTP predictions for every dataset prompt (cached)")
    p.add_argument("--threads", type=int, default=2)
    sub.add_parser("calibrate", help="measure vLLM step times, fit the step-time model")
    p = sub.add_parser("validate", help="the simulator against the real runs -> simulator_validation.*")
    p.add_argument("--fit", nargs="+", default=["dataset_burst/*/r0", "rollout/*/r0", "load_poisson@0.8/ray_default/r0",
                                                "dataset_burst_fixed/ray_default/r0", "dataset_burst_fixed/last_work/r0",
                                                "load_fixed_poisson@1.1/*/r0"],
                   help="the runs the step-time factors are fitted on (shell patterns); the rest are held out. "
                        "The fixed-length pair ran on a machine 3-4x slower by its probe: without a probed run in "
                        "the fit, probed runs are timed against the model's own guess of the probe. The 110%% "
                        "pair's first repeat brings probed half-full batches: with bursts alone the step's split "
                        "into fixed and per-sequence cost was the one calm run's, from an unprobed machine")
    p.add_argument("--out", type=Path, default=RESULTS)
    p = sub.add_parser("sweep", help="routing gains vs predictor accuracy -> simulator_accuracy_sweep.*")
    p.add_argument("--replicas", type=int, default=100)
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--load", type=float, default=0.8)
    p.add_argument("--modes", nargs="+", default=["open", "batch"], choices=["open", "batch"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--sizing", default="work", choices=["even", "work"])
    p.add_argument("--noise", type=float, nargs="+", help="log-normal widths for the blurred oracle")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.command == "predict":
        from benchmarks.simulator.calibrate import stack_model
        from benchmarks.simulator.predictions import predict_all

        config, _ = stack_model()
        print(json.dumps(predict_all(config.predictor.max_prompt_tokens, config.predictor.truncate_prompt_tokens,
                                     threads=args.threads)))
    elif args.command == "calibrate":
        from benchmarks.simulator.calibrate import calibrate

        print(json.dumps(calibrate(), indent=1))
    elif args.command == "validate":
        _validate(args)
    elif args.command == "sweep":
        from benchmarks.simulator.setup import load_setup
        from benchmarks.simulator.sweep import NOISE, sweep, write

        result = sweep(load_setup(), args.replicas, args.requests, args.load, args.modes, args.batch_size, args.sizing,
                       tuple(args.noise or NOISE), seed=args.seed, workers=args.workers)
        write(result, args.out)
        print(json.dumps({m: r["break_even_accuracy"] for m, r in result["modes"].items()}))


if __name__ == "__main__":
    main()
