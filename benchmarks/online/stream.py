"""Replaying the dataset as served traffic through the online learner, offline.

Requests arrive in a seeded order of prompts, each prompt's samples one after another (an RL job
submits a prompt's n rollouts together), so that the requests a head is judged on are always of
prompts it has not seen; a sample that hit max_tokens reaches the learner as a censored label, as
the live system reports it. At each checkpoint the learner refits and applies its install rule,
and the head it would then serve is scored on the next `window` requests: what a user of the
live system gets between this refit and the next.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from statistics import mean, pstdev

import torch
from tqdm import tqdm

from benchmarks.online.features import Request
from predictor.online import OnlineLearner
from predictor.online.quality import concordance, mae

MakeLearner = Callable[[Path], OnlineLearner]


def arrival_order(requests: list[Request], seed: int) -> list[Request]:
    """Prompts shuffled by `seed`, each prompt's samples together in sample order."""
    by_prompt: dict[str, list[Request]] = {}
    for r in requests:
        by_prompt.setdefault(r.prompt_id, []).append(r)
    prompts = sorted(by_prompt)
    random.Random(seed).shuffle(prompts)
    return [r for p in prompts for r in by_prompt[p]]


def boundary(stream: list[Request], n: int) -> int:
    """The first prompt boundary at or after n requests: a prompt is never split between what was
    learned from and what is judged."""
    while 0 < n < len(stream) and stream[n].prompt_id == stream[n - 1].prompt_id:
        n += 1
    return min(n, len(stream))


def feed(learner: OnlineLearner, requests: list[Request], max_tokens: int) -> None:
    for r in requests:
        learner.add_features(r.request_id, r.vector, r.prompt_tokens, key=r.prompt_id)
        learner.add_label(r.request_id, r.tokens, censored=r.tokens >= max_tokens)


@torch.no_grad()
def score(head, learner: OnlineLearner, requests: list[Request], max_tokens: int) -> dict:
    """MAE (overall and per scenario) and concordance of a head's expected length on requests."""
    if head is None:
        return {"mae": None, "concordance": None, "scenario_mae": {}}
    expected = learner.bins.expected(head(torch.stack([r.vector for r in requests])).softmax(-1))
    tokens = torch.tensor([r.tokens for r in requests], dtype=torch.float32)
    censored = tokens >= max_tokens
    per = {}
    for s in sorted({r.scenario for r in requests}):
        rows = torch.tensor([r.scenario == s for r in requests])
        per[s] = mae(expected[rows], tokens[rows], censored[rows], learner.bins)
    return {"mae": mae(expected, tokens, censored, learner.bins),
            "concordance": concordance(expected, tokens, censored), "scenario_mae": per}


def refit_and_score(learner: OnlineLearner, upcoming: list[Request], max_tokens: int) -> dict:
    """Refit, let the install rule decide, and score the served head and the candidate."""
    try:
        candidate = learner.refit()
    except ValueError:  # no held-out row of known length yet
        candidate = None
    installed = learner.consider(candidate) if candidate else False
    current = learner.current()
    served = score(current[1] if current else None, learner, upcoming, max_tokens)
    tried = score(candidate.head if candidate else None, learner, upcoming, max_tokens)
    return {**served, "version": current[0] if current else None, "installed": installed,
            "candidate_mae": tried["mae"], "candidate_concordance": tried["concordance"],
            "refit_seconds": candidate.seconds if candidate else None,
            "samples": learner.status()["samples"]}


def curve(stream: list[Request], checkpoints: list[int], window: int, learner: OnlineLearner, max_tokens: int,
          desc: str = "", scored_on: list[Request] | None = None) -> tuple[list[dict], int]:
    """Points at `checkpoints` requests into the stream, scored on the next `window` requests or on
    the fixed `scored_on` ones; and how many requests were fed."""
    points, fed = [], 0
    for n in tqdm(checkpoints, desc=desc, leave=False):
        at = boundary(stream, n)
        if n > len(stream) or (scored_on is None and at + window > len(stream)):
            break
        feed(learner, stream[fed:at], max_tokens)
        fed = at
        upcoming = stream[at:at + window] if scored_on is None else scored_on
        points.append({"observed": n, "observed_exactly": at, **refit_and_score(learner, upcoming, max_tokens)})
    return points, fed


def learning_curve(requests: list[Request], make_learner: MakeLearner, seeds: list[int], checkpoints: list[int],
                   window: int, max_tokens: int) -> dict:
    runs = {}
    for seed in tqdm(seeds, desc="learning curve"):
        with tempfile.TemporaryDirectory() as tmp:
            runs[seed], _ = curve(arrival_order(requests, seed), checkpoints, window, make_learner(Path(tmp)),
                                  max_tokens, desc=f"seed {seed}")
    return {"points": aggregate(runs), "seeds": {str(s): p for s, p in runs.items()}}


