"""When to refit, and running a refit where it cannot slow the engines down.

A refit is worth its CPU only once enough new labels arrived to change the head, and refits
should not follow each other so closely that they compete with serving for the cores; below
about a hundred samples a head is no better than the scenario median, so the learner waits for
those first.

The refit itself runs in a spawned child process (a fork of a process with torch threads and
engine state is unsafe), at nice 19 and with one torch thread, so on a machine shared with the
engines it only takes CPU nobody else wants. The child is kept between refits: importing torch
again each time would cost seconds of the same CPU.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context

from pydantic import BaseModel, Field

from predictor.online.refit import RefitData, fit_candidate


class RefitPolicy(BaseModel):
    min_new_labels: int = Field(200, ge=0)  # joined labels since the last refit started
    min_interval_s: float = Field(300.0, ge=0)  # since the last refit started
    min_samples: int = Field(100, ge=1)  # in the reservoir, train and held-out together

    def due(self, samples: int, new_labels: int, seconds_since_last: float) -> bool:
        return (samples >= self.min_samples and new_labels >= self.min_new_labels
                and seconds_since_last >= self.min_interval_s)


def _low_priority() -> None:
    import torch

    os.nice(19)
    torch.set_num_threads(1)


class BackgroundRefit:
    """`submit(learner.snapshot())` returns a Future of the Candidate; hand it to
    `learner.consider`. The caller awaits each refit before the next."""

    def __init__(self):
        self._pool = self._child()

    @staticmethod
    def _child() -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"), initializer=_low_priority)

    def submit(self, data: RefitData) -> Future:
        """A child that died (killed for memory, say) breaks its pool for good: the refit goes to a
        new child instead of every later refit failing until the replica restarts."""
        try:
            return self._pool.submit(fit_candidate, data)
        except BrokenProcessPool:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._child()
            return self._pool.submit(fit_candidate, data)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "BackgroundRefit":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
