"""Online learning wired into serving (no cluster): labels leave the pipeline as they should, a cold
start routes length-blind until its learned head earns trust, a predictor swaps heads between
batches, and a restarted predictor serves the learner's head at once."""

import asyncio
import itertools
import json
import threading
from types import SimpleNamespace

import pytest
import torch

from router.api.validation import parse_request
from predictor.checkpoint import load_checkpoint
from predictor.online import online_bins
from predictor.online.publish import publish_head
from router.scheduling.pools import Pools
from router.serving.config import RoutingPlan, StackConfig, head_checkpoint
from router.serving.pipeline import Overrides, Pipeline
from router.serving.replica_ledger import ledger
from tests import MODEL_DIR
from tests.fakes import FakePool, FakePredictor

BINS = online_bins(1024)
_names = (f"online-pool{i}" for i in itertools.count())


class FakeLearner:
    """The learner handle: records what the router sends it."""

    def __init__(self):
        self.labels_sent: list = []
        self.labels = self.status = self

    def remote(self, rows=None):
        if rows is None:  # status.remote()
            async def status():
                return {"version": None, "samples": len(self.labels_sent)}
            return status()
        self.labels_sent.extend(rows)


def _cold_pipeline(predictor, learner, policy="last", share=1.0, **pool):
    name = next(_names)
    config = StackConfig.model_validate({
        "pools": [{"name": name, "deployment": {"num_replicas": 1, "max_ongoing_requests": 8}}],
        "predictor": {"checkpoint": "online", "online": {"dispatched_share": share}},
        "router": {"policy": policy, "fallback_policy": "ray_default",
                   "live_quality": {"window": 20, "min_samples": 10, "floor": 0.55}}})
    plan = RoutingPlan(str(MODEL_DIR), Pools((name,), ()), {"last": BINS}, "last", prior_tokens=250.0)
    fake = FakePool(ledger(name), replicas=["r1"], **pool)
    return Pipeline(config, plan, {name: fake}, predictor, learner), fake


def _body(max_tokens: int, text: str = "hi", **extra):
    return parse_request(json.dumps({"model": "m", "messages": [{"role": "user", "content": text}],
                                     "max_tokens": max_tokens, **extra}).encode(), "chat")


def test_labels_reach_the_learner_only_for_natural_lengths():
    learner = FakeLearner()
    pipeline, fake = _cold_pipeline(FakePredictor({"last": BINS}), learner, tokens=40)

    async def run():
        served = []
        for body in (_body(100), _body(100, ignore_eos=True), _body(100, n=2), _body(100, min_tokens=30)):
            s = await pipeline.serve(body, "chat", Overrides())
            s.answer.json()
            served.append(s.request)
        pipeline.labels.flush()
        return served

    free, forced, several, floored = asyncio.run(run())
    assert learner.labels_sent == [(free.id, 40, False)]  # ignore_eos, n > 1, min_tokens: not the model's own length


def test_a_request_the_predictor_never_saw_sends_no_label():
    learner = FakeLearner()
    predictor = FakePredictor({"last": BINS})
    pipeline, _ = _cold_pipeline(predictor, learner, share=0.0, tokens=40)

    async def run():
        s = await pipeline.serve(_body(100), "chat", Overrides())  # a free slot: dispatched at once
        s.answer.json()
        pipeline.labels.flush()
        return s.request

    request = asyncio.run(run())
    assert not request.sent_to_predictor and request.completion_tokens == 40
    assert learner.labels_sent == []  # no features for it: its label would only wait to expire


def test_a_label_stopped_by_max_tokens_is_sent_as_censored():
    learner = FakeLearner()
    pipeline, _ = _cold_pipeline(FakePredictor({"last": BINS}), learner, tokens=16, finish="length")

    async def run():
        s = await pipeline.serve(_body(16), "chat", Overrides())
        s.answer.json()
        pipeline.labels.flush()
        return s.request

    request = asyncio.run(run())
    assert learner.labels_sent == [(request.id, 16, True)]


