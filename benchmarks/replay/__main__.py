"""Trace replay benchmark: every routing policy on the same trace, in one stack, one run.

    python -m benchmarks.replay                          # starts ray_config.yaml's stack itself
    python -m benchmarks.replay --base-url http://host:8000 --n 200 --loads 1 2 4

The stack needs `router.benchmark_headers: true` (the benchmark sets it on the stack it starts):
each request names its policy in X-Routing-Policy, so six policies share one 5-minute stack
start instead of six. Policies run one after another with a drain in between, open loop at each
offered load, then batch-synchronous. Every finished (policy, mode, load) is appended to
replay_requests.jsonl at once; `--resume` skips those already there.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx
from tqdm import tqdm

from benchmarks.forelen.build import DEFAULT_OUT
from benchmarks.replay.actors import account, replay, spawn_actors
from benchmarks.replay.records import RequestRecord, read_records, write_records
from benchmarks.replay.report import POLICY_ORDER, write_report
from benchmarks.replay.stack import REPO, RunningStack
from benchmarks.replay.trace import ARRIVALS, build_trace

RESULTS = REPO / "benchmarks" / "results"
log = logging.getLogger("benchmarks.replay")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", help="a running stack with router.benchmark_headers: true (default: start one)")
    p.add_argument("--dataset", type=Path, default=DEFAULT_OUT)
    p.add_argument("--split", default="test")
    p.add_argument("--n", type=int, default=12, help="requests per policy and load (open loop)")
    p.add_argument("--batch-n", type=int, default=None, help="requests per policy in batch mode (default --n)")
    p.add_argument("--max-tokens", type=int, default=128, help="cap on every answer (and on true lengths)")
    p.add_argument("--max-true-tokens", type=int, default=128,
                   help="only prompts whose dataset answer ended within this many tokens (0: all)")
    p.add_argument("--arrival", choices=ARRIVALS, default="azure")
    p.add_argument("--loads", type=float, nargs="+", default=[0.2], help="offered loads, requests/s")
    p.add_argument("--policies", nargs="+", default=POLICY_ORDER, choices=POLICY_ORDER)
    p.add_argument("--modes", nargs="+", default=["open", "batch"], choices=["open", "batch"])
    p.add_argument("--batch-size", type=int, default=3, help="group size (batch mode; open-loop padding)")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-timeout-s", type=float, default=150, help="bound on each (policy, mode, load) run")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--resume", action="store_true", help="keep finished runs of replay_requests.jsonl")
    p.add_argument("--report-only", action="store_true", help="no runs: the report from replay_requests.jsonl")
    return p.parse_args(argv)


def capped_edges(dataset: Path, cap: int, max_true_tokens: int | None, pools: int = 3) -> list[float]:
    """Pool edges at equal shares of the training lengths the trace draws from, under 0.9 x cap.

    The checkpoint's own edges assume the dataset's 1,024-token cap; under a lower cap the long
    pool would get nothing (a capped prediction never exceeds the cap). Where a share ends at the
    cap itself, the edge sits below it, so "long" means "runs to about the cap".
    """
    import numpy as np

    from predictor.dataset import load_samples

    train = [r["output_tokens"] for r in load_samples(dataset, split="train")]
    lengths = np.minimum([n for n in train if max_true_tokens is None or n <= max_true_tokens], cap)
    return [float(min(round(np.quantile(lengths, i / pools)), round(0.9 * cap))) for i in range(1, pools)]


def drain(base_url: str, timeout_s: float = 300) -> None:
    """Wait until the router has nothing in flight, so one run's tail never loads the next."""
    deadline = time.time() + timeout_s
    while any(httpx.get(f"{base_url}/health", timeout=30).json()["inflight"].values()):
        if time.time() > deadline:
            raise TimeoutError("requests still in flight after the drain timeout")
        time.sleep(2)


POOLS = ("short", "medium", "long")


