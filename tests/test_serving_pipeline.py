"""The pipeline's stages on fake handles: dispatch, waiting and re-ranking, fallbacks, retries,
cancellation and the live-quality switch (no server; the e2e tests run the real stack)."""

import asyncio
import itertools
import json

import pytest

from router.api.validation import parse_request
from predictor.head import LengthBins
from router.scheduling.pools import Pools
from router.serving.config import RoutingPlan, StackConfig
from router.serving.errors import APIError
from router.serving.pipeline import Overrides, Pipeline
from router.serving.replica_ledger import ledger
from router.serving.rollout import RolloutRequest
from tests import MODEL_DIR
from tests.fakes import FakePool, FakePredictor

BINS = LengthBins(edges=[0, 20, 100, 400, 1024], centres=[10, 60, 250, 700], max_tokens=1024)
_names = (f"pool{i}" for i in itertools.count())  # a pool of its own per test: ledgers are per process


def _pipeline(policy="last_work", slots=1, predictor=None, live_quality=None, history=None,
              **pool) -> tuple[Pipeline, FakePool]:
    name = next(_names)
    router = {"policy": policy, "fallback_policy": "ray_default", "queue": {"max_overtake_s": 100.0}}
    if live_quality:
        router["live_quality"] = live_quality
    if history:
        router["history"] = history
    config = StackConfig.model_validate({
        "pools": [{"name": name, "deployment": {"num_replicas": 1, "max_ongoing_requests": slots}}], "router": router})
    plan = RoutingPlan(str(MODEL_DIR), Pools((name,), ()), {"last": BINS}, "last", prior_tokens=250.0)
    fake = FakePool(ledger(name), replicas=["r1"], **pool)
    return Pipeline(config, plan, {name: fake}, predictor), fake


def _body(text: str = "hi", stream: bool = False, max_tokens: int = 1000):
    return parse_request(json.dumps({"model": "m", "messages": [{"role": "user", "content": text}],
                                     "stream": stream, "max_tokens": max_tokens}).encode(), "chat")


def _by_length(mapping: dict[str, float]):
    """A predictor that answers by prompt (its rendered length picks the entry)."""
    return lambda ids: next(v for k, v in mapping.items() if len(ids) == k)


async def _drain(served):
    return "".join([c async for c in served.answer.sse(False)])


def test_a_request_with_a_free_slot_dispatches_at_once_and_completes():
    pipeline, fake = _pipeline()

    async def run():
        served = await pipeline.serve(_body(), "chat", Overrides())
        served.answer.json()
        return served.request

    request = asyncio.run(run())
    assert not request.queued
    assert (request.decided_by, request.completion_tokens, request.replica) == ("last_work", 5, "r1")
    assert fake.calls[0].internal_id == request.id  # the call ran under the request's own id
    assert pipeline.scheduler.inflight(request.pool) == 0 and pipeline.predictor.waiting == 0


def test_a_fixed_length_reaches_the_engine_and_not_the_routers_record():
    """X-Fixed-Output-Tokens replays a known length as if the model chose it: the engine is held to
    it (min_tokens = max_tokens), the router's record keeps the client's request, so the request
    is ranked with no floor to read its length off."""
    seen = []
    pipeline, fake = _pipeline(tokens=lambda body: seen.append((body.min_tokens, body.max_tokens)) or body.max_tokens)

    async def run(overrides):
        served = await pipeline.serve(_body(max_tokens=1000), "chat", overrides)
        served.answer.json()
        return served.request

    request = asyncio.run(run(Overrides(fixed_tokens=7)))
    assert seen == [(7, 7)] and request.completion_tokens == 7
    assert (request.max_tokens, request.min_tokens, request.floor_tokens()) == (1000, 0, 0)
    with pytest.raises(APIError, match="over the request's max_tokens") as err:
        asyncio.run(run(Overrides(fixed_tokens=1001)))
    assert err.value.status == 400 and len(seen) == 1


