"""Rollouts on a fake pool (no server): the plans' order and placement through the pool client and
the admission queue, every sample returned, a full queue ending the rollout with 429 and no
sample left running, first-k cutting the tail in the engines, partial samples continued where
they stopped. tests/test_rollout_e2e.py runs them on the real stack."""

import asyncio
from collections.abc import Callable

import pytest

from router.scheduling.pools import Pools
from router.scheduling.request import Request
from router.scheduling.scheduler import Scheduler
from router.serving.continuation import Continuations, Partial
from router.serving.errors import APIError
from router.serving.gate import Gate, QueueFull
from router.serving.pool_client import PoolClient
from router.serving.replica_ledger import ReplicaLedger
from router.serving.rollout import RolloutRequest, RolloutRunner
from tests.fakes import FakePool


def _runner(lengths: dict[str, int] | Callable, slots=4, per_replica=2, **runner) -> tuple[RolloutRunner, FakePool, Gate]:
    """`lengths`: each prompt's answer length, or a function of the body sent."""
    ledger = ReplicaLedger()
    fake = FakePool(ledger, replicas=["r1", "r2"], delay_s=0.0005,
                    tokens=lengths if callable(lengths) else lambda body: lengths[body.messages[0]["content"]])
    gate = Gate(Scheduler(Pools(("p",), ()), {"p": slots}, ["ray_default"], "ray_default"))

    async def render(request, body, kind):
        return [1, 2, 3], ""

    return RolloutRunner(PoolClient("p", fake, ledger), gate, None, render, 100, per_replica, **runner), fake, gate


def _request(lengths, **extra) -> RolloutRequest:
    prompts = list(lengths)
    return RolloutRequest(model="m", prompts=prompts, max_tokens=500, known_tokens=[[lengths[p]] for p in prompts],
                          **extra)



def test_makespan_starts_the_longest_first_on_the_replica_with_the_least_work():
    lengths = {"a": 100, "b": 10, "c": 50, "d": 70}
    runner, fake, gate = _runner(lengths)
    out = asyncio.run(runner.run(_request(lengths, schedule="makespan")))
    order = sorted(out["samples"], key=lambda s: s["dispatched_s"])
    assert [s["completion_tokens"] for s in order] == [100, 70, 50, 10]
    # a -> r1 (100), d -> r2 (70), c -> r2 (120 there vs 100), b: r2 is full (2 per replica) -> r1
    assert [c.replica for c in fake.calls] == ["r1", "r2", "r2", "r1"]
    assert [s["completion_tokens"] for s in out["samples"]] == [100, 10, 50, 70]  # in prompt order
    assert [s["replica"] for s in out["samples"]] == ["r1", "r1", "r2", "r2"]
    assert all(s["error"] is None and s["finished_s"] >= s["dispatched_s"] for s in out["samples"])
    assert gate.scheduler.queues["p"].inflight == 0 and runner.pool.ledger.loads(["r1", "r2"])[0].requests == 0


def test_every_sample_runs_under_its_own_internal_id_and_the_ledger_counts_them_right():
    lengths = {p: n for p, n in zip("abcdefgh", [30, 10, 25, 5, 40, 15, 20, 35])}
    runner, fake, _ = _runner(lengths)
    asyncio.run(runner.run(_request(lengths, schedule="makespan")))
    assert [c.internal_id for c in fake.calls] == [c.request_id for c in fake.calls]
    assert max(fake.peak.values()) <= 2  # the ledger's counts kept every replica within its limit


def test_padding_groups_similar_lengths_one_group_per_replica_at_a_time():
    lengths = {p: n for p, n in zip("abcdefgh", [80, 10, 70, 20, 60, 30, 50, 40])}
    runner, fake, _ = _runner(lengths, slots=8, per_replica=4)
    out = asyncio.run(runner.run(_request(lengths, schedule="padding", batch_size=2)))
    groups = {}
    for s in out["samples"]:
        groups.setdefault(s["group"], []).append(s["completion_tokens"])
    assert sorted(sorted(g) for g in groups.values()) == [[10, 20], [30, 40], [50, 60], [70, 80]]
    by_replica = {}
    for s in sorted(out["samples"], key=lambda s: s["dispatched_s"]):
        by_replica.setdefault(s["replica"], []).append(s)
    for lane in by_replica.values():  # a replica's next group starts after its previous group ended
        for before, after in zip(lane, lane[1:]):
            if before["group"] != after["group"]:
                assert after["dispatched_s"] >= max(x["finished_s"] for x in lane if x["group"] == before["group"])


