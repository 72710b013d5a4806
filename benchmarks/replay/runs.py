"""Real runs that leave their per-request records: what the client saw, joined with what the router did.

A run replays a trace against a running stack from the replay actors (benchmarks.replay.actors).
The client's records say when each request was sent, got its first token and ended; the router's
request log (router.serving.request_log, `router.request_log` set on the stack) says when it was decided,
waited, dispatched, on which replica, with what rank, and when its prediction landed. Joined by
the id the client sends (X-Request-Id), one `RunRecord` per request, all on the run's clock
(seconds from its start), written to `benchmarks/results/runs/<scenario>/<side>__r<k>.jsonl`, and beside them the
machine's speed measured just before the run (`<run>.probe.json`, benchmarks.replay.probe). These
records are what the simulator replays (benchmarks.simulator.validation), and a run whose file exists is
not run again (resumable).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel

from benchmarks.replay.actors import START_LEAD_S, replay
from benchmarks.replay.metrics import summarise
from benchmarks.replay.probe import measure, probe_path
from benchmarks.replay.records import RequestRecord
from benchmarks.replay.trace import TraceRequest

RUNS = Path(__file__).resolve().parents[1] / "results" / "runs"
Landed = Literal["before_dispatch", "after_dispatch", "never"]


class RunRecord(RequestRecord):
    run: str
    ceiling_tokens: int | None = None
    # The router's side, seconds from the run's start (None without a request log: a stock app).
    router_arrival_s: float | None = None
    decided_s: float | None = None
    dispatched_s: float | None = None
    router_first_token_s: float | None = None
    router_finish_s: float | None = None
    queued: bool | None = None  # it waited for a slot
    replica: str | None = None
    decided_by: str | None = None
    rank_tokens: float | None = None
    on_prior: bool | None = None  # its rank rested on the prior when it was dispatched
    priority: int | None = None
    predicted_s: float | None = None
    prediction_landed: Landed | None = None
    prediction_failure: str | None = None
    finish_reason: str | None = None
    # A waiting request's budget verdict (router.scheduling.budget): predicted, skipped_by_budget,
    # skipped_by_signal; None for one that never waited.
    prediction_decision: str | None = None
    hint_tokens: int | None = None  # the client's hint it carried


def _since(t: float | None, t0: float) -> float | None:
    return None if t is None else t - t0


def _landed(entry: dict) -> Landed:
    if entry["predicted_at"] is None:
        return "never"
    dispatched = entry["dispatched_at"]
    return "before_dispatch" if dispatched is None or entry["predicted_at"] <= dispatched else "after_dispatch"


def join(run: str, trace: list[TraceRequest], records: list[RequestRecord], router_log: list[dict],
         t0: float) -> list[RunRecord]:
    """The client's records with the router's entries of the same requests (by X-Request-Id)."""
    by_client = {e["client_id"]: e for e in router_log if e.get("client_id")}
    ceilings = {r.request_id: r.ceiling_tokens for r in trace}
    out = []
    for record in records:
        fields = {**record.model_dump(), "run": run, "ceiling_tokens": ceilings.get(record.request_id)}
        e = by_client.get(record.request_id)
        if e is not None:
            prediction = e["prediction"]
            fields.update(
                router_arrival_s=_since(e["arrival"], t0), decided_s=_since(e["decided_at"], t0),
                dispatched_s=_since(e["dispatched_at"], t0), router_first_token_s=_since(e["first_token_at"], t0),
                router_finish_s=_since(e["finished_at"], t0), queued=e["queued"], replica=e["replica"],
                decided_by=e["decided_by"], rank_tokens=e["rank_tokens"], on_prior=e["on_prior"],
                priority=e["priority"], predicted_s=_since(e["predicted_at"], t0), prediction_landed=_landed(e),
                prediction_failure=e["prediction_failure"], finish_reason=e["finish_reason"],
                length_source=(e.get("estimate") or {}).get("source"),
                prediction_decision=(e.get("budget") or {}).get("verdict"), hint_tokens=e.get("hint_tokens"),
                predicted_tokens=None if prediction is None else round(prediction["expected_tokens"]))
        out.append(RunRecord.model_validate(fields))
    return out


def run_path(run: str, out: Path | None = None) -> Path:
    """A run named `<scenario>/<side>/r<k>` is `runs/<scenario>/<side>__r<k>.jsonl`."""
    folder, side, repeat = run.rsplit("/", 2)
    return (out or RUNS) / folder / f"{side}__{repeat}.jsonl"


def run_name(path: Path, out: Path | None = None) -> str:
    return "/".join(path.relative_to(out or RUNS).parent.parts) + "/" + path.stem.replace("__", "/")


def runs_of(prefix: str, out: Path | None = None) -> list[str]:
    """The runs on disk of `<scenario>/<side>`, by repeat."""
    folder, side = prefix.rsplit("/", 1)
    paths = ((out or RUNS) / folder).glob(f"{side}__r*.jsonl")
    return sorted((run_name(p, out) for p in paths), key=lambda name: int(name.rsplit("/r", 1)[1]))


def read_run(run: str, out: Path | None = None) -> list[RunRecord]:
    with open(run_path(run, out), encoding="utf-8") as fh:
        return [RunRecord.model_validate_json(line) for line in fh if line.strip()]


def execute(run: str, base_url: str, actors: list, trace: list[TraceRequest], policy: str | None,
            router_log: Path | None, timeout_s: float = 3600, out: Path | None = None,
            label: str | None = None, progress: bool = False) -> list[RunRecord]:
    """Replay `trace` open-loop and write the run's joined records."""
    path = run_path(run, out)
    path.parent.mkdir(parents=True, exist_ok=True)
    probe = measure(base_url, actors, run, START_LEAD_S)
    probe_path(path).write_text(json.dumps(probe) + "\n")  # kept if the probe after the run fails
    trace = [r.model_copy(update={"request_id": f"{run}:{r.request_id}"}) for r in trace]  # unique per run
    seen = _log_lines(router_log)
    t0 = time.time() + START_LEAD_S
    records = replay(base_url, trace, policy=policy, timeout_s=timeout_s, actors=actors, t0=t0, label=label,
                     progress=progress)
    time.sleep(1.0)  # the router writes its last records as the streams close
    log = _log_lines(router_log)[len(seen):] if router_log is not None else []
    joined = join(run, trace, records, [json.loads(line) for line in log], t0)
    path.write_text("".join(r.model_dump_json() + "\n" for r in joined))
    after = measure(base_url, actors, f"{run}/after", START_LEAD_S)
    probe_path(path).write_text(json.dumps({**probe, "after_step_s": after["step_s"],
                                            "after_small_step_s": after["small_step_s"]}) + "\n")
    return joined


