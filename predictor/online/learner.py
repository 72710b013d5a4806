"""A length head that keeps learning from the requests the stack serves.

The serving stack hands over two things per request at different times: the head's input (the
prefill features, at admission) and the length it generated (at completion, censored when its
max_tokens stopped it). They are joined by request id in bounded pending maps (whichever comes
first waits; the oldest unmatched entries expire, so requests that never complete cannot grow
memory), and each joined request goes into a stratified reservoir (predictor.online.reservoir).

A refit trains a candidate on the reservoir (predictor.online.refit) and `consider` installs it
only when it is better than what serves now:
- with no head yet, when its held-out concordance reaches the live-quality floor, the level at
  which the router trusts a head's ordering at all;
- with a head (the offline one or an earlier refit), when its held-out MAE on the same held-out
  rows is lower; on equal MAE a higher concordance wins, otherwise the current head stays (a swap
  makes every replica reload, so a draw is not worth one).
The held-out rows are those whose key hashes into a fixed share (20%): stable across refits and
restarts, so a request never moves from held-out into training and the heads are compared on rows
none of them trained on. Keys default to the request id (the serving stack's case: it cannot
know which requests repeat a prompt); a caller that knows, such as the offline replay of a dataset
with several samples per prompt, passes the prompt as the key so that its samples stay together.

The MAE the rule compares weights each held-out row by its recency (half-life
`recency_half_life` requests; None: a plain mean): the reservoir keeps old traffic on purpose, so
once the traffic shifts a plain mean judges heads mostly on traffic no longer served, and keeps a
head that is better there in place while candidates are better on what is served now. In the
chat-to-RL replay (benchmarks/results/online.md) the weighting served a head 4-7 tokens better
from 800 requests after the switch on (146-150 against 153-154 MAE), but about as much worse in
the first 50 (fewer rows count, so early decisions are noisier); averaged over the replay the
two were equal. Its case is the long run: a reservoir that keeps months of traffic.

A request cut at or beyond the head's cap (max_tokens of the bins) trains as an exact row of
length max_tokens (`cap_as_exact`): the bins end there, so "at least the cap" says exactly "in the
last bin", which is also how offline training counts a truncated sample and how early stopping and
the held-out MAE score it. Its survival likelihood (predictor.losses), the other consistent
reading, outweighs the exact rows' CRPS + SmoothL1 and pulled every prediction up: about 5% higher
MAE in the replay (benchmarks/results/online.md, design choices). Requests cut below the cap, whose length is unknown within the bins, train by
their survival likelihood.

Bins are fixed for the learner's life, since a head is only comparable to another on the same
bins: the offline head's when there is one, else `online_bins`, log-spaced edges with a spike bin
at the cap. Not quantile bins of the first observations: those would freeze whatever traffic came
first (a burst of one kind) into the resolution forever, and quantiles of censored lengths are
not lengths. Log spacing gives every length the same relative resolution, and the spike bin makes
a request stopped at the cap an exact event (in the replay, both bin choices gave the same MAE).

Every install gets the next version number and is published for the replicas
(predictor.online.publish); the learner's own state (reservoir, counters, held-out metrics) is
one file replaced atomically, so a new learner over the same directory resumes where the last
save left off. Pending requests are not saved: after a restart their labels find no features.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from pathlib import Path

import torch
from safetensors.torch import load, save

from predictor.checkpoint import CheckpointMeta
from predictor.fit import FitConfig, scorable
from predictor.head import LengthBins, LengthHead
from predictor.losses import LossConfig
from predictor.online.publish import atomic_write, publish_head, read_published
from predictor.online.quality import evaluate
from predictor.online.refit import Candidate, RefitData, fit_candidate
from predictor.online.reservoir import Observation, StratifiedReservoir
from predictor.online.schedule import RefitPolicy
from predictor.train import RECIPES

STATE_FILE = "learner.safetensors"
RECIPE = RECIPES["last_ens5"]  # the offline default head: "last" pooling, 5 seeds, crps+smoothl1


def online_bins(max_tokens: int = 1024, k: int = 20, first_edge: float = 16.0) -> LengthBins:
    """K - 1 log-spaced bins from 0 to max_tokens - 1 (the first up to `first_edge`: shorter answers
    are rare and alike) and the spike bin (max_tokens - 1, max_tokens] of truncated requests."""
    body = LengthBins.log_spaced(k - 1, max_tokens - 1, first_edge)
    return LengthBins(edges=[*body.edges, float(max_tokens)], centres=[*body.centres, float(max_tokens)],
                      max_tokens=max_tokens)


def is_heldout(key: str, share: float) -> bool:
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64


class OnlineLearner:
    def __init__(self, state_dir: Path, feature_dim: int, bins: LengthBins | None = None,
                 base_head: tuple[LengthHead, CheckpointMeta] | None = None, capacity: int = 4096,
                 floor: float = 0.55, *, model_id: str | None = None, model_hash: str | None = None,
                 max_tokens: int = 1024, heldout_share: float = 0.2, policy: RefitPolicy = RefitPolicy(),
                 loss: LossConfig | None = None, fit: FitConfig | None = None, max_pending: int = 16384,
                 pending_ttl_s: float = 3600.0, seed: int = 0, recency_half_life: float | None = 300.0,
                 cap_as_exact: bool = True):
        """`base_head` (the offline head) serves as version 0 until a refit beats it, and gives the
        bins and base model unless they are given; without it, `model_id` and `model_hash` name
        the serving model the features come from (they go into every checkpoint).

        A request's features wait for its label as long as it may run (`pending_ttl_s`, above the
        router's request timeout plus its queue wait): expiring them by count instead would drop the
        longest requests' features first under heavy traffic, and teach the head that nothing is
        long. `max_pending` only bounds memory (16,384 x 576 floats: 38 MB)."""
        self.state_dir = Path(state_dir)
        self.feature_dim = feature_dim
        self.floor = floor
        self.heldout_share = heldout_share
        self.policy = policy
        self.loss = loss or LossConfig(name=RECIPE.loss)
        self.fit = fit or RECIPE.fit
        self.max_pending, self.pending_ttl_s = max_pending, pending_ttl_s
        self.recency_half_life = recency_half_life
        self.cap_as_exact = cap_as_exact
        base_meta = base_head[1] if base_head else None
        if base_meta and base_meta.feature_dim != feature_dim:
            raise ValueError(f"base head takes {base_meta.feature_dim} features, learner {feature_dim}")
        self.bins = bins or (base_meta.bins if base_meta else online_bins(max_tokens))
        self.model_id = model_id or (base_meta.base_model_id if base_meta else None)
        self.model_hash = model_hash or (base_meta.base_model_hash if base_meta else None)
        if not (self.model_id and self.model_hash):
            raise ValueError("without a base head, give model_id and model_hash of the serving model")
        self.pooling = base_meta.pooling if base_meta else RECIPE.pooling
        self._lock = threading.RLock()  # traffic: pending maps, reservoir, counters
        self._install_lock = threading.Lock()  # one install decision at a time
        self._save_lock = threading.Lock()
        # request id -> (when it came, its payload), oldest first
        self._pending_features: OrderedDict[str, tuple[float, tuple[torch.Tensor, int, str]]] = OrderedDict()
        self._pending_labels: OrderedDict[str, tuple[float, tuple[int, bool]]] = OrderedDict()
        self._current = (0, *base_head) if base_head else None
        self.counters = {"features": 0, "labels": 0, "expired_features": 0, "expired_labels": 0,
                         "new_labels": 0, "refits": 0, "installs": 0, "rejections": 0}
        self.last_refit_at: float | None = None
        self.quality: dict = {}  # held-out quality of the current head, as last measured
        self.last_decision: dict = {}
        self.reservoir = StratifiedReservoir(capacity, seed)
        self._resume(bins)
        if self._current and self._current[2].bins != self.bins:
            raise ValueError(f"version {self._current[0]} predicts over other bins than the learner's; "
                             "a head is only compared with candidates on the same bins")

    # --- traffic ------------------------------------------------------------------------------

    def add_features(self, request_id: str, vector: torch.Tensor, prompt_tokens: int, key: str | None = None) -> None:
        """The head input of an admitted request; `key` (default: the request id) decides held-out."""
        vector = vector.detach().float().cpu().reshape(-1)
        if vector.numel() != self.feature_dim:
            raise ValueError(f"{request_id}: {vector.numel()} features, expected {self.feature_dim}")
        with self._lock:
            self.counters["features"] += 1
            label = self._pending_labels.pop(request_id, None)
            if label is not None:
                self._observe(key or request_id, vector, prompt_tokens, *label[1])
                return
            self._pending_features[request_id] = (time.monotonic(), (vector, prompt_tokens, key or request_id))
            self._pending_features.move_to_end(request_id)
            self._expire(self._pending_features, "expired_features")

    def add_label(self, request_id: str, tokens: int, censored: bool) -> None:
        """The length a request generated; `censored` when its max_tokens stopped it."""
        with self._lock:
            self.counters["labels"] += 1
            features = self._pending_features.pop(request_id, None)
            if features is not None:
                vector, prompt_tokens, key = features[1]
                self._observe(key, vector, prompt_tokens, int(tokens), bool(censored))
                return
            self._pending_labels[request_id] = (time.monotonic(), (int(tokens), bool(censored)))
            self._pending_labels.move_to_end(request_id)
            self._expire(self._pending_labels, "expired_labels")

    def _expire(self, pending: OrderedDict, counter: str) -> None:
        too_old = time.monotonic() - self.pending_ttl_s
        while pending and (len(pending) > self.max_pending or next(iter(pending.values()))[0] < too_old):
            pending.popitem(last=False)
            self.counters[counter] += 1

    def _observe(self, key: str, vector: torch.Tensor, prompt_tokens: int, tokens: int, censored: bool) -> None:
        self.reservoir.add(Observation(key, vector, tokens, censored, int(prompt_tokens), self.reservoir.offered))
        self.counters["new_labels"] += 1

    # --- refits -------------------------------------------------------------------------------

    def ready_to_refit(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        since = float("inf") if self.last_refit_at is None else now - self.last_refit_at
        with self._lock:
            if not self.policy.due(len(self.reservoir), self.counters["new_labels"], since):
                return False
            # A candidate is judged on held-out rows of known length: without one a refit can only fail.
            rows = self.reservoir.observations()
        held = [o for o in rows if is_heldout(o.key, self.heldout_share)]
        if not held or len(held) == len(rows):
            return False
        keep, _ = scorable(torch.tensor([float(o.tokens) for o in held]), torch.tensor([o.censored for o in held]),
                           self.bins)
        return bool(keep.any())

    def snapshot(self) -> RefitData:
        """The data of a refit, which counts as started now (for `ready_to_refit`)."""
        with self._lock:
            rows = self.reservoir.observations()
            if not rows:
                raise ValueError("nothing observed yet")
            tokens = torch.tensor([o.tokens for o in rows], dtype=torch.float32)
            censored = torch.tensor([o.censored for o in rows])
            if self.cap_as_exact:
                at_cap = censored & (tokens >= self.bins.max_tokens)
                tokens, censored = torch.where(at_cap, float(self.bins.max_tokens), tokens), censored & ~at_cap
            # An answer longer than the bins reach (a client cap above the head's) is in the last bin;
            # unclamped, a few such rows would dominate the held-out MAE that decides installs.
            tokens = tokens.clamp(max=float(self.bins.max_tokens))
            age = torch.tensor([self.reservoir.offered - 1 - o.seq for o in rows], dtype=torch.float32)
            age -= age.min()  # weights relative to the newest row: absolute ones underflow in a long life
            half_life = self.recency_half_life
            data = RefitData(
                x=torch.stack([o.vector for o in rows]), tokens=tokens, censored=censored,
                heldout=torch.tensor([is_heldout(o.key, self.heldout_share) for o in rows]),
                weight=torch.ones_like(age) if half_life is None else 0.5 ** (age / half_life),
                bins=self.bins, loss=self.loss, fit=self.fit, model_id=self.model_id, model_hash=self.model_hash,
                pooling=self.pooling, observed=self.reservoir.offered)
            self.counters["new_labels"] = 0
            self.counters["refits"] += 1
            self.last_refit_at = data.taken_at
        self.save()
        return data

    def refit(self) -> Candidate:
        """A candidate trained here, on the calling thread (see schedule.BackgroundRefit for a child
        process)."""
        return fit_candidate(self.snapshot())

    def consider(self, candidate: Candidate) -> bool:
        """Install the candidate if it wins (module docstring); True if it was installed. Holds only
        the install lock while it evaluates and publishes, so traffic keeps flowing in."""
        if candidate.meta.bins != self.bins:
            raise ValueError("the candidate was trained on other bins than this learner's")
        with self._install_lock:
            mine, current, held = candidate.quality, self._current, candidate.heldout
            theirs = (evaluate(current[1], self.bins, held.x, held.tokens, held.censored, held.weight)
                      if current else None)
            if theirs is None:
                install = mine["concordance"] is not None and mine["concordance"] >= self.floor
            else:
                install = mine["mae_recent"] < theirs["mae_recent"] or (
                    mine["mae_recent"] == theirs["mae_recent"]
                    and (mine["concordance"] or 0) > (theirs["concordance"] or 0))
            if install:
                version = (current[0] if current else 0) + 1
                metrics = {**candidate.meta.metrics, "version": float(version)}
                meta = candidate.meta.model_copy(update={"metrics": metrics})
                publish_head(self.state_dir, version, candidate.head, meta)
                self._current = (version, candidate.head, meta)
            with self._lock:
                self.last_decision = {"at": time.time(), "installed": install, "candidate": mine, "current": theirs,
                                      "current_version": current[0] if current else None,
                                      "fit_seconds": candidate.seconds}
                self.quality = mine if install else theirs or self.quality
                self.counters["installs" if install else "rejections"] += 1
        self.save()
        return install

    def current(self) -> tuple[int, LengthHead, CheckpointMeta] | None:
        """(version, head, meta) serving now; version 0 is the offline base head. An installed head is
        never modified, so a caller can keep using the tuple it got while a newer one is installed."""
        return self._current

    def status(self) -> dict:
        with self._lock:
            rows = self.reservoir.observations()
            heldout = sum(is_heldout(o.key, self.heldout_share) for o in rows)
            return {"version": self._current[0] if self._current else None, "samples": len(rows),
                    "heldout_samples": heldout, "censored_samples": sum(o.censored for o in rows),
                    "observed": self.reservoir.offered, "pending_features": len(self._pending_features),
                    "pending_labels": len(self._pending_labels), **self.counters,
                    "heldout_mae": self.quality.get("mae"), "heldout_mae_recent": self.quality.get("mae_recent"),
                    "heldout_concordance": self.quality.get("concordance"),
                    "last_refit_at": self.last_refit_at, "last_decision": self.last_decision,
                    "strata": self.reservoir.counts()}

    # --- persistence --------------------------------------------------------------------------

    def save(self) -> None:
        """Write the learner's state (one file, replaced atomically). The state is copied under the
        traffic lock and written outside it; saves are serialised so that a later state is never
        overwritten by an earlier one."""
        with self._save_lock:
            with self._lock:
                rows = self.reservoir.observations()
                tensors = {
                    "x": torch.stack([o.vector for o in rows]) if rows else torch.zeros(0, self.feature_dim),
                    "tokens": torch.tensor([o.tokens for o in rows], dtype=torch.int64),
                    "censored": torch.tensor([o.censored for o in rows], dtype=torch.bool),
                    "prompt_tokens": torch.tensor([o.prompt_tokens for o in rows], dtype=torch.int64),
                    "seq": torch.tensor([o.seq for o in rows], dtype=torch.int64),
                }
                state = {"keys": [o.key for o in rows], "offered": self.reservoir.offered, "seed": self.reservoir.seed,
                         "bins": self.bins.model_dump(), "feature_dim": self.feature_dim, "counters": self.counters,
                         "last_refit_at": self.last_refit_at, "quality": self.quality,
                         "last_decision": self.last_decision}
                state_json = json.dumps(state)
            atomic_write(self.state_dir / STATE_FILE, save(tensors, metadata={"state": state_json}))

    def _resume(self, bins: LengthBins | None) -> None:
        # A state directory reused for another model must not serve that model's head here.
        published = read_published(self.state_dir, self.model_hash)
        if published and published[2].feature_dim != self.feature_dim:
            raise ValueError(f"{self.state_dir} serves a head of {published[2].feature_dim} features, learner {self.feature_dim}")
        if published:
            self._current = published
            if bins is None:  # the head a directory serves fixes the bins its refits compete on
                self.bins = published[2].bins
        path = self.state_dir / STATE_FILE
        if not path.exists():
            return
        raw = path.read_bytes()
        tensors = load(raw)
        state = json.loads(_metadata(raw)["state"])
        saved_bins = LengthBins.model_validate(state["bins"])
        if bins is not None and bins != saved_bins or state["feature_dim"] != self.feature_dim:
            raise ValueError(f"{path} was saved with other bins or feature width; bins are fixed for a learner's life")
        self.bins = saved_bins
        rows = [Observation(k, v, int(t), bool(c), int(p), int(q)) for k, v, t, c, p, q in zip(
            state["keys"], tensors["x"], tensors["tokens"].tolist(), tensors["censored"].tolist(),
            tensors["prompt_tokens"].tolist(), tensors["seq"].tolist())]
        self.reservoir = StratifiedReservoir.restore(self.reservoir.capacity, state["seed"], state["offered"], rows)
        self.counters.update(state["counters"])
        self.last_refit_at = state["last_refit_at"]
        self.quality = state["quality"]
        self.last_decision = state["last_decision"]


def _metadata(raw: bytes) -> dict:
    """The string metadata of a safetensors file held in memory."""
    size = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + size]).get("__metadata__", {})