def test_fifo_keeps_prompt_order_and_every_sample_of_n_comes_back():
    lengths = {"a": 5, "b": 50}
    runner, fake, _ = _runner(lengths)
    out = asyncio.run(runner.run(RolloutRequest(model="m", prompts=["a", "b"], n=3, max_tokens=500, schedule="fifo")))
    assert [s["completion_tokens"] for s in sorted(out["samples"], key=lambda s: s["dispatched_s"])] == [5] * 3 + [50] * 3
    assert [(s["prompt_index"], s["sample_index"]) for s in out["samples"]] == [(p, k) for p in (0, 1) for k in range(3)]
    assert all(s["text"] == "t" * s["completion_tokens"] for s in out["samples"])


def test_a_queue_that_fills_mid_rollout_is_a_429_with_no_sample_left_running():
    # The first sample is short, so its slot frees while the next three still decode: the full queue
    # must then cancel them mid-stream (equal lengths would all end together on a slow machine).
    lengths = {p: 10 if p == "a" else 4000 for p in "abcdefgh"}
    runner, fake, gate = _runner(lengths)
    offer, offered = gate.offer, []

    def fills_on_the_sixth(request: Request):
        offered.append(request)
        if len(offered) == 6:
            raise QueueFull("p", 3)  # online traffic filled the queue while the rollout waited for slots
        return offer(request)

    gate.offer = fills_on_the_sixth

    async def run():
        with pytest.raises(APIError) as err:
            await runner.run(_request(lengths, schedule="fifo"))
        await asyncio.sleep(0.01)  # anything left running would still be streaming now
        return err.value

    err = asyncio.run(run())
    assert err.status == 429 and err.headers["Retry-After"] == "3" and err.code == "queue_full"
    assert len(fake.calls) >= 4 and any(s.cancelled for s in fake.streams)
    assert sum(fake.active.values()) == 0  # every stream ended or was cancelled: nothing decodes for nobody
    assert gate.scheduler.queues["p"].inflight == 0 and len(gate.scheduler.queues["p"]) == 0
    assert all(load.requests == 0 for load in runner.pool.ledger.loads(["r1", "r2"]))


def _by_call(first: dict[str, list[int]], continued: int = 0):
    """Answer lengths in call order per prompt (a chat), and `continued` tokens for a continuation."""
    left = {prompt: iter(lengths) for prompt, lengths in first.items()}
    return lambda body: next(left[body.messages[0]["content"]]) if hasattr(body, "messages") else continued


def test_first_k_answers_once_k_samples_of_every_prompt_are_done_and_aborts_the_rest_in_the_engines():
    labels = []
    runner, fake, gate = _runner(_by_call({"a": [5, 3000, 3000], "b": [8, 3000, 3000]}), slots=6, per_replica=3,
                                 learn=lambda r: labels.append(r.natural_length()))

    async def run():
        out = await runner.run(RolloutRequest(model="m", prompts=["a", "b"], n=3, max_tokens=4000, k=1))
        return out, await runner.pool.engine_requests()

    out, engines = asyncio.run(run())
    assert (out["done"], out["cut"], out["partial"], out["failed"]) == (2, 4, 0, 0)
    for prompt in (0, 1):
        statuses = sorted(s["status"] for s in out["samples"] if s["prompt_index"] == prompt)
        assert statuses == ["cut", "cut", "done"]
    for s in out["samples"]:
        if s["status"] == "cut":
            assert s["finish_reason"] == "cut" and s["error"] is None and s["completion_tokens"] < 3000
    assert sum(s.cancelled for s in fake.streams) == 4  # every cut stream was cancelled...
    assert sum(fake.active.values()) == 0 and engines == {"r1": 0, "r2": 0}  # ...and nothing runs in the engines
    assert gate.scheduler.queues["p"].inflight == 0
    assert all(load.requests == 0 for load in runner.pool.ledger.loads(["r1", "r2"]))
    assert sorted(censored for _, censored in labels) == [False, False, True, True, True, True]


