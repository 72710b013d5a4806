"""The default stack's queue end to end: one pool of two replicas, policy last_work, aging bound 20 s.

Every slot (max_ongoing_requests x replicas) is filled with holders: streams that ignore EOS and
would run for minutes; they are hung up one at a time to free exactly one slot. Requests sent
meanwhile wait in the router's queue, are predicted while they wait (`X-Predictor-Budget: always`:
the budget would skip most predictions on two CPU cores) or ranked by their client's hint, and the
order in which they get a slot (their response headers arrive) is the queue's order.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack

import httpx
import psutil
import pytest
import yaml

pytestmark = pytest.mark.stack

CANDIDATES = [
    "Say hi.",
    "Write a detailed, multi-paragraph essay about the history of the printing press, its inventors, and its "
    "effects on science, religion and politics in Europe.",
    "What is 2 + 3?",
    "Write a long story about a dragon who learns to paint, with dialogue and at least five chapters.",
]
REPLICA = "ServeReplica:lengthserve:pool-default"


def _chat(stack, content: str, **extra) -> dict:
    return {"model": stack.model, "messages": [{"role": "user", "content": content}], **extra}


def _health(stack) -> dict:
    return httpx.get(f"{stack.base_url}/health", timeout=30).json()


def _slots(stack) -> int:
    pool = yaml.safe_load(stack.config_path.read_text())["applications"][0]["args"]["pools"][0]["deployment"]
    return pool["max_ongoing_requests"] * pool["num_replicas"]


def _wait_for(predicate, what: str, timeout_s: float = 120):
    deadline = time.time() + timeout_s
    while not (value := predicate()):
        assert time.time() < deadline, what
        time.sleep(0.5)
    return value


def _wait_idle(stack) -> None:
    _wait_for(lambda: not any(_health(stack)["inflight"].values()), "requests still in flight")


def _short_and_long(stack) -> tuple[str, str]:
    """The candidates the checkpoint predicts shortest and longest (which ones is its business)."""
    predicted = {c: httpx.post(f"{stack.base_url}/v1/length", json=_chat(stack, c, max_tokens=600),
                               timeout=120).json()["expected_tokens"] for c in CANDIDATES}
    short, long = min(predicted, key=predicted.get), max(predicted, key=predicted.get)
    # Under the 20 s aging bound over 1,024 tokens, 200 tokens are a head start of about 4 s: longer
    # than the second request takes to reach the queue on a loaded machine (a 1 s head start lost once on CI).
    assert predicted[long] - predicted[short] > 200, f"the head hardly tells the candidates apart: {predicted}"
    return short, long


HOLDER = dict(max_tokens=2000, ignore_eos=True, stream=True)


async def _queue_scenario(stack, first: str, second: str, gap_s: float,
                          hints: dict[str, str] | None = None) -> tuple[list[str], dict[str, dict]]:
    """Fill every slot, queue `first`, then `second` gap_s after `first` waits, free one slot at a
    time: the labels in the order they were handed a slot, and what each one's headers said of its
    length and wait (for the message of a failing assertion). `hints`: a label's length hint."""
    slots = _slots(stack)
    pool = _health(stack)["pools"][0]
    limits = httpx.Limits(max_connections=slots + 8)
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=600, limits=limits) as client:
        async with AsyncExitStack() as held:
            holders = []
            for _ in range(slots):
                holders.append(await held.enter_async_context(AsyncExitStack()))
                await holders[-1].enter_async_context(
                    client.stream("POST", "/v1/chat/completions", json=_chat(stack, "Count upwards.", **HOLDER)))
            order: list[str] = []
            seen: dict[str, dict] = {}

            async def waiter(label: str, content: str):
                hint = (hints or {}).get(label)
                body = _chat(stack, content, max_tokens=600, stream=True,
                             **({"metadata": {"expected_output_tokens": hint}} if hint else {}))
                async with client.stream("POST", "/v1/chat/completions", json=body,
                                         headers={**stack.client_headers, "X-Predictor-Budget": "always"}) as r:
                    order.append(label)  # it holds a slot now; hanging up gives the slot back
                    seen[label] = {h: r.headers.get(h) for h in ("x-predicted-tokens", "x-length-source", "x-queue-ms",
                                                                 "x-routing-ms")}
                    assert float(r.headers["x-queue-ms"]) > 0 and r.headers["x-routing-policy"] == "last_work"

            async def queue_reaches(what: str, count: int, poll_s: float) -> None:
                deadline = time.time() + 120
                while (q := (await client.get("/health")).json()["queues"][pool])[what] < count:
                    assert time.time() < deadline, f"the queue never had {count} {what}: {q}"
                    await asyncio.sleep(poll_s)

            # `second` is sent only once `first` waits at the router: the client's gap is not the
            # router's (both are rendered on a thread pool, so they could even arrive swapped).
            tasks = [asyncio.create_task(waiter("first", first))]
            await queue_reaches("waiting", 1, poll_s=0.05)
            await asyncio.sleep(gap_s)
            tasks.append(asyncio.create_task(waiter("second", second)))
            await queue_reaches("waiting_ranked", 2, poll_s=0.5)  # both ranked by their own prediction
            for holder in holders[:2]:  # free one slot, wait for it to be taken, free the next
                taken = len(order)
                await holder.aclose()
                while len(order) == taken:
                    await asyncio.sleep(0.2)
            await asyncio.gather(*tasks)
    return order, seen


