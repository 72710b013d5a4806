"""Length signals and the predictor budget on the serving path, on fake handles: a client's hint
ranks a waiting request with no prediction, the budget skips what cannot pay, each source is
scored and distrusted on its own, and every decision shows on the record, the log and /health."""

import asyncio
import json

from router.api.validation import parse_request
from router.serving.pipeline import Overrides
from router.serving.request_log import RequestLog
from tests.fakes import FakePredictor
from tests.test_serving_pipeline import BINS, _drain, _pipeline


def _body(text: str = "hi", stream: bool = False, max_tokens: int = 1000, hint=None):
    payload = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream,
               "max_tokens": max_tokens}
    if hint is not None:
        payload["metadata"] = {"expected_output_tokens": hint}
    return parse_request(json.dumps(payload).encode(), "chat")


async def _while_one_holds_the_slot(pipeline, *bodies, overrides=(), hold=None):
    """Each body waits behind a stream that holds the only slot; their records, served once it ends."""
    first = await pipeline.serve(_body("hold the slot", stream=True), "chat", Overrides())
    queue = pipeline.scheduler.queues[first.request.pool]
    tasks = []
    for i, body in enumerate(bodies):
        tasks.append(asyncio.create_task(pipeline.serve(body, "chat", overrides[i] if overrides else Overrides())))
        while len(queue) < i + 1:
            await asyncio.sleep(0.001)
    waiting = list(queue._waiting)
    if hold is not None:
        await hold(waiting)
    await _drain(first)

    async def finish(task):  # each answer read as it comes: an unread one holds its slot
        served = await task
        served.answer.json()
        return served.request

    return waiting, await asyncio.gather(*(finish(t) for t in tasks))


def test_a_hinted_waiting_request_ranks_by_its_hint_and_is_never_predicted(tmp_path):
    predictor = FakePredictor({"last": BINS})
    pipeline, fake = _pipeline(predictor=predictor, tokens=3)
    pipeline.request_log = RequestLog(tmp_path / "requests.jsonl")

    (hinted,), _ = asyncio.run(_while_one_holds_the_slot(pipeline, _body("tell", hint="40")))
    assert (hinted.hint_tokens, hinted.rank_tokens, hinted.on_prior) == (40, 40.0, False)
    assert hinted.estimate.source == "hint"
    assert hinted.budget.verdict == "skipped_by_signal" and hinted.prediction is None and predictor.calls == 0
    assert pipeline.quality["hint"].scored == 1  # scored against its real length like any head
    assert pipeline.status()["predictor_budget"]["decisions"] == {
        "predicted": 0, "skipped_by_budget": 0, "skipped_by_signal": 1}
    logged = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    mine = next(e for e in logged if e["id"] == hinted.id)
    assert mine["budget"]["verdict"] == "skipped_by_signal" and mine["estimate"]["source"] == "hint"


def test_the_budget_skips_predictions_that_cannot_pay_and_a_benchmark_may_overrule_it():
    predictor = FakePredictor({"last": BINS}, prefill_s_per_token=10.0)  # a very slow prefill
    pipeline, fake = _pipeline(predictor=predictor, tokens=3)

    async def run():
        pipeline.scheduler.budget.slot.observe(0.001, 1)  # and a fast engine
        return await _while_one_holds_the_slot(
            pipeline, _body("skip me"), _body("predict me"),
            overrides=[Overrides(), Overrides(budget="always")])

    (skipped, forced), _ = asyncio.run(run())
    assert pipeline.scheduler.budget.prefill.per_token == 10.0  # measured at the predictor's start
    assert skipped.budget.verdict == "skipped_by_budget" and skipped.budget.cost_s > skipped.budget.gain_s
    assert skipped.on_prior and skipped.prediction is None
    assert forced.budget.verdict == "predicted" and forced.prediction is not None and predictor.calls == 1
    assert pipeline.status()["predictor_budget"]["decisions"]["skipped_by_budget"] == 1


