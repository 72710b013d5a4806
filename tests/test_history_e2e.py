"""The length history end to end, on a stack of its own that keeps one (the shared stack keeps none,
so that its tests' repeated prompts rank by the head they test): a rollout's lengths outlive the
router replica that saw them."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from router.scheduling.length_stats import censored_stats
from tests.stack import RunningStack
from tests.test_rollout_e2e import ROUTER, _engines, _health, _rollout

pytestmark = [pytest.mark.stack, pytest.mark.own_cluster]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("history")
    history = {"path": str(workdir / "length_history.json"), "flush_interval_s": 1}
    running = RunningStack(workdir, {"router": {"history": history}})
    yield running.start()
    running.stop()


def test_the_length_history_survives_a_router_restart(stack):
    prompts = [f"Name a fruit ({uuid.uuid4().hex[:6]}).", f"Name a tool ({uuid.uuid4().hex[:6]})."]  # unseen
    r = _rollout(stack, prompts=prompts, n=2, max_tokens=16)
    assert r.status_code == 200, r.text
    lengths = [[(s["completion_tokens"], s["finish_reason"] != "stop") for s in r.json()["samples"]
                if s["prompt_index"] == p] for p in (0, 1)]
    deadline = time.time() + 30
    while _health(stack)["history"]["unwritten"]:  # written every second
        assert time.time() < deadline
        time.sleep(0.5)
    [router] = _engines(stack, ROUTER)
    router.kill()
    deadline = time.time() + 300
    while True:  # Serve starts a new router replica, which reads the file
        assert time.time() < deadline, "the router did not come back"
        try:
            if httpx.get(f"{stack.base_url}/health", timeout=10).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(2)
    r = _rollout(stack, prompts=prompts, n=1, max_tokens=16, schedule="makespan")
    assert r.status_code == 200, r.text
    for s in r.json()["samples"]:
        assert s["estimate_source"] == "history"
        assert s["estimated_tokens"] == pytest.approx(censored_stats(lengths[s["prompt_index"]]).mean_tokens)