def test_the_default_policy_serves_every_kind_of_request(client, stack):
    r = client.chat.completions.with_raw_response.create(
        model=stack.model, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8)
    assert r.headers["x-routing-policy"] == "last_work" and r.headers["x-pool"] == "default"
    assert r.parse().to_dict()["routing"]["policy"] == "last_work"
    stream = client.completions.create(model=stack.model, prompt="One, two, three,", max_tokens=6, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices)


def test_under_saturation_short_predicted_requests_leave_the_queue_first(stack):
    short, long = _short_and_long(stack)
    _wait_idle(stack)
    order, seen = asyncio.run(_queue_scenario(stack, first=long, second=short, gap_s=0.0))
    assert order == ["second", "first"], seen
    stats = _health(stack)["queues"]["default"]
    assert stats["reordered"] >= 1 and stats["waiting"] == 0


def test_an_aged_long_request_is_not_starved(stack):
    short, long = _short_and_long(stack)
    _wait_idle(stack)
    # The long one has waited more than max_overtake_s (20 s) when the short one arrives: it goes first.
    order, seen = asyncio.run(_queue_scenario(stack, first=long, second=short, gap_s=21.0))
    assert order == ["first", "second"], seen


def test_a_hint_ranks_a_waiting_request_and_spares_its_prediction(stack):
    """The same long prompt twice: the later one's client says it is short, so it passes the first
    (whose predicted length gives it seconds of slack under the 20 s aging bound) with no prediction."""
    _, long = _short_and_long(stack)
    _wait_idle(stack)
    before = _health(stack)["predictor_budget"]["decisions"]["skipped_by_signal"]
    order, seen = asyncio.run(_queue_scenario(stack, first=long, second=long, gap_s=0.0, hints={"second": "1"}))
    assert order == ["second", "first"], seen
    assert (seen["second"]["x-length-source"], seen["second"]["x-predicted-tokens"]) == ("hint", "1"), seen
    assert seen["first"]["x-length-source"] == "head", seen
    assert _health(stack)["predictor_budget"]["decisions"]["skipped_by_signal"] >= before + 1


def test_every_answer_says_which_signal_gave_its_length(client, stack):
    r = client.chat.completions.with_raw_response.create(
        model=stack.model, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=64,
        metadata={"expected_output_tokens": "12"})
    assert (r.headers["x-length-source"], r.headers["x-predicted-tokens"]) == ("hint", "12")
    prediction = r.parse().to_dict()["length_prediction"]
    assert prediction["source"] == "hint" and prediction["quantiles"] == {"p10": None, "p50": 12.0, "p90": None}
    capped = client.chat.completions.with_raw_response.create(
        model=stack.model, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=4)
    assert capped.headers["x-length-source"] == "max_tokens"  # a cap this small is the length
    length = httpx.post(f"{stack.base_url}/v1/length", timeout=120, json=_chat(
        stack, "Name a colour.", max_tokens=600, metadata={"expected_output_tokens": 33})).json()
    assert (length["source"], length["expected_tokens"]) == ("hint", 33.0)


