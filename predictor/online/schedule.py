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
    `learner.consider`. One refit at a time."""

    def __init__(self):
        self._pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"), initializer=_low_priority)
        self._running: Future | None = None

    @property
    def busy(self) -> bool:
        return self._running is not None and not self._running.done()

    def submit(self, data: RefitData) -> Future:
        if self.busy:
            raise RuntimeError("a refit is already running")
        self._running = self._pool.submit(fit_candidate, data)
        return self._running

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "BackgroundRefit":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
