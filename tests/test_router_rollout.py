"""The rollout schedules on a fake pool (no server): longest-first balancing, similar-length groups."""

import asyncio
import json

from router.admission import AdmissionQueue
from router.replica_ledger import ReplicaLedger
from router.rollout import RolloutRequest, RolloutRunner
from router.waiting import PoolGate


class _FakePool:
    """A pool whose replicas answer `tokens` tokens per request after a pause; records dispatches."""

    def __init__(self, ledger: ReplicaLedger, lengths: dict[str, int]):
        self.ledger, self.lengths, self.sent, self.active = ledger, lengths, [], {}
        self.chat = self

    def remote(self, body, _):
        prompt = body.messages[0]["content"]
        replica = self.ledger.pinned(body.request_id)
        self.ledger.routed(body.request_id, body.request_id, replica or "ray")
        self.sent.append((prompt, replica))
        self.active[replica] = self.active.get(replica, 0) + 1
        return self._stream(prompt, replica)

    async def _stream(self, prompt, replica):
        n = self.lengths[prompt]
        await asyncio.sleep(0.001 * n)
        delta = {"choices": [{"index": 0, "delta": {"content": "x" * n}, "finish_reason": "length"}]}
        usage = {"choices": [], "usage": {"completion_tokens": n}}
        self.active[replica] -= 1
        yield [f"data: {json.dumps(delta)}\n\n", f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n"]


def _runner(lengths, slots=4, per_replica=2):
    ledger = ReplicaLedger()
    ledger.set_replicas(["r1", "r2"])
    pool = _FakePool(ledger, lengths)
    gate = PoolGate(AdmissionQueue(slots))

    async def render(body, kind):
        return [[1, 2, 3]], ""

    return RolloutRunner("p", pool, gate, ledger, None, render, 100, per_replica), pool


def _request(lengths, **extra) -> RolloutRequest:
    prompts = list(lengths)
    return RolloutRequest(model="m", prompts=prompts, max_tokens=500, known_tokens=[[lengths[p]] for p in prompts],
                          **extra)


def test_makespan_starts_the_longest_first_on_the_least_loaded_replica():
    lengths = {"a": 100, "b": 10, "c": 50, "d": 70}
    runner, pool = _runner(lengths)
    out = asyncio.run(runner.run(_request(lengths, schedule="makespan")))
    assert [p for p, _ in pool.sent] == ["a", "d", "c", "b"]
    # a -> r1 (100), d -> r2 (70), c -> r2 (120 there vs 100), b: r2 is full (2 per replica) -> r1
    assert [r for _, r in pool.sent] == ["r1", "r2", "r2", "r1"]
    assert [s["completion_tokens"] for s in out["samples"]] == [100, 10, 50, 70]  # in prompt order
    assert all(s["error"] is None and s["finished_s"] >= s["dispatched_s"] for s in out["samples"])
    assert runner._gate.queue.inflight == 0


def test_padding_groups_similar_lengths_one_group_per_replica_at_a_time():
    lengths = {p: n for p, n in zip("abcdefgh", [80, 10, 70, 20, 60, 30, 50, 40])}
    runner, pool = _runner(lengths, slots=8, per_replica=4)
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
    runner, pool = _runner(lengths)
    out = asyncio.run(runner.run(RolloutRequest(model="m", prompts=["a", "b"], n=3, max_tokens=500, schedule="fifo")))
    assert [p for p, _ in pool.sent] == ["a"] * 3 + ["b"] * 3
    assert [(s["prompt_index"], s["sample_index"]) for s in out["samples"]] == [(p, k) for p in (0, 1) for k in range(3)]
