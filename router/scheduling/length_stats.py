"""What a handful of observed lengths say about the next one, when some of them were cut short.

A length stopped by `max_tokens`, cut by a first-k rollout or paused as a partial sample is
censored: the sample would have run at least that long. Averaging such lengths as if they were
exact makes a prompt look short precisely because its long samples were cut. The Kaplan-Meier
estimate of the survival curve counts a censored length only while it is still "at risk", so an
exact length moves the curve and a censored one only thins who is left; the mean and the spread
are the curve's, restricted to the longest length seen (nothing is known past it). With exact
lengths only, they are the plain mean and the population standard deviation.

Shared by the history store (router.serving.history) and the rollouts' sibling estimates
(router.scheduling.rollout_plans), so both read a cut sample the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import groupby

from router.scheduling.request import HistoryStats


def censored_stats(lengths: Iterable[tuple[int, bool]]) -> HistoryStats | None:
    """The restricted Kaplan-Meier mean and spread of `(tokens, censored)` lengths; None for none.

    At a tie the exact lengths end before the censored ones leave the risk set: a sample cut at 40
    tokens was still running when another stopped at 40.
    """
    observed = sorted(lengths)
    if not observed:
        return None
    at_risk, survival, previous, mean, second = len(observed), 1.0, 0.0, 0.0, 0.0
    for t, group in groupby(observed, key=lambda length: length[0]):
        mean += survival * (t - previous)  # the integrals of S(t) and of 2t S(t) over [previous, t)
        second += survival * (t * t - previous * previous)
        previous = t
        censored = [c for _, c in group]
        survival *= 1.0 - censored.count(False) / at_risk
        at_risk -= len(censored)
    return HistoryStats(mean_tokens=mean, spread_tokens=math.sqrt(max(0.0, second - mean * mean)),
                        count=len(observed))
