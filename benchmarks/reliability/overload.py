"""Overload, aborted streams and a hostile template against a running stack, all on loopback.

Every loop is bounded in count and in time. Each request ends as exactly one outcome:
completed, rejected (429/503, which must carry Retry-After), refused (a 4xx the request earned:
abusive bodies), aborted (the client hung up on purpose), or failed (anything else: a 5xx
without Retry-After, a transport error, a timeout). `lost` counts requests with no outcome at
all when the run's time is up, the thing that must never happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass

import httpx
import numpy as np
import psutil

NORMAL = ["Name a colour.", "Count to five.", "Say hi.", "What is 2 + 2?", "Write one sentence about rain."]
HOSTILE_TEMPLATE = "{% for i in range(10**9) %}{{ i }}{% endfor %}"


@dataclass(frozen=True)
class Kind:
    name: str
    share: float


MIX = (Kind("normal", 0.55), Kind("stream", 0.2), Kind("abusive", 0.15), Kind("aborted", 0.1))
CLIENT_POOLS = 64  # x 64 connections each


def _chat(model: str, content: str, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def _abusive(model: str, rng: random.Random) -> tuple[str, bytes | dict]:
    """Requests a shared server must refuse cheaply, or serve without letting them stall others."""
    return rng.choice([
        ("/v1/chat/completions", _chat(model, "hi", n=1000, max_tokens=2)),
        ("/v1/chat/completions", _chat(model, "hi", max_tokens=4, chat_template=HOSTILE_TEMPLATE)),
        ("/v1/chat/completions", {"model": model, "messages": [{"role": "wizard", "content": "hi"}]}),
        ("/v1/chat/completions", b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
        ("/v1/chat/completions", _chat(model, "x" * 1_200_000)),  # over the 1 MB body limit
        ("/v1/completions", {"model": model, "prompt": [[]], "max_tokens": 2}),
        ("/v1/completions", {"model": model, "prompt": [10**9], "max_tokens": 2}),
        ("/v1/chat/completions", _chat(model, "Count upwards.", max_tokens=256, ignore_eos=True)),  # legal, long
    ])


def process_rss(fragment: str) -> int | None:
    """Resident memory of the processes whose command line names `fragment` (Ray actor titles)."""
    procs = [p for p in psutil.process_iter(["cmdline"]) if fragment in " ".join(p.info["cmdline"] or [])]
    return sum(p.memory_info().rss for p in procs) or None


def rss() -> dict[str, int | None]:
    return {"router": process_rss("ServeReplica:lengthserve:Router"),
            "predictor": process_rss("ServeReplica:lengthserve:length-predictor")}


async def _one(client: httpx.AsyncClient, kind: str, model: str, rng: random.Random,
               failures: Counter | None = None) -> str:
    try:
        if kind == "abusive":
            path, body = _abusive(model, rng)
            r = await (client.post(path, content=body) if isinstance(body, bytes) else client.post(path, json=body))
            return _outcome(r, failures)
        body = _chat(model, rng.choice(NORMAL), max_tokens=rng.choice([8, 32, 64]))
        if kind == "normal":
            return _outcome(await client.post("/v1/chat/completions", json=body), failures)
        async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            if r.status_code != 200:
                await r.aread()
                return _outcome(r, failures)
            async for line in r.aiter_lines():
                if kind == "aborted" and line.startswith("data: "):
                    return "aborted"  # hang up after the first chunk
            return "completed"
    except (httpx.HTTPError, asyncio.TimeoutError) as e:
        if failures is not None:  # what the transport said (when: the run's seconds per outcome)
            cause = e.__cause__ or e.__context__
            failures[f"{kind}: {type(e).__name__} ({type(cause).__name__}: {cause})"] += 1
        return "failed"


async def _timed(client: httpx.AsyncClient, kind: str, model: str, rng: random.Random,
                 failures: Counter) -> tuple[str, float]:
    start = time.monotonic()
    outcome = await _one(client, kind, model, rng, failures)
    return outcome, time.monotonic() - start


def _outcome(r: httpx.Response, failures: Counter | None = None) -> str:
    if r.status_code < 300:
        return "completed"
    if r.status_code in (429, 503) and r.headers.get("retry-after"):
        return "rejected"
    if r.status_code < 500 and r.status_code != 429:
        return "refused"
    if failures is not None:
        failures[f"{r.status_code}: {r.text[:120]}"] += 1
    return "rejected_without_retry_after" if r.status_code in (429, 503) else "failed"


async def closed_loop_rps(base_url: str, model: str, concurrency: int, seconds: float, headers: dict) -> float:
    """Completed normal requests per second with `concurrency` clients: the stack's capacity."""
    done, stop = 0, time.monotonic() + seconds
    rng = random.Random(1)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, headers=headers,
                                 limits=httpx.Limits(max_connections=concurrency + 4)) as client:
        async def worker():
            nonlocal done
            while time.monotonic() < stop:
                if await _one(client, "normal", model, rng) == "completed":
                    done += 1
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / seconds