def drift(requests: list[Request], before: str, after: str, make_learner: MakeLearner, seeds: list[int],
          warmup_every: int, checkpoints: list[int], window: int, max_tokens: int, steady_points: int = 3,
          tolerance: float = 0.10, held_back: float = 0.25) -> dict:
    """Learn on all `before` traffic (refitting every `warmup_every` requests, scored on the next
    `window` requests of it), switch to `after`, and count the requests after which the MAE on the
    new traffic is back within `tolerance` of its steady value (the mean over the last
    `steady_points` checkpoints; seeds averaged first).

    After the switch every checkpoint is scored on the same requests: the last `held_back` share of
    the new traffic's arrival order, never fed to the learner. Windows of the next requests differ
    in difficulty by more than the 10% to be detected (in a first replay, 200-request windows of
    three seeds moved by 10-15% where the candidates' quality did not), so the recovery would
    measure which windows came when.
    """
    runs = {}
    for seed in tqdm(seeds, desc=f"drift {before} -> {after}"):
        old = arrival_order([r for r in requests if r.scenario == before], seed)
        new = arrival_order([r for r in requests if r.scenario == after], seed)
        split = boundary(new, round(len(new) * (1 - held_back)))
        with tempfile.TemporaryDirectory() as tmp:
            learner = make_learner(Path(tmp))
            warmup, fed = curve(old, list(range(warmup_every, len(old), warmup_every)), window, learner, max_tokens,
                                desc=f"{before} seed {seed}")
            feed(learner, old[fed:], max_tokens)
            after_switch, _ = curve(new[:split], checkpoints, window, learner, max_tokens, desc=f"{after} seed {seed}",
                                    scored_on=new[split:])
            runs[seed] = {"before": warmup, "after": after_switch, "scored_on": len(new) - split}
    points = aggregate({s: r["after"] for s, r in runs.items()})
    return {**recovery(points, steady_points, tolerance), "points": points,
            "steady_before": recovery(aggregate({s: r["before"] for s, r in runs.items()}), steady_points,
                                      tolerance)["steady_mae"],
            "seeds": {str(s): r for s, r in runs.items()}}


def recovery(points: list[dict], steady_points: int, tolerance: float) -> dict:
    """The steady MAE (mean of the last points) and when the MAE got within `tolerance` of it:
    `recovered_after` from when on it stays there (a noisy dip does not count), `first_within`
    the first time it got there."""
    tail = [p["mae"] for p in points[-steady_points:] if p["mae"] is not None]
    if not tail:
        return {"steady_mae": None, "recovered_after": None, "first_within": None}
    steady = mean(tail)
    within = [p["mae"] is not None and p["mae"] <= (1 + tolerance) * steady for p in points]
    stays = next((i for i in range(len(points)) if all(within[i:])), None)
    first = next((i for i in range(len(points)) if within[i]), None)
    return {"steady_mae": steady, "tolerance": tolerance,
            "steady_from": [p["observed"] for p in points[-steady_points:]],
            "recovered_after": None if stays is None else points[stays]["observed"],
            "first_within": None if first is None else points[first]["observed"]}


def aggregate(runs: dict[int, list[dict]]) -> list[dict]:
    """Per checkpoint: mean over the seeds that served a head, their spread, and the candidates'."""
    out = []
    for i in range(min(len(points) for points in runs.values())):
        rows = [points[i] for points in runs.values()]
        point = {"observed": rows[0]["observed"], "seeds": len(rows),
                 "seeds_serving": sum(r["mae"] is not None for r in rows)}
        for key in ("mae", "concordance", "candidate_mae", "candidate_concordance", "refit_seconds", "samples"):
            values = [r[key] for r in rows if r[key] is not None]
            point[key] = mean(values) if values else None
            if key in ("mae", "concordance", "candidate_mae") and values:
                point[f"{key}_sd"] = pstdev(values)
                point[f"{key}_range"] = [min(values), max(values)]
        scenario = [r["scenario_mae"] for r in rows if r["scenario_mae"]]
        if scenario:
            names = sorted({s for per in scenario for s in per})
            per = {s: mean(v[s] for v in scenario if v.get(s) is not None) for s in names}
            point["scenario_mae"] = per
            point["scenario_avg_mae"] = mean(per.values())
        out.append(point)
    return out


def ablation(requests: list[Request], variants: dict[str, Callable[[Path, list[Request]], OnlineLearner]],
             seeds: list[int], sizes: list[int], evaluation: int, max_tokens: int) -> dict:
    """Candidates of learner variants (made from a state directory and the requests they will see)
    trained on the first `size` requests of each arrival order and scored on its last `evaluation`
    requests (the same rows for every size and variant, so their differences are not window
    noise). Means over seeds."""
    runs: dict[str, dict[int, list[dict]]] = {name: {n: [] for n in sizes} for name in variants}
    for seed in tqdm(seeds, desc="ablation"):
        stream = arrival_order(requests, seed)
        held_back = boundary(stream, len(stream) - evaluation)
        for name, make in variants.items():
            for n in sizes:
                seen = stream[:boundary(stream, min(n, held_back))]
                with tempfile.TemporaryDirectory() as tmp:
                    learner = make(Path(tmp), seen)
                    feed(learner, seen, max_tokens)
                    candidate = learner.refit()
                    runs[name][n].append(score(candidate.head, learner, stream[held_back:], max_tokens))
    return {name: {str(n): {key: mean(r[key] for r in rows) for key in ("mae", "concordance")}
                   for n, rows in by_size.items()} for name, by_size in runs.items()}
