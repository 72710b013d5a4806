"""`python -m benchmarks.simulator <command>`

  predict    ESTP/EGTP predictions for every dataset prompt (cached; torch prefill)
  calibrate  measure a vLLM engine's step times, fit the step-time model (vLLM)
  sweep      routing gains vs predictor accuracy (a blurred oracle beside the heads),
             simulator_accuracy_sweep.{json,md,png}

predict and calibrate run the real model: run them alone on a shared machine. `sweep` only
simulates.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulator", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("predict", help="ESTP/EGTP predictions for every dataset prompt (cached)")
    p.add_argument("--threads", type=int, default=2)
    sub.add_parser("calibrate", help="measure vLLM step times, fit the step-time model")
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
        print(json.dumps(predict_all(config.predictor.max_prompt_tokens, threads=args.threads)))
    elif args.command == "calibrate":
        from benchmarks.simulator.calibrate import calibrate

        print(json.dumps(calibrate(), indent=1))
    elif args.command == "sweep":
        from benchmarks.simulator.setup import load_setup
        from benchmarks.simulator.sweep import NOISE, sweep, write

        result = sweep(load_setup(), args.replicas, args.requests, args.load, args.modes, args.batch_size, args.sizing,
                       tuple(args.noise or NOISE), seed=args.seed, workers=args.workers)
        write(result, args.out)
        print(json.dumps({m: r["break_even_accuracy"] for m, r in result["modes"].items()}))


if __name__ == "__main__":
    main()
