"""`python -m benchmarks.rollout <command>`: length-aware batches for RL rollouts and offline jobs.

  sim      the simulator at 10/100/1,000 replicas, RL and mixed batches, both schedules (~30 min here)
  real     /v1/rollout on ray_config.yaml's stack: an RL batch per policy, repeated (~45 min here)
  report   rebuild rollout.{md,png} from rollout.json

Each command replaces its own part of benchmarks/results/rollout.json and rewrites the report.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from benchmarks import parts as parts_file
from benchmarks.rollout import report

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _update(out: Path, **parts) -> dict:
    return parts_file.update(out, "rollout", report.markdown, report.plot, **parts)


def _real(args) -> dict:
    import httpx

    from benchmarks.replay.stack import RunningStack
    from benchmarks.rollout import real

    texts, known = real.rl_batch(args.prompts, args.n, args.max_tokens)
    repeats, records = [], args.out / "rollout_requests.jsonl"
    records.write_text("")
    with tempfile.TemporaryDirectory() as tmp, RunningStack(Path(tmp), {"router": {"benchmark_headers": True}}) as st:
        model = httpx.get(f"{st.base_url}/v1/models", timeout=30).json()["data"][0]["id"]
        for k in range(args.repeats):  # policies interleaved: a slow spell hits them alike
            repeat = {}
            for p in args.policies:
                repeat[p], samples = real.run_once(st.base_url, model, texts, known, p, args.n, args.max_tokens,
                                                   st.client_headers)
                with records.open("a") as fh:  # per-request records, as each batch ends
                    fh.writelines(json.dumps({"repeat": k, "policy": p, **s}) + "\n" for s in samples)
            repeats.append(repeat)
    real_part = {"repeats": repeats, "lost_requests": sum(m["lost"] for rep in repeats for m in rep.values()),
                 "settings": {"prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                              "policies": args.policies, "schedules": {p: real.SCHEDULES[p] for p in args.policies}}}
    return _update(args.out, real=real_part, **real.headline(real_part))


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(prog="python -m benchmarks.rollout", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sim")
    s.add_argument("--replicas", type=int, nargs="+", default=[10, 100, 1000])
    s.add_argument("--workers", type=int, default=2)
    r = sub.add_parser("real")
    r.add_argument("--prompts", type=int, default=13, help="RL test prompts (x n samples >= 100 requests)")
    r.add_argument("--n", type=int, default=8)
    r.add_argument("--max-tokens", type=int, default=256,
                   help="cap: 3 repeats x 4 policies of a full-length batch take hours on 2 cores")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--policies", nargs="+", default=["ray_default", "estp", "ceiling"])
    sub.add_parser("report")
    for sp in (s, r):
        sp.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    out = getattr(args, "out", RESULTS)
    if args.command == "report":
        parts_file.write(out, "rollout", parts_file.load(out, "rollout"), report.markdown, report.plot)
    elif args.command == "real":
        _real(args)
    else:
        from benchmarks.rollout.simulated import grid
        from benchmarks.simulator.setup import load_setup

        setup = load_setup()
        # Sizes not rerun stay: 1,000 replicas can run apart from the quick sizes.
        _update(out, simulated={**parts_file.load(out, "rollout").get("simulated", {}),
                                **grid(setup, args.replicas, workers=args.workers)},
                simulated_settings={"per_replica": 80, "batch_size": 8,
                                    "prediction_quality_test_split": setup.prediction_quality("test")})


if __name__ == "__main__":
    main()
