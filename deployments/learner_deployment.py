"""The online learner as a Ray Serve deployment: one per application, whatever the predictor replicas.

Predictor replicas send it the features of the prompts they predict, the router sends it each
finished request's length (censored when max_tokens stopped it), and it keeps the reservoir and
refits the head in a low-priority child process (predictor.online) when enough new labels came.
An installed head is published under `state_dir` and handed to the predictor replicas that ask
for it (`head`), so several replicas serve one learned head and none ever loads half of one. The
state directory keeps what was learned across restarts. Its status (head version, samples,
held-out error) is on the router's /health and in Prometheus.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import torch
from ray import serve
from ray.serve.metrics import Gauge

from predictor.checkpoint import load_checkpoint
from predictor.online import BackgroundRefit, OnlineLearner, RefitPolicy
from predictor.online.publish import published_version, version_dir

log = logging.getLogger("ray.serve")
CHECK_S = 5.0  # how often the learner looks whether a refit is due, or done
SAVE_S = 60.0  # between refits, a restart loses at most this long of what the learner took in


@serve.deployment
class LengthLearner:
    def __init__(self, state_dir: str, feature_dim: int, model_id: str, model_hash: str, base_checkpoint: str | None,
                 capacity: int, floor: float, policy: dict, max_tokens: int):
        torch.set_num_threads(1)
        base = load_checkpoint(base_checkpoint, expected_base_model_hash=model_hash) if base_checkpoint else None
        self.learner = OnlineLearner(Path(state_dir), feature_dim, base_head=base, capacity=capacity, floor=floor,
                                     model_id=model_id, model_hash=model_hash, max_tokens=max_tokens,
                                     policy=RefitPolicy.model_validate(policy))
        self._refits = BackgroundRefit()
        self._loop: asyncio.Task | None = None
        self._gauges = {name: Gauge(f"lengthserve_learner_{name}", description, tag_keys=())
                        for name, description in (("version", "Version of the head the learner installed (0: offline)"),
                                                  ("samples", "Requests in the learner's reservoir"),
                                                  ("heldout_mae_tokens", "Held-out MAE of the installed head"),
                                                  ("heldout_concordance", "Held-out rank concordance of the installed head"))}

    def _started(self) -> None:
        """The refit loop, started on the replica's event loop at the first call."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop().create_task(self._refit_loop())

    async def features(self, rows: list[tuple[str, list[float], int]]) -> None:
        """(request id, the head's input vector, prompt tokens) of prompts a predictor replica predicted."""
        self._started()
        for request_id, vector, prompt_tokens in rows:
            self.learner.add_features(request_id, torch.tensor(vector), prompt_tokens)

    async def labels(self, rows: list[tuple[str, int, bool]]) -> None:
        """(request id, tokens generated, censored) of finished requests."""
        self._started()
        for request_id, tokens, censored in rows:
            self.learner.add_label(request_id, tokens, censored)

    async def head(self, known: int | None) -> dict | None:
        """The installed head unless it is the one at `known`: its version and its checkpoint's two
        files. Any other version, not only a newer one: a wiped state directory counts from 1 again."""
        version = published_version(self.learner.state_dir)
        if version is None or version == known:
            return None
        stem = version_dir(self.learner.state_dir, version) / "head"
        return {"version": version, "weights": stem.with_suffix(".safetensors").read_bytes(),
                "meta": stem.with_suffix(".json").read_text()}

    async def status(self) -> dict:
        self._started()
        status = self.learner.status()
        status.pop("strata", None)
        return status

    async def _refit_loop(self) -> None:
        saved = (time.monotonic(), self.learner.reservoir.offered)
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                # Off the loop: a snapshot stacks and saves the whole reservoir, and the replica
                # must keep taking features, labels and /health meanwhile.
                if await asyncio.to_thread(self.learner.ready_to_refit):
                    data = await asyncio.to_thread(self.learner.snapshot)
                    saved = (time.monotonic(), data.observed)
                    candidate = await asyncio.wrap_future(self._refits.submit(data))
                    installed = await asyncio.to_thread(self.learner.consider, candidate)
                    log.info("learner refit: %s installed=%s", candidate.quality, installed)
                elif self.learner.reservoir.offered != saved[1] and time.monotonic() - saved[0] >= SAVE_S:
                    saved = (time.monotonic(), self.learner.reservoir.offered)
                    await asyncio.to_thread(self.learner.save)
                self._publish_metrics()
            except Exception:  # a failed refit leaves the current head serving; the next one may do better
                log.exception("learner refit failed")

    def _publish_metrics(self) -> None:
        status = self.learner.status()
        values = {"version": status["version"], "samples": status["samples"],
                  "heldout_mae_tokens": status["heldout_mae"], "heldout_concordance": status["heldout_concordance"]}
        for name, value in values.items():
            if value is not None:
                self._gauges[name].set(value)