async def overload(base_url: str, model: str, rate_rps: float, seconds: float, headers: dict,
                   grace_s: float = 600, warmup_s: float = 60, seed: int = 0) -> dict:
    """Poisson arrivals at `rate_rps` for `seconds`, the MIX of kinds; every request gets `grace_s` to end.

    Memory growth is measured from `warmup_s` into the run to its end: the first minute of a new
    mix grows the allocators to the batches it needs (the predictor's padded prefills above all),
    which is not the leak this looks for; RSS before the run is reported beside it.
    """
    rng = random.Random(seed)
    kinds = [k.name for k in MIX]
    weights = [k.share for k in MIX]
    before_rss, warm_rss = rss(), None
    tasks: list[asyncio.Task] = []
    failures: Counter = Counter()
    t0 = time.monotonic()
    due = 0.0  # the next arrival, on an absolute schedule: a client that falls behind catches up
    # Many small connection pools, not one of thousands: httpx's pool scans its connections on
    # every request, so one pool that large can make the client the bottleneck (client_cpu_s).
    cpu_before = psutil.Process().cpu_times()
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(
            base_url=base_url, timeout=grace_s, headers=headers, limits=httpx.Limits(max_connections=64)))
            for _ in range(CLIENT_POOLS)]
        while due < seconds:
            if (lag := t0 + due - time.monotonic()) > 0:
                await asyncio.sleep(lag)
            if warm_rss is None and due >= warmup_s:
                warm_rss = rss()
            client = clients[len(tasks) % CLIENT_POOLS]
            tasks.append(asyncio.create_task(_timed(client, rng.choices(kinds, weights)[0], model, rng, failures)))
            due += rng.expovariate(rate_rps)
        done, pending = await asyncio.wait(tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
    cpu_after = psutil.Process().cpu_times()
    seconds_by_outcome: dict[str, list[float]] = {}
    for outcome, took in (t.result() for t in done):
        seconds_by_outcome.setdefault(outcome, []).append(took)
    outcomes = Counter({k: len(v) for k, v in seconds_by_outcome.items()})
    end_rss = rss()
    start_rss = warm_rss or before_rss
    growth = {k: (end_rss[k] / start_rss[k] - 1) if start_rss.get(k) and end_rss.get(k) else None for k in start_rss}
    return {
        "duration_s": seconds, "offered_rps": rate_rps, "sent": len(tasks),
        "completed": outcomes["completed"], "rejected": outcomes["rejected"] + outcomes["rejected_without_retry_after"],
        "rejections_with_retry_after": outcomes["rejected"], "refused_4xx": outcomes["refused"],
        "aborted": outcomes["aborted"], "failed": outcomes["failed"], "lost": len(pending),
        "failures": dict(failures.most_common(10)), "sent_over_s": round(time.monotonic() - t0, 1),
        "client_cpu_s": round(cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system, 1),
        # Rejections must come at once, completions within the request timeout: no hang.
        "seconds": {k: {"p50": float(np.quantile(v, 0.5)), "p99": float(np.quantile(v, 0.99)), "max": max(v)}
                    for k, v in sorted(seconds_by_outcome.items())},
        "rss_before_bytes": before_rss, "rss_start_bytes": start_rss, "rss_end_bytes": end_rss,
        "rss_growth": growth, "rss_growth_measured_from_s": warmup_s if warm_rss else 0.0,
    }


async def aborted_streams(base_url: str, model: str, n: int, headers: dict, settle_s: float = 120) -> dict:
    """n streams hung up after their first chunk; then the router's in-flight count must drain to 0."""
    async with httpx.AsyncClient(base_url=base_url, timeout=300, headers=headers,
                                 limits=httpx.Limits(max_connections=n + 4)) as client:
        rng = random.Random(2)
        outcomes = Counter(await asyncio.gather(*(_one(client, "aborted", model, rng) for _ in range(n))))
        deadline = time.monotonic() + settle_s
        while True:
            health = (await client.get("/health")).json()
            inflight = sum(health["inflight"].values())
            on_replicas = sum(r["requests"] for pool in health["replicas"].values() for r in pool.values())
            if (inflight == 0 and on_replicas == 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
    return {"aborted": outcomes["aborted"], "other_outcomes": {k: v for k, v in outcomes.items() if k != "aborted"},
            "inflight_after": inflight, "on_replicas_after": on_replicas}


async def hostile_template(base_url: str, model: str, headers: dict) -> dict:
    """A template that would loop for hours, sent while another stream runs: the answer's status and
    time, and the longest pause of the other stream meanwhile."""
    async with httpx.AsyncClient(base_url=base_url, timeout=300, headers=headers) as client:
        gaps: list[float] = []

        async def bystander():
            body = _chat(model, "Count upwards from one.", max_tokens=200, ignore_eos=True, stream=True)
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                last = time.monotonic()
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        gaps.append(time.monotonic() - last)
                        last = time.monotonic()

        other = asyncio.create_task(bystander())
        await asyncio.sleep(3.0)  # the bystander streams
        start = time.monotonic()
        r = await client.post("/v1/chat/completions",
                              json=_chat(model, "hi", max_tokens=4, chat_template=HOSTILE_TEMPLATE))
        seconds = time.monotonic() - start
        during = len(gaps)
        await other
    return {"status": r.status_code, "seconds": round(seconds, 3), "message": r.json()["error"]["message"],
            "bystander_chunks": len(gaps), "bystander_max_gap_s": round(max(gaps[max(0, during - 5):] or [0]), 3)}
