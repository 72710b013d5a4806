"""A cold start end to end: `predictor.checkpoint: online` on real Ray Serve, real vLLM, real HTTP.

The stack starts with no head at all (any model's first day). It must serve every request length-
blind, send each finished request's features and true length to the learner deployment (cut answers
as censored ones), and refit once enough labels are in. Whether the first refit's head is installed
depends on what a dozen samples can learn, so the test asserts the refit and a decision, not the
outcome. Its own stack (marker own_cluster), before the shared one starts.
"""

import time

import httpx
import pytest

from tests.stack import RunningStack

pytestmark = [pytest.mark.stack, pytest.mark.own_cluster]

PROMPTS = ["Say hi.", "What is 2 + 3?", "Name a colour.", "Write one sentence about the sea.",
           "Count from 1 to 5.", "What is the capital of France?"]
MIN_SAMPLES = 8


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("learner")
    online = {"state_dir": str(state), "dispatched_share": 1.0, "min_samples": MIN_SAMPLES,
              "min_new_labels": MIN_SAMPLES, "min_interval_s": 0}
    running = RunningStack(tmp_path_factory.mktemp("online"), {"predictor": {"checkpoint": "online", "online": online},
                                                               "router": {"policy": "last_work"}})  # a final-layer head
    yield running.start()
    running.stop()


def _learner(stack) -> dict:
    body = httpx.get(f"{stack.base_url}/health", timeout=30).json()
    assert body["status"] == "ok", body
    return body["learner"]


def test_a_stack_with_no_head_serves_and_learns_from_its_own_traffic(stack):
    from openai import OpenAI

    client = OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    deadline = time.time() + 60
    while (status := _learner(stack))["labels"] < 1:  # the label of the request that found the stack ready
        assert time.time() < deadline, f"the start-up request's label never came: {status}"
        time.sleep(1)
    base = status
    assert status["version"] is None  # nothing learned yet: length-blind routing
    sent = cut = 0
    # A refit waits for MIN_SAMPLES labelled requests, some of them held out with a known length: a
    # held-out answer cut by its max_tokens cannot judge a head. Every third request is cut at 4
    # tokens (censored labels); the others get room to finish, so the held-out fifth (drawn by
    # request id) has exact lengths (with max_tokens 64 two in three were cut, and CI once drew
    # ten held-out rows that were all cut).
    while status["installs"] + status["rejections"] < 1:
        assert sent < 80, f"no refit decided after {sent} requests: {status}"
        for _ in range(4):
            reply = client.chat.completions.create(
                model=stack.model, max_tokens=4 if sent % 3 == 0 else 256,
                messages=[{"role": "user", "content": PROMPTS[sent % len(PROMPTS)]}])
            assert reply.choices[0].message.content is not None
            cut += reply.choices[0].finish_reason == "length"
            sent += 1
        deadline = time.time() + 60
        while (min((status := _learner(stack))["labels"] - base["labels"], status["features"] - base["features"]) < sent
               or status["refits"] > status["installs"] + status["rejections"]):
            assert time.time() < deadline, f"labels or a refit decision missing: {status}"
            time.sleep(1)
    assert cut >= sent // 3  # every third request stops at 4 tokens
    assert status["refits"] >= 1 and status["samples"] >= MIN_SAMPLES  # features and labels were paired
    assert status["censored_samples"] >= 1  # cut answers are kept, as lower bounds
    assert status["labels"] - base["labels"] == sent  # one label per finished request
    assert status["features"] - base["features"] >= sent  # every request predicted (share 1.0)