def test_a_cold_start_routes_length_blind_until_the_learned_head_earns_trust():
    """No head at first (the predictor answers no_head), then a learned head whose shadow
    predictions order requests right: only once live quality trusts it does it decide."""
    predictor = FakePredictor({"last": BINS})
    learner = FakeLearner()
    pipeline, fake = _cold_pipeline(predictor, learner, tokens=lambda body: body.max_tokens // 2, delay_s=0.02)

    async def answers_no_head(ids):
        return {"error": "no head yet", "code": "no_head"}

    cold = predictor.remote

    def remote(ids, request_id=None):
        predictor.request_ids.append(request_id)
        if learned["installed"]:
            return cold(ids, request_id)
        return answers_no_head(ids)

    learned = {"installed": False}
    predictor.remote = remote

    async def run():
        decided = []
        for i, cap in enumerate([900, 300, 800, 50, 600, 200, 950, 100, 400, 700] * 3):
            if i == 5:
                learned["installed"] = True  # the learner published its first head
            predictor.expected = lambda ids, cap=cap: cap / 2
            s = await pipeline.serve(_body(cap), "chat", Overrides())
            s.answer.json()
            await asyncio.sleep(0.01)  # the shadow prediction lands and is scored
            decided.append((s.request.decided_by, s.request.fallback))
        return decided

    decided = asyncio.run(run())
    assert decided[0] == ("ray_default", "low_live_quality")  # cold: the fallback decides
    assert pipeline.quality["last"].trusted and pipeline.quality["last"].switches == 1
    assert decided[-1] == ("last", None)  # trusted: the learned head decides
    assert all(rid is not None for rid in predictor.request_ids)  # the predictor knows whose features it keeps


def _estimator(max_batch_size: int = 4):
    from predictor.estimator import LengthEstimator
    from predictor.pooling import PoolingConfig

    return LengthEstimator.load(str(MODEL_DIR), {}, max_batch_size=max_batch_size, learn=PoolingConfig(method="last"))


def test_a_predictor_with_no_head_still_pools_features_and_takes_a_head_between_batches():
    estimator = _estimator()
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9]]
    results, vectors = estimator.predict_and_pool(prompts)
    assert results == [{}, {}, {}] and all(v.shape == (576,) for v in vectors)  # cold: features, no predictions
    head, meta = load_checkpoint(head_checkpoint("last"))
    estimator.set_head("last", head, meta)
    results, again = estimator.predict_and_pool(prompts)
    assert all(set(r) == {"last"} for r in results)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(vectors, again))


def test_a_head_swapped_under_concurrent_predictions_never_mixes_within_a_call():
    """One prompt per micro-batch, so a call runs four prefills: a swap landing between them must
    not give the call's rows two different heads."""
    estimator = _estimator(max_batch_size=1)
    head, meta = load_checkpoint(head_checkpoint("last"))
    shifted = load_checkpoint(head_checkpoint("last"))[0]
    with torch.no_grad():
        for member in shifted.members:  # another head: its predictions differ from the first's
            member[-1].bias.add_(torch.linspace(-3, 3, member[-1].bias.numel()))
    values = set()
    for h in (head, shifted):
        estimator.set_head("last", h, meta)
        values.add(round(estimator.predict_each([[1, 2, 3]])[0]["last"].expected_tokens, 3))
    assert len(values) == 2
    done, seen = threading.Event(), []

    def swap():
        for k in range(200):
            estimator.set_head("last", shifted if k % 2 == 0 else head, meta)
        done.set()

    thread = threading.Thread(target=swap)
    thread.start()
    while not done.is_set():
        seen.append({round(r["last"].expected_tokens, 3) for r in estimator.predict_each([[1, 2, 3]] * 4)})
    thread.join()
    assert seen and all(len(call) == 1 and call <= values for call in seen)


def test_a_restarted_predictor_serves_the_learners_head_at_once(tmp_path):
    """What was learned survives restarts: the learner's state directory holds the head, and a new
    predictor replica pulls it on its first call."""
    from deployments.learner_deployment import LengthLearner
    from deployments.predictor_deployment import LengthPredictor
    from predictor.model_files import model_weights_hash

    head, meta = load_checkpoint(head_checkpoint("last"))
    publish_head(tmp_path, 3, head, meta)
    learner_cls, predictor_cls = LengthLearner.func_or_class, LengthPredictor.func_or_class
    learner = learner_cls(str(tmp_path), 576, "SmolLM2", model_weights_hash(str(MODEL_DIR)), None, 256, 0.55, {}, 1024)
    assert learner.learner.current()[0] == 3  # resumed from the directory

    handle = SimpleNamespace(head=SimpleNamespace(remote=learner.head))  # learner.head.remote(version), awaited

    async def run():
        predictor = predictor_cls(str(MODEL_DIR), {}, learner=handle, max_batch_size=2, learned_head="last",
                                  learned_pooling=meta.pooling)
        puller = asyncio.get_running_loop().create_task(predictor._pull_heads())
        for _ in range(100):
            if predictor._version is not None:
                break
            await asyncio.sleep(0.05)
        puller.cancel()
        return predictor

    predictor = asyncio.run(run())
    assert predictor._version == 3 and "last" in predictor._estimator.predict_each([[1, 2, 3]])[0]


@pytest.mark.parametrize("policy,pooling", [("estp_work", "estp"), ("last_work", "last")])
def test_the_predictor_sends_the_learner_features_pooled_as_the_head_it_refits_reads(tmp_path, policy, pooling):
    from deployments.app import build_app

    app = build_app({"router": {"policy": policy},
                     "predictor": {"online": {"state_dir": str(tmp_path)}}})  # an absolute path stays as it is
    router = app._bound_deployment.init_kwargs
    predictor = router["predictor"]._bound_deployment.init_kwargs
    assert predictor["learned_head"] == pooling and predictor["learned_pooling"].method == pooling