def test_waiting_requests_are_predicted_while_they_wait_and_leave_shortest_first():
    prompts = {"long one please": 700.0, "short": 10.0}
    lengths = {}
    predictor = FakePredictor({"last": BINS})
    pipeline, fake = _pipeline(predictor=predictor, tokens=3)

    async def run():
        predictor.hold = asyncio.Event()
        tokenizer = pipeline.tokenizer
        for text, expected in prompts.items():
            lengths[len(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                      add_generation_prompt=True, return_dict=False))] = expected
        predictor.expected = lambda ids: lengths[len(ids)]
        first = await pipeline.serve(_body("hold the slot", stream=True), "chat", Overrides())
        queue = pipeline.scheduler.queues[first.request.pool]
        long = asyncio.create_task(pipeline.serve(_body("long one please"), "chat", Overrides()))
        while len(queue) < 1:
            await asyncio.sleep(0.001)
        short = asyncio.create_task(pipeline.serve(_body("short"), "chat", Overrides()))
        while len(queue) < 2:
            await asyncio.sleep(0.001)
        waiting = list(queue._waiting)
        assert [r.on_prior for r in waiting] == [True, True]  # ranked on the prior until predictions land
        assert queue.ranked() == 0
        predictor.hold.set()
        while queue.ranked() < 2:
            await asyncio.sleep(0.001)
        assert waiting[0].rank_tokens > 600 and waiting[1].rank_tokens == 10.0
        assert not any(r.on_prior for r in waiting)
        await _drain(first)  # frees the slot
        done_short = await short
        done_short.answer.json()
        done_long = await long
        done_long.answer.json()
        return done_long.request, done_short.request

    long, short = asyncio.run(run())
    assert short.dispatched_at < long.dispatched_at  # the later arrival went first
    assert long.queued and short.queued and short.predicted_at < short.dispatched_at
    assert pipeline.scheduler.queues[long.pool].stats.reordered == 1


def test_a_failing_predictor_sends_pool_policies_to_the_fallback_and_never_fails_the_request():
    pipeline, fake = _pipeline(policy="last", predictor=FakePredictor({"last": BINS}, fail=True))

    async def run():
        served = await pipeline.serve(_body(), "chat", Overrides())
        served.answer.json()
        return served.request

    request = asyncio.run(run())
    assert (request.decided_by, request.fallback, request.prediction) == ("ray_default", "error", None)
    assert request.completion_tokens == 5


def test_a_slow_predictor_falls_back_after_its_timeout():
    pipeline, _ = _pipeline(policy="last", predictor=FakePredictor({"last": BINS}, delay_s=10))
    pipeline.predictor._timeout_s = 0.05

    async def run():
        served = await pipeline.serve(_body(), "chat", Overrides())
        served.answer.json()
        return served.request

    request = asyncio.run(run())
    assert request.fallback == "timeout" and request.error is None


def test_a_replica_that_fails_before_answering_is_retried_on_the_pool():
    pipeline, fake = _pipeline(failures=1)
    pipeline.pools[next(iter(pipeline.pools))]._backoff_s = 0.001

    async def run():
        served = await pipeline.serve(_body(), "chat", Overrides())
        served.answer.json()
        return served.request

    request = asyncio.run(run())
    assert len(fake.calls) == 2 and request.completion_tokens == 5 and request.error is None
    assert pipeline.scheduler.inflight(request.pool) == 0


def test_a_request_cancelled_while_waiting_or_streaming_gives_its_slot_back():
    pipeline, fake = _pipeline(tokens=40, delay_s=0.001)

    async def run():
        pool = None
        first = await pipeline.serve(_body(stream=True), "chat", Overrides())
        pool = first.request.pool
        gone = asyncio.create_task(pipeline.serve(_body("leaves while waiting"), "chat", Overrides()))
        while len(pipeline.scheduler.queues[pool]) < 1:
            await asyncio.sleep(0.001)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert len(pipeline.scheduler.queues[pool]) == 0 and pipeline.scheduler.inflight(pool) == 1
        nxt = asyncio.create_task(pipeline.serve(_body("next"), "chat", Overrides()))
        while len(pipeline.scheduler.queues[pool]) < 1:
            await asyncio.sleep(0.001)
        relay = first.answer.sse(False)
        await relay.__anext__()
        await relay.aclose()  # the streaming client hangs up
        served = await asyncio.wait_for(nxt, 5)
        served.answer.json()
        return pool, first.request

    pool, first = asyncio.run(run())
    assert first.error is not None and fake.streams[0].cancelled
    assert pipeline.scheduler.inflight(pool) == 0 and len(pipeline.scheduler.queues[pool]) == 0


def test_a_full_queue_answers_429_with_retry_after():
    pipeline, _ = _pipeline(tokens=10, delay_s=0.01)
    pipeline.scheduler.queues[next(iter(pipeline.pools))].max_waiting = 1

    async def run():
        first = await pipeline.serve(_body(stream=True), "chat", Overrides())
        queue = pipeline.scheduler.queues[first.request.pool]
        waiting = asyncio.create_task(pipeline.serve(_body(), "chat", Overrides()))
        while len(queue) < 1:
            await asyncio.sleep(0.001)
        with pytest.raises(APIError) as err:
            await pipeline.serve(_body(), "chat", Overrides())
        await _drain(first)
        (await waiting).answer.json()
        return err.value

    err = asyncio.run(run())
    assert err.status == 429 and err.code == "queue_full" and int(err.headers["Retry-After"]) >= 1