def test_a_share_of_the_batch_cuts_the_samples_still_waiting_without_starting_them():
    runner, fake, _ = _runner(_by_call({"a": [5, 6, 3000, 3000]}), slots=2, per_replica=1)
    out = asyncio.run(runner.run(RolloutRequest(model="m", prompts=["a"], n=4, max_tokens=4000, done_share=0.5)))
    assert (out["done"], out["cut"]) == (2, 2)
    # The third took the first freed slot and was cut mid-stream; the fourth never reached an engine.
    assert len(fake.calls) == 3 and sum(s.cancelled for s in fake.streams) == 1 and sum(fake.active.values()) == 0
    third, fourth = out["samples"][2:]
    assert third["status"] == "cut" and third["dispatched_s"] is not None
    assert (fourth["status"], fourth["completion_tokens"], fourth["dispatched_s"]) == ("cut", 0, None)


def test_a_sample_stopped_by_its_budget_is_partial_and_continues_where_it_stopped_on_its_replica():
    sent = []
    lengths = _by_call({"a": [50]}, continued=20)
    runner, fake, _ = _runner(lambda body: sent.append(body) or lengths(body))
    first = asyncio.run(runner.run(RolloutRequest(model="m", prompts=["a"], max_tokens=100, budget_tokens=30)))
    s = first["samples"][0]
    assert (first["partial"], s["status"], s["completion_tokens"], s["finish_reason"]) == (1, "partial", 30, "length")
    assert s["text"] == "t" * 30 and s["continuation_id"]

    again = asyncio.run(runner.run(RolloutRequest(model="m", continuations=[s["continuation_id"]], max_tokens=1,
                                                  budget_tokens=10)))
    c = again["samples"][0]
    body = sent[-1]
    assert body.prompt == [1, 2, 3] + [7] * 30 and body.max_tokens == 10  # the engine's ids, what remains (budget)
    assert (c["status"], c["continues"], c["prompt_index"], c["resumed_tokens"], c["completion_tokens"]) == (
        "partial", 0, None, 30, 10)
    assert c["replica"] == s["replica"]  # asked for the replica whose prefix cache holds it

    last = asyncio.run(runner.run(RolloutRequest(model="m", continuations=[c["continuation_id"]], max_tokens=1)))
    d = last["samples"][0]
    assert sent[-1].prompt == [1, 2, 3] + [7] * 40 and sent[-1].max_tokens == 60
    assert (d["status"], d["resumed_tokens"], d["completion_tokens"], d["continuation_id"]) == ("done", 40, 20, None)


@pytest.mark.parametrize("fields", [{"k": 4}, {"k": 0}, {"budget_tokens": 0}, {"k": 1, "done_share": 0.5},
                                    {"prompts": []}, {"done_share": 0}])
def test_bad_first_k_and_budgets_are_refused_before_anything_runs(fields):
    with pytest.raises(ValueError):
        RolloutRequest.model_validate({"model": "m", "prompts": ["a"], "n": 3, "max_tokens": 10, **fields})


def test_an_unknown_altered_or_foreign_continuation_is_a_400_and_nothing_runs():
    keys = Continuations(b"this router's key")
    runner, fake, _ = _runner({"a": 5}, continuations=keys)
    partial = Partial(model="m", prompt_ids=[1], output_ids=[2], remaining_tokens=5, prompt_key=None, replica=None)
    good = keys.issue(partial)
    foreign = keys.issue(Partial(**{**partial.__dict__, "model": "other"}))
    for token, kind in [("nonsense", "Unknown"), (good[:-2] + "AA", "Unknown"),
                        (Continuations(b"another key").issue(partial), "Unknown"), (foreign, "Foreign")]:
        with pytest.raises(APIError) as err:
            asyncio.run(runner.run(RolloutRequest(model="m", continuations=[good, token], max_tokens=5)))
        assert err.value.status == 400 and err.value.message.startswith(kind) and err.value.param == "continuations[1]"
    assert fake.calls == []