@contextlib.contextmanager
def serving(base_url: str | None, output_edges: list[float]):
    """A running stack's URL: the given one, or ray_config.yaml's application with the paper's three
    length pools (one replica each) and benchmark headers, which this benchmark compares."""
    if base_url:
        yield base_url.rstrip("/")
        return
    with tempfile.TemporaryDirectory() as tmp:
        pools = [{"name": name, "deployment": {"num_replicas": 1, "max_ongoing_requests": 16}} for name in POOLS]
        router = {"benchmark_headers": True, "output_edges": output_edges, "policy": "estp",
                  "fallback_policy": "input_length", "input_edges": [64, 100]}
        with RunningStack(Path(tmp), {"pools": pools, "router": router}) as stack:
            os.environ["RAY_ADDRESS"] = "auto"  # the cluster the stack just started
            yield stack.base_url


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.resume |= args.report_only
    # `timeout` and Ctrl-C alike unwind through the stack's context manager, which stops it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    records_path = args.out / "replay_requests.jsonl"
    records: list[RequestRecord] = read_records(records_path) if args.resume and records_path.exists() else []
    if not args.resume:
        records_path.write_text("")
    finished = {(r.policy, r.mode, r.load_rps) for r in records}

    def trace_for(mode: str, load: float | None):
        n = args.n if mode == "open" else args.batch_n or args.n
        # Batch mode ignores arrivals (all present at t = 0): the same prompts, any rate.
        return build_trace(args.dataset, args.split, n=n, arrival=args.arrival, rate=load or 1.0, seed=args.seed,
                           max_tokens=args.max_tokens, max_true_tokens=args.max_true_tokens or None)

    runs = [(mode, load, policy) for mode in args.modes for load in (args.loads if mode == "open" else [None])
            for policy in args.policies]
    todo = [] if args.report_only else [run for run in runs if (run[2], run[0], run[1]) not in finished]
    output_edges = capped_edges(args.dataset, args.max_tokens, args.max_true_tokens or None)
    with serving(args.base_url, output_edges) if todo else contextlib.nullcontext() as base_url:
        actors = spawn_actors(base_url, args.actors, args.run_timeout_s) if todo else []
        if todo:
            output_edges = httpx.get(f"{base_url}/health", timeout=30).json()["output_edges"]
        for mode, load, policy in tqdm(todo, desc="replay runs"):
            drain(base_url)
            got = replay(base_url, trace_for(mode, load), policy=policy, mode=mode, load_rps=load,
                         batch_size=args.batch_size, timeout_s=args.run_timeout_s, actors=actors)
            write_records(records_path, got, append=True)
            records += got
            log.info("%s %s %s: %d ok of %d", policy, mode, load, sum(r.status == "ok" for r in got), len(got))
    by_run = {run: [r for r in records if (r.policy, r.mode, r.load_rps) == (run[2], run[0], run[1])] for run in runs}
    not_run = [f"{policy}/{mode}/{load}" for (mode, load, policy), got in by_run.items() if not got]
    lost = sum(account(trace_for(mode, load), got).lost for (mode, load, _), got in by_run.items() if got)
    print(f"lost requests: {lost}" + (f"; runs not done (stopped early?): {not_run}" if not_run else ""))
    settings = {
        "machine": os.environ.get("REPLAY_MACHINE", f"{os.cpu_count()} CPU cores, no GPU"),
        "dataset": Path(args.dataset).name, "split": args.split, "n": args.n, "batch_n": args.batch_n or args.n,
        "max_tokens": args.max_tokens, "max_true_tokens": args.max_true_tokens, "arrival": args.arrival, "loads": args.loads, "batch_size": args.batch_size,
        "actors": args.actors, "seed": args.seed, "output_edges": output_edges, "runs_not_done": not_run,
    }
    report = write_report(args.out, records, args.batch_size, settings, lost)
    if lost:
        raise SystemExit(f"{lost} requests lost")
    return report


if __name__ == "__main__":
    main()