def _log_lines(path: Path | None) -> list[str]:
    return path.read_text().splitlines() if path is not None and path.exists() else []


def arrival_order_kept(records: list[RunRecord]) -> float | None:
    """Rank correlation of the trace's arrival order with the order requests reached the router
    (1.0: kept). The replay actors send their shards in parallel, so two sides of a pair are one
    workload only where this is near 1. None: the router kept no record (the stock app), or the
    trace sends everything at one instant (the bursts before round 4's spacing) and has no order."""
    arrived = [r for r in records if r.router_arrival_s is not None]
    if len(arrived) < 2 or len({r.arrival_s for r in arrived}) < 2:
        return None
    by_trace = sorted(arrived, key=lambda r: (r.arrival_s, r.request_id))
    router_rank = np.argsort(np.argsort([r.router_arrival_s for r in by_trace]))
    return float(np.corrcoef(np.arange(len(by_trace)), router_rank)[0, 1])


def summary(records: list[RunRecord]) -> dict:
    """The run's serving figures, and how far the router's ranking rested on landed lengths."""
    out = summarise(records, 8)
    done = [r for r in records if r.status == "ok"]
    ttft = sorted(r.ttft_s for r in done)
    waited = [r for r in done if r.queued]
    ranked = [r for r in waited if r.rank_tokens is not None]
    latency = [r.predicted_s - r.router_arrival_s for r in done if r.predicted_s is not None]
    out.update({
        "p50_ttft_s": float(np.percentile(ttft, 50)) if ttft else None,
        "makespan_s": max((r.finish_s for r in done), default=None),
        "lost": 0,  # replay() raises on a lost request: a written run lost none
        "queued_share": len(waited) / len(done) if done and records[0].queued is not None else None,
        # Of the requests that waited and were ranked, the share whose rank at dispatch rested on
        # their own length (a told one, or a prediction that landed in time), not on the prior.
        "ranked_share": sum(not r.on_prior for r in ranked) / len(ranked) if ranked else None,
        "predictor_latency_p50_s": float(np.percentile(latency, 50)) if latency else None,
        "predictor_latency_p99_s": float(np.percentile(latency, 99)) if latency else None,
        "arrival_order_kept": arrival_order_kept(records),
    })
    return out
