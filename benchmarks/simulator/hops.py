"""The deployed path's delays around the router: before it sees a request, after a token leaves the engine.

The simulator times the router and the engines; a client also waits for the HTTP proxy and Ray's
hops. The real runs' records measure both (the router's log against the client's clock). A
request sent alone reaches the router 0.02-0.05 s after it was sent, but of a burst of 128 sent at
once most reach it about a second later: the proxy takes them in one at a time (the router's
arrivals spread over about a second). One fixed delay, the median of burst-heavy fit runs
(1.01 s), added a second to every load run's first token, which really came in under one: +135%
mean TTFT. So the inbound delay grows with the requests sent around the same time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WINDOW_S = 1.0  # requests sent this close to each other (either side) share the proxy's time
REPLICAS_PER_PROXY = 2  # the measured stack: one node, so one proxy, in front of two replicas


@dataclass(frozen=True)
class Hops:
    in_s: float = 0.0  # client -> router for a request sent alone
    in_per_request_s: float = 0.0  # added for each other request sent within WINDOW_S of it, per proxy
    out_s: float = 0.0  # engine's token -> client

    def router_arrivals(self, sent: np.ndarray, proxies: int = 1) -> np.ndarray:
        """When requests sent at `sent` reach the router. Ray Serve runs a proxy per node; the
        measured stack is one node, so a cluster simulated at scale spreads its requests over
        `proxies` of them."""
        sent = np.asarray(sent, dtype=float)
        return sent + self.in_s + self.in_per_request_s * (near(sent) - 1) / proxies


def near(sent: np.ndarray) -> np.ndarray:
    """Per request, the requests sent within WINDOW_S of it, itself included."""
    order = np.sort(sent)
    return np.searchsorted(order, sent + WINDOW_S, "right") - np.searchsorted(order, sent - WINDOW_S, "left")


def measure(sent: Sequence[np.ndarray], router_arrival: Sequence[np.ndarray], out_delays: np.ndarray) -> Hops:
    """Least squares of each run's inbound delays on the requests sent near them (runs apart: one
    run's clock is not another's), non-negative; the outbound delay's median."""
    crowd = np.concatenate([near(np.asarray(s, dtype=float)) - 1 for s in sent])
    delay = np.concatenate([np.asarray(a, dtype=float) - np.asarray(s, dtype=float) for s, a in zip(sent, router_arrival)])
    out = float(np.median(out_delays)) if len(out_delays) else 0.0
    if not len(delay):
        return Hops(out_s=out)
    if crowd.max() == 0:  # nothing was ever sent together: the slope is not measured
        return Hops(max(float(np.median(delay)), 0.0), 0.0, out)
    (base, per), *_ = np.linalg.lstsq(np.vstack([np.ones_like(delay), crowd]).T, delay, rcond=None)
    return Hops(max(float(base), 0.0), max(float(per), 0.0), out)