def test_each_answer_keeps_the_prefill_cost_current():
    predictor = FakePredictor({"last": BINS}, prefill_s_per_token=0.002)
    pipeline, fake = _pipeline(predictor=predictor, tokens=3)
    pipeline.scheduler.budget.mode = "always"  # these requests are predicted whatever they would pay

    async def run():
        await _while_one_holds_the_slot(pipeline, _body("a"))  # the probe, then a prediction's own answer
        predictor.prefill_s_per_token = 0.004
        return await _while_one_holds_the_slot(pipeline, _body("b"), _body("c"))

    asyncio.run(run())
    assert predictor.calls == 3
    assert 0.002 < pipeline.scheduler.budget.prefill.per_token < 0.004  # moving towards what batches take now
    assert pipeline.scheduler.budget.slot.per_token is not None  # finished requests time a slot
    report = pipeline.status()["predictor_budget"]
    assert report["mode"] == "always" and report["share"] == 1.0 and report["prefill_s_per_token"] > 0.002


def test_hints_that_order_requests_backwards_lose_trust_and_stop_ranking():
    """Scored per source: a client whose hints say the opposite of the truth is distrusted like a bad
    head, and its waiting requests are then predicted instead."""
    predictor = FakePredictor({"last": BINS})
    quality = {"window": 12, "floor": 0.55, "min_samples": 10}
    pipeline, fake = _pipeline(predictor=predictor, live_quality=quality,
                               tokens=lambda body: 1000 - body.metadata.expected_output_tokens if body.metadata else 3)

    async def run():
        for hint in [900, 300, 800, 50, 600, 200, 950, 100, 400, 700, 150, 500]:
            served = await pipeline.serve(_body(hint=hint), "chat", Overrides())
            served.answer.json()
        return await _while_one_holds_the_slot(pipeline, _body("waits", hint=30))

    waiting, _ = asyncio.run(run())
    assert not pipeline.quality["hint"].trusted and "hint" in pipeline.scheduler.distrusted
    assert pipeline.quality["last"].trusted
    late = waiting[-1]
    assert late.budget.verdict == "predicted" and late.prediction is not None and late.estimate.source == "head"


def test_the_length_endpoint_answers_the_cheapest_signal_and_predicts_only_without_one():
    predictor = FakePredictor({"last": BINS})
    pipeline, _ = _pipeline(predictor=predictor)

    hinted = asyncio.run(pipeline.length(_body(hint=70), "chat", Overrides()))
    capped = asyncio.run(pipeline.length(_body(max_tokens=4), "chat", Overrides()))
    assert (hinted.estimate.source, hinted.estimate.expected_tokens) == ("hint", 70.0)
    assert (capped.estimate.source, capped.estimate.quantiles["p90"]) == ("max_tokens", 4.0)
    assert predictor.calls == 0
    predicted = asyncio.run(pipeline.length(_body(), "chat", Overrides()))
    assert predicted.estimate.source == "head" and predictor.calls == 1
    pipeline.scheduler.trust("last", False)  # a distrusted head still answers the client who asks for it
    assert asyncio.run(pipeline.length(_body(), "chat", Overrides())).estimate.source == "head"


def test_a_fixed_length_replay_keeps_the_clients_own_cap_as_its_signal():
    """X-Fixed-Output-Tokens sets max_tokens only at dispatch: a request the engine answers in 5
    tokens still ranks by what its client asked (here no small cap: the hint)."""
    pipeline, fake = _pipeline(predictor=FakePredictor({"last": BINS}), tokens=lambda body: body.max_tokens)

    (replayed,), _ = asyncio.run(_while_one_holds_the_slot(
        pipeline, _body("replayed", hint=300), overrides=[Overrides(fixed_tokens=5)]))
    assert replayed.max_tokens == 1000 and replayed.estimate.source == "hint" and replayed.completion_tokens == 5


def test_a_pool_policy_pools_a_hinted_request_by_its_hint_without_a_prefill():
    """The paper's pool policies wait for the prediction before they can pick a pool, but not where
    a cheaper signal gives the length: a hinted request goes at once, pooled by its hint."""
    predictor = FakePredictor({"last": BINS})
    pipeline, _ = _pipeline(policy="last", predictor=predictor)

    async def serve(body):
        served = await pipeline.serve(body, "chat", Overrides())
        served.answer.json()
        return served.request

    hinted = asyncio.run(serve(_body(hint="40")))
    assert (hinted.decided_by, hinted.fallback, hinted.estimate.source) == ("last", None, "hint")
    assert hinted.prediction is None and predictor.calls == 0
    unhinted = asyncio.run(serve(_body()))
    assert (unhinted.decided_by, unhinted.estimate.source, predictor.calls) == ("last", "head", 1)