def test_live_quality_below_its_floor_switches_the_router_length_blind():
    """Predictions that order requests backwards: after enough of them the pool policy's head is
    no longer trusted, and its requests are decided by the fallback."""
    predictor = FakePredictor({"last": BINS})
    quality = {"window": 12, "floor": 0.55, "min_samples": 10}
    pipeline, fake = _pipeline(policy="last", predictor=predictor, slots=4, live_quality=quality,
                               tokens=lambda body: 1000 - body.max_tokens)  # the longer the cap, the shorter
    predictor.expected = lambda ids: 10.0
    caps = [900, 300, 800, 50, 600, 200, 950, 100, 400, 700, 150, 500]

    async def run():
        decided = []
        for cap in caps:
            predictor.expected = lambda ids, cap=cap: cap  # predicts the cap: the opposite order of the truth
            served = await pipeline.serve(_body(max_tokens=cap), "chat", Overrides())
            served.answer.json()
            decided.append(served.request.decided_by)
        served = await pipeline.serve(_body(max_tokens=500), "chat", Overrides())
        served.answer.json()
        return decided, served.request

    decided, after = asyncio.run(run())
    assert decided[0] == "last"
    assert not pipeline.quality["last"].trusted and pipeline.quality["last"].concordance() < 0.55
    assert (after.decided_by, after.fallback) == ("ray_default", "low_live_quality")


def test_a_waiting_requests_prediction_is_not_cut_at_the_critical_path_timeout():
    """predictor.timeout_s bounds what a pool policy waits for; a prediction beside a waiting
    request delays nothing, and is worth having whenever it lands before the request leaves."""
    predictor = FakePredictor({"last": BINS}, delay_s=0.2)
    pipeline, fake = _pipeline(predictor=predictor, tokens=3)
    pipeline.predictor._timeout_s = 0.05

    async def run():
        first = await pipeline.serve(_body("hold the slot", stream=True), "chat", Overrides())
        queue = pipeline.scheduler.queues[first.request.pool]
        waiting = asyncio.create_task(pipeline.serve(_body("waits"), "chat", Overrides()))
        while queue.ranked() < 1:  # its prediction lands after 0.2 s, four times the timeout
            await asyncio.sleep(0.01)
        await _drain(first)
        served = await waiting
        served.answer.json()
        return served.request

    request = asyncio.run(run())
    assert request.prediction is not None and request.prediction_failure is None and not request.on_prior


def test_a_prompt_seen_before_brings_its_own_lengths_and_every_ending_adds_one(tmp_path):
    history = {"path": str(tmp_path / "history.json"), "flush_interval_s": 3600}
    pipeline, _ = _pipeline(history=history)

    async def serve(text, max_tokens=1000):
        served = await pipeline.serve(_body(text, max_tokens=max_tokens), "chat", Overrides())
        served.answer.json()
        return served.request

    async def run():
        first, again = await serve("hi"), await serve("hi")
        capped, other = await serve("hi", max_tokens=3), await serve("ho")
        out = await pipeline.rollout(RolloutRequest(model="m", prompts=["hi"], n=2, max_tokens=1000))
        partial = await pipeline.rollout(RolloutRequest(model="m", prompts=["hi"], max_tokens=1000, budget_tokens=2))
        await pipeline.history.flush()
        return first, again, capped, other, out, partial

    first, again, capped, other, out, partial = asyncio.run(run())
    assert first.history is None and first.prompt_key == again.prompt_key != other.prompt_key
    assert (again.history.mean_tokens, again.history.count) == (5.0, 1)  # the fake answers 5 tokens
    assert capped.history.count == 2 and capped.natural_length() == (3, True)
    assert [(s["estimate_source"], s["estimated_tokens"]) for s in out["samples"]] == [("history", 5.0)] * 2
    assert partial["samples"][0]["status"] == "partial"
    restarted, _ = _pipeline(history=history)  # a restarted router replica reads what this one wrote
    # 5, 5, 3 (censored), 5, 5: the partial sample's 2 waits for its continuation
    assert restarted.history.lookup(first.prompt_key).count == 5
    assert pipeline.history.status()["prompts"] == 2