def test_health_reports_queues_live_quality_and_the_metrics_port(stack):
    health = _health(stack)
    queue = health["queues"]["default"]
    assert queue["slots"] == _slots(stack) and queue["max_waiting"] == 4 * _slots(stack)
    assert set(health["live_quality"]) >= {"estp", "hint", "history"} and "trusted" in health["live_quality"]["estp"]
    budget = health["predictor_budget"]
    assert budget["mode"] == "auto" and budget["share"] == 1.0 and budget["prefill_s_per_token"] > 0  # timed at start
    assert set(budget["decisions"]) == {"predicted", "skipped_by_budget", "skipped_by_signal"}
    port = health["metrics_port"]
    assert isinstance(port, int) and port > 0
    metrics = _wait_for(lambda: (t := httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text)
                        and "lengthserve_queue_wait_ms" in t and t, "router metrics not exported")
    assert "lengthserve_pool_requests" in metrics
    assert "lengthserve_predictor_budget_decisions" in _wait_for(
        lambda: (t := httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text)
        and "lengthserve_predictor_budget_decisions" in t and t, "budget decisions not exported")


def _processes(stack, fragment: str) -> list[psutil.Process]:
    return [p for p in psutil.Process(stack.pid).children(recursive=True) if fragment in " ".join(p.cmdline())]


def test_killing_the_predictor_costs_no_request_even_for_those_that_wait(stack):
    _wait_idle(stack)
    slots = _slots(stack)

    async def run():
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=600,
                                     limits=httpx.Limits(max_connections=slots + 16)) as client:
            calls = [client.post("/v1/chat/completions", json=_chat(stack, f"Say the number {i}.", max_tokens=8))
                     for i in range(slots + 8)]  # more than the slots: some wait, and need a prediction
            tasks = [asyncio.create_task(c) for c in calls]
            await asyncio.sleep(1.0)
            for p in _processes(stack, "length-predictor"):
                p.kill()
            return await asyncio.gather(*tasks)

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * len(responses), [r.text for r in responses if r.status_code != 200]
    _wait_for(lambda: httpx.post(f"{stack.base_url}/v1/length", json=_chat(stack, "Hi"), timeout=60).status_code == 200,
              "the predictor did not come back", timeout_s=300)


def test_killing_a_replica_reroutes_the_requests_waiting_for_it(stack):
    """Waiting requests are bound to no replica: when one dies they are served by the others.
    Requests running on the dead one end with an error, never silently."""
    _wait_idle(stack)
    slots = _slots(stack)

    async def run():
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=600,
                                     limits=httpx.Limits(max_connections=2 * slots + 8)) as client:
            async def one(i: int, max_tokens: int):
                try:
                    r = await client.post("/v1/chat/completions",
                                          json=_chat(stack, f"Say the number {i}.", max_tokens=max_tokens))
                    return r.status_code, r.text
                except httpx.HTTPError as e:
                    return None, repr(e)

            running = [asyncio.create_task(one(i, 64)) for i in range(slots)]
            await asyncio.sleep(2.0)
            waiting = [asyncio.create_task(one(i, 8)) for i in range(8)]
            await asyncio.sleep(2.0)
            engines = _processes(stack, REPLICA)
            assert len(engines) >= 2
            engines[0].kill()
            return await asyncio.gather(*running), await asyncio.gather(*waiting)

    running, waiting = asyncio.run(run())
    assert all(status == 200 for status, _ in waiting), waiting
    for status, text in running:  # served, or an error that says so: never dropped without an answer
        assert status == 200 or (status is not None and status >= 500 and "error" in text), (status, text)
    _wait_for(lambda: len(_processes(stack, REPLICA)) >= 2,
              "the replica did not come back", timeout_s=400)
