"""Which pool a request goes to. The router asks a policy; policies know nothing of HTTP."""

from __future__ import annotations

import itertools


class RoundRobin:
    """Length-blind baseline: pools take turns."""

    name = "round_robin"

    def __init__(self, pools: list[str]):
        self._cycle = itertools.cycle(pools)

    def choose(self, request) -> str:
        return next(self._cycle)


POLICIES = {RoundRobin.name: RoundRobin}
