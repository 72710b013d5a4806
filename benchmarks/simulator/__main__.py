"""`python -m benchmarks.simulator <command>`

  predict    ESTP/EGTP predictions for every dataset prompt (cached; torch prefill)
  calibrate  measure a vLLM engine's step times, fit the step-time model (vLLM)
  validate   replay the real runs' per-request records (benchmarks/results/runs/), fit on some,
             judge the others: simulator_validation.{json,md}
  scale      the validated simulator on bursts of 4x the slots at 2 to 100 replicas: simulator_scale.{json,md}

predict and calibrate run the real model: run them alone on a shared machine. `validate` and
`scale` only simulate.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _validate(args) -> None:
    from fnmatch import fnmatch

    from benchmarks.replay.runs import RUNS, read_run
    from benchmarks.simulator.setup import load_setup, saved_fit
    from benchmarks.simulator.validation import load_runs, validate, write

    runs = load_runs(RUNS)
    fit = [name for name in runs if any(fnmatch(name, pattern) for pattern in args.fit)]
    # The fit's hops come from its runs' request logs: a saved fit has them already.
    records = {} if args.saved_fit else {name: read_run(name) for name in fit if runs[name].kind == "online"}
    result = validate(load_setup(), runs, fit, records, saved_fit() if args.saved_fit else None)
    write(result, args.out)
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
    p.add_argument("--fit", nargs="+", default=["legacy/dataset_burst/*/r0", "rollout_schedules/*/r0",
                                                "legacy/load_poisson@0.8/ray_default/r0", "fixed_burst/ray_default/r0",
                                                "fixed_burst/last_work/r0", "load110_poisson_150/*/r0"],
                   help="the runs the step-time factors are fitted on (shell patterns); the rest are held out. "
                        "The fixed-length pair ran on a machine 3-4x slower by its probe: without a probed run in "
                        "the fit, probed runs are timed against the model's own guess of the probe. The 110%% "
                        "pair's first repeat brings probed half-full batches: with bursts alone the step's split "
                        "into fixed and per-sequence cost was the one calm run's, from an unprobed machine")
    p.add_argument("--saved-fit", action="store_true",
                   help="replay with the factors the last validation fitted, skipping the fit: "
                        "for new held-out runs when the fit runs are unchanged")
    p.add_argument("--out", type=Path, default=RESULTS)
    p = sub.add_parser("scale", help="bursts at 2 to 100 replicas -> simulator_scale.*")
    p.add_argument("--seeds", type=int, default=10)
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
    else:
        from benchmarks.simulator.scale import bursts, write
        from benchmarks.simulator.setup import validated_setup

        write(bursts(validated_setup(), seeds=args.seeds, workers=args.workers), args.out)


if __name__ == "__main__":
    main()
