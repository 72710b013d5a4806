"""Rollouts through the default stack: POST /v1/rollout on real vLLM replicas, first-k aborting in the
engines, a partial sample continued from the prefix cache."""

from __future__ import annotations

import threading
import time

import httpx
import psutil
import pytest

pytestmark = pytest.mark.stack

PROMPTS = ["Name a colour.", "What is 2 + 3?", "Say hi to a friend.", "Count to three."]
REPLICA = "ServeReplica:lengthserve:pool-default"
ROUTER = "ServeReplica:lengthserve:Router"


def _rollout(stack, **body) -> httpx.Response:
    return httpx.post(f"{stack.base_url}/v1/rollout", json={"model": stack.model, **body}, timeout=900)


@pytest.mark.parametrize("schedule", ["makespan", "padding"])
def test_a_small_rollout_returns_every_sample_in_order_with_its_length(stack, schedule):
    r = _rollout(stack, prompts=PROMPTS[:2], n=3, max_tokens=16, schedule=schedule, batch_size=2)
    assert r.status_code == 200, r.text
    samples = r.json()["samples"]
    assert [(s["prompt_index"], s["sample_index"]) for s in samples] == [(p, k) for p in range(2) for k in range(3)]
    for s in samples:
        assert s["error"] is None and 1 <= s["completion_tokens"] <= 16 and s["text"]
        assert s["estimated_tokens"] is not None and s["replica"]
        assert 0 <= s["dispatched_s"] <= s["first_token_s"] <= s["finished_s"]
    if schedule == "padding":  # groups of 2 in order of predicted length
        groups = sorted({s["group"] for s in samples})
        assert groups == [0, 1, 2]
        by_group = [[s["estimated_tokens"] for s in samples if s["group"] == g] for g in groups]
        assert all(max(a) <= min(b) for a, b in zip(by_group, by_group[1:]))


def test_bad_rollouts_are_openai_errors(stack):
    r = _rollout(stack, prompts=[], n=2, max_tokens=8)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = _rollout(stack, prompts=PROMPTS, n=2, max_tokens=8, known_tokens=[[1, 2]] * 4)
    assert r.status_code == 401  # a client may not tell the router lengths without the benchmark key
    assert r.json()["error"]["code"] == "invalid_benchmark_key"
    for bad in ({"k": 3}, {"k": 0}, {"budget_tokens": 0}, {"continuations": ["not-one-of-ours"]}):
        r = _rollout(stack, prompts=PROMPTS[:1], n=2, max_tokens=8, **bad)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", (bad, r.text)


def _engines(stack, replica: str = REPLICA) -> list[psutil.Process]:
    found = []
    for p in psutil.Process(stack.pid).children(recursive=True):
        try:
            if replica in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:  # gone, or a zombie not yet reaped (the killed replica): not an engine
            continue
    return found


def _health(stack) -> dict:
    return httpx.get(f"{stack.base_url}/health", timeout=30).json()


def test_first_k_answers_at_k_and_the_engines_hold_nothing_within_2_s(stack):
    r = _rollout(stack, prompts=["Write a long story about a dragon.", "List twenty animals."], n=4, max_tokens=200,
                 temperature=1.0, k=1)
    answered = time.time()
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["done"] >= 2 and out["cut"] >= 1 and out["done"] + out["cut"] == 8
    for prompt in (0, 1):
        assert sum(s["status"] == "done" for s in out["samples"] if s["prompt_index"] == prompt) >= 1
    for s in out["samples"]:
        if s["status"] == "cut":
            assert s["finish_reason"] == "cut" and s["error"] is None and s["completion_tokens"] < 200
    while any(n != 0 for replicas in _health(stack)["engine_requests"].values() for n in replicas.values()):
        assert time.time() - answered < 2.0, _health(stack)["engine_requests"]  # the target
        time.sleep(0.1)


def test_a_partial_sample_continues_where_it_stopped_from_the_prefix_cache(stack):
    # Over one 128-token KV block of prompt, so its first block is cached once the first call ends.
    prompt = "Here are some words: " + ", ".join(f"word{i}" for i in range(60)) + ". Write a long story using them."
    r = _rollout(stack, prompts=[prompt], max_tokens=64, budget_tokens=8, temperature=0.0)
    assert r.status_code == 200, r.text
    first = r.json()["samples"][0]
    assert (first["status"], first["completion_tokens"], first["finish_reason"]) == ("partial", 8, "length")
    assert first["text"] and first["continuation_id"] and r.json()["partial"] == 1
    r = _rollout(stack, continuations=[first["continuation_id"]], max_tokens=1, temperature=0.0)
    assert r.status_code == 200, r.text
    more = r.json()["samples"][0]
    assert more["continues"] == 0 and more["resumed_tokens"] == 8 and more["status"] == "done", more
    assert 1 <= more["completion_tokens"] <= 64 - 8 and more["text"]
    assert more["replica"] == first["replica"] and more["cached_prompt_tokens"] >= 128


def test_a_replica_killed_mid_rollout_loses_no_sample(stack):
    """Every sample ends completed or with the error that ended it; none is dropped."""
    engines = _engines(stack)
    assert len(engines) >= 2
    killer = threading.Timer(6.0, engines[0].kill)
    killer.start()
    try:
        r = _rollout(stack, prompts=PROMPTS, n=8, max_tokens=48)
    finally:
        killer.cancel()
    assert r.status_code == 200, r.text
    samples = r.json()["samples"]
    assert [(s["prompt_index"], s["sample_index"]) for s in samples] == [(p, k) for p in range(4) for k in range(8)]
    for s in samples:
        assert (s["error"] is None and s["completion_tokens"] >= 1) or (s["error"] and s["completion_tokens"] is None), s
    assert sum(s["error"] is None for s in samples) >= len(samples) // 2  # the surviving replica served the rest
    deadline = time.time() + 400
    while len(_engines(stack)) < 2:
        assert time.time() < deadline, "the replica did not come back"
        time.sleep(2)
