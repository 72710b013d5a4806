"""The paper's length pools end to end: three pools of one replica, policy estp, on a stack of its own.

ray_config.yaml's default is one pool behind the router's queue (tests/test_work_e2e.py); this
module starts ray_config.yaml with the pools list the paper's design uses (short, medium, long),
before the shared stack exists (marker own_cluster: two stacks at once overload the machine).
Which prompts the checkpoint calls short or long is its own business, so tests that need both
ask /v1/length first and pick their prompts from the answers. The predictor-kill test runs last
in this file: it leaves the stack serving, and waits until the predictor is back.
"""

import asyncio
import json
import time
from contextlib import AsyncExitStack

import httpx
import psutil
import pytest

from router.scheduling.pools import Pools

from tests.stack import RunningStack

pytestmark = [pytest.mark.stack, pytest.mark.own_cluster]

POOLS = ["short", "medium", "long"]
API_KEY = "pools-test-key"  # this stack also serves with API keys on (router.api.auth)
POOL_ARGS = {
    "pools": [{"name": name, "deployment": {"num_replicas": 1, "max_ongoing_requests": 16}} for name in POOLS],
    "predictor": {"predict": "all"},  # work policies (via the benchmark header) predict every request too
    "router": {"policy": "estp", "fallback_policy": "input_length", "input_edges": [64, 100],
               "benchmark_headers": True},
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """This module's own stack (it shadows the shared one): the pools, then stopped at the module's end."""
    running = RunningStack(tmp_path_factory.mktemp("pools"), POOL_ARGS, api_key=API_KEY).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=300)
SHORT = "Say hi."
# Math word problems: the ESTP head gives them the most mass above the medium edge.
LONG_CANDIDATES = [
    "Monica tosses a fair 6-sided die. If the roll is a prime number, she wins that amount of dollars. "
    "If the roll is composite, she wins nothing. Otherwise she loses 3 dollars. What is the expected "
    "value of her winnings on one die toss?",
    "I have 5 shirts, 3 pairs of pants and 4 hats. The pants come in red, blue and green. How many "
    "outfits can I make if I refuse to wear an outfit in which the hat and the pants are the same colour?",
    "What is the slope of a log N(>F) vs. log F curve for a homogeneous distribution of objects, each "
    "of luminosity L?",
]


def _chat(stack, content: str, **extra) -> dict:
    return {"model": stack.model, "messages": [{"role": "user", "content": content}], **extra}


def _post(stack, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{stack.base_url}{path}", json=body, timeout=300, headers={**stack.client_headers,
                                                                                  **(headers or {})})


def _get(stack, path: str) -> httpx.Response:
    return httpx.get(f"{stack.base_url}{path}", timeout=30, headers=stack.client_headers)


def _predict(stack, content: str, **extra) -> dict:
    r = _post(stack, "/v1/length", _chat(stack, content, **extra))
    assert r.status_code == 200, r.text
    return r.json()


def _stream_headers(stack, body: dict, headers: dict | None = None) -> httpx.Headers:
    """Open a stream, keep only its headers, and hang up (the router cancels the rest)."""
    with httpx.stream("POST", f"{stack.base_url}/v1/chat/completions", json={**body, "stream": True},
                      timeout=300, headers={**stack.client_headers, **(headers or {})}) as r:
        assert r.status_code == 200
        return r.headers


def test_length_endpoint_predicts_on_the_engines_tokens(stack):
    prediction = _predict(stack, "Name a colour.")
    assert prediction["object"] == "length_prediction" and prediction["predictor"] == "estp"
    assert prediction["bin"] in POOLS and set(prediction["pool_probabilities"]) == set(POOLS)
    q = prediction["quantiles"]
    assert 0 <= q["p10"] <= q["p50"] <= q["p90"] <= 1024 and prediction["expected_tokens"] > 0
    answer = _post(stack, "/v1/chat/completions", _chat(stack, "Name a colour.", max_tokens=4)).json()
    assert prediction["prompt_tokens"] == answer["usage"]["prompt_tokens"]  # the template the engine used

    completion = _post(stack, "/v1/length", {"model": stack.model, "prompt": "The capital of France is",
                                             "max_tokens": 8})
    assert completion.status_code == 200
    assert completion.json()["expected_tokens"] <= 8 and completion.json()["bin"] == "short"  # capped


def test_bad_length_request_is_an_openai_error(stack):
    r = _post(stack, "/v1/length", {"model": stack.model})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_json_and_stream_responses_carry_the_prediction(stack):
    r = _post(stack, "/v1/chat/completions", _chat(stack, "Name a fruit.", max_tokens=8))
    assert r.status_code == 200
    body = r.json()
    prediction, routing = body["length_prediction"], body["routing"]
    assert prediction["expected_tokens"] <= 8 and prediction["bin"] == "short"  # max_tokens caps it
    assert r.headers["x-length-bin"] == "short" and r.headers["x-pool"] == routing["pool"] == "short"
    assert int(r.headers["x-predicted-tokens"]) <= 8 and routing["policy"] == "estp"
    assert body["usage"]["completion_tokens"] >= 1

    with httpx.stream("POST", f"{stack.base_url}/v1/completions", timeout=300, headers=stack.client_headers, json={
        "model": stack.model, "prompt": "One, two, three,", "max_tokens": 6, "stream": True,
    }) as s:
        assert s.headers["x-pool"] == "short" and "x-predicted-tokens" in s.headers
        events = [line for line in s.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e[6:]) for e in events if e != "data: [DONE]"]
    assert events[-1] == "data: [DONE]"
    # The router asks vLLM for usage to score the prediction; the client did not, so gets none.
    assert chunks and all(c.get("usage") is None and c["choices"] for c in chunks)


def test_short_and_long_predictions_land_in_different_pools(stack):
    short = _predict(stack, SHORT)
    longer = next((p for p in map(lambda c: (c, _predict(stack, c)), LONG_CANDIDATES)
                   if POOLS.index(p[1]["bin"]) > POOLS.index(short["bin"])), None)
    assert longer is not None, f"the checkpoint predicts every candidate at least as short as {SHORT!r}"
    long_prompt, long_prediction = longer
    # max_tokens above the long pool's edge leaves the pool choice as predicted.
    for prompt, prediction in ((SHORT, short), (long_prompt, long_prediction)):
        headers = _stream_headers(stack, _chat(stack, prompt, max_tokens=600))
        assert headers["x-length-bin"] == prediction["bin"]
        assert headers["x-pool"] == prediction["bin"], headers


def _wait_idle(stack, timeout_s: float = 120) -> None:
    """Streams hung up by earlier tests leave the router's in-flight counts shortly after."""
    deadline = time.time() + timeout_s
    while any(_get(stack, "/health").json()["inflight"].values()):
        assert time.time() < deadline, "requests still in flight"
        time.sleep(1)


def test_saturated_pool_spills_to_its_neighbour(stack):
    capacity = 16  # max_ongoing_requests x 1 replica per pool in ray_config.yaml
    # Identical requests share a pool; ignore_eos keeps each busy for 500 tokens, far longer than
    # the test needs, and hanging up at the end cancels them.
    holder = _chat(stack, "Count upwards from one.", max_tokens=500, ignore_eos=True, stream=True)
    # ignore_eos: the answer is 500 tokens, so max_tokens is its length (router.scheduling.signals),
    # whatever the head would say, and no prediction can time out and hand the choice to the fallback.
    prediction = _predict(stack, "Count upwards from one.", max_tokens=500, ignore_eos=True)
    edges = _get(stack, "/health").json()["output_edges"]
    pool = Pools(tuple(POOLS), tuple(edges)).pool_of(500)
    assert (prediction["source"], prediction["bin"]) == ("max_tokens", pool)
    # A 500-token floor puts it in the last pool whatever the head says (router.scheduling.scheduler).
    assert pool == POOLS[-1], edges
    i = POOLS.index(pool)
    neighbour = POOLS[i + 1] if i + 1 < len(POOLS) else POOLS[i - 1]  # the longer one when both exist
    _wait_idle(stack)

    async def run():
        limits = httpx.Limits(max_connections=capacity + 8)
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=300, limits=limits,
                                     headers=stack.client_headers) as client:
            async with AsyncExitStack() as held:
                opened = await asyncio.gather(*(
                    held.enter_async_context(client.stream("POST", "/v1/chat/completions", json=holder))
                    for _ in range(capacity + 2)
                ))
                health = (await client.get("/health")).json()
                return [r.headers for r in opened], health

    headers, health = asyncio.run(run())
    assert health["inflight"][pool] == capacity and health["inflight"][neighbour] == 2
    assert sorted(h["x-pool"] for h in headers) == sorted([pool] * capacity + [neighbour] * 2)
    for h in headers:
        assert (h["x-length-source"], h["x-length-bin"]) == ("max_tokens", pool)
        assert h.get("x-spilled-from") == (pool if h["x-pool"] == neighbour else None)


def test_benchmark_headers_choose_policy_and_head_per_request(stack, client):
    import openai

    _wait_idle(stack)  # no spillover from the streams of earlier tests
    estp = _predict(stack, SHORT, max_tokens=600)
    r = _post(stack, "/v1/length", _chat(stack, SHORT, max_tokens=600), headers={**stack.client_headers, "X-Routing-Policy": "egtp"})
    assert r.status_code == 200 and r.json()["routing"]["policy"] == "egtp"
    assert r.json()["expected_tokens"] != estp["expected_tokens"]  # the EGTP head, from the same prefill
    assert "routing" not in estp  # no header: the default answer, unchanged

    told = {"X-Routing-Policy": "oracle", "X-True-Output-Tokens": "1000"}
    oracle = _stream_headers(stack, _chat(stack, SHORT, max_tokens=1100), told)
    assert oracle["x-routing-policy"] == "oracle" and oracle["x-pool"] == POOLS[-1]
    # max_tokens caps the true length too: 4 tokens at most is short, whatever the header says.
    assert _post(stack, "/v1/chat/completions", _chat(stack, SHORT, max_tokens=4), told).headers["x-pool"] == POOLS[0]
    turns = [_post(stack, "/v1/chat/completions", _chat(stack, SHORT, max_tokens=2),
                   headers={**stack.client_headers, "X-Routing-Policy": "round_robin"}).headers["x-pool"] for _ in POOLS]
    assert sorted(turns) == sorted(POOLS)
    # A fixed length reaches the engine: exactly that many tokens, whatever the model would say.
    fixed = client.chat.completions.create(**_chat(stack, SHORT, max_tokens=50),
                                           extra_headers={**stack.client_headers, "X-Fixed-Output-Tokens": "23"})
    assert fixed.usage.completion_tokens == 23
    with pytest.raises(openai.BadRequestError, match="Unknown routing policy"):
        client.chat.completions.create(**_chat(stack, SHORT, max_tokens=2), extra_headers={**stack.client_headers, "X-Routing-Policy": "fast"})


def test_a_prediction_that_lands_after_dispatch_updates_the_replicas_work_estimate(stack):
    """estp_work dispatches at once (slots free) and predicts beside the request (predict: all)."""
    _wait_idle(stack)
    body = _chat(stack, "Count upwards from one.", max_tokens=300, ignore_eos=True, stream=True)
    with httpx.stream("POST", f"{stack.base_url}/v1/chat/completions", json=body, timeout=300,
                      headers={**stack.client_headers, "X-Routing-Policy": "estp_work"}) as s:
        assert s.headers["x-routing-policy"] == "estp_work" and float(s.headers["x-queue-ms"]) == 0.0
        assert s.headers["x-length-source"] == "max_tokens"  # ignore_eos: the cap is its length, nothing to predict
        pool, lines = s.headers["x-pool"], s.iter_lines()
        deadline, seen = time.time() + 60, []
        while time.time() < deadline:
            next(lines)  # keep the stream flowing
            replicas = _get(stack, "/health").json()["replicas"][pool]
            seen = [r for r in replicas.values() if r["requests"] and r["predicted_remaining_tokens"] > 1]
            if seen:  # without an estimate a request counts as one token
                break
        assert seen, f"no replica of {pool} got the late prediction: {replicas}"
        assert seen[0]["requests"] == 1 and 0 < seen[0]["predicted_remaining_tokens"] <= 300
        first = seen[0]["predicted_remaining_tokens"]
        for _ in range(40):
            next(lines)
        later = [r for r in _get(stack, "/health").json()["replicas"][pool].values() if r["requests"]][0]
        assert later["predicted_remaining_tokens"] < first  # its estimate less what it has streamed since


def test_api_keys_guard_everything_but_health(stack):
    body = _chat(stack, "Hi", max_tokens=2)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(f"{stack.base_url}/v1/models", headers=headers, timeout=30).status_code == 401
        # The key is checked before the body is read: a caller without one learns nothing about bodies.
        r = httpx.post(f"{stack.base_url}/v1/chat/completions", content=b"{not json", headers=headers, timeout=60)
        assert r.status_code == 401
    assert httpx.get(f"{stack.base_url}/health", timeout=30).status_code == 200  # probes need no secret
    assert _post(stack, "/v1/chat/completions", body).status_code == 200
    # The benchmark headers need their own key on top: without it, 401 even with an API key.
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, timeout=60,
                   headers={"Authorization": f"Bearer {API_KEY}", "X-Routing-Policy": "oracle",
                            "X-True-Output-Tokens": "0"})
    assert r.status_code == 401 and "benchmark key" in r.json()["error"]["message"]


def _predictor_replicas(stack) -> list[psutil.Process]:
    tree = psutil.Process(stack.pid).children(recursive=True)
    return [p for p in tree if "length-predictor" in " ".join(p.cmdline())]


def test_dead_predictor_never_fails_a_request(stack):
    [replica] = _predictor_replicas(stack)
    replica.kill()
    replica.wait(30)
    # max_tokens 4 is the length: the pool policy decides by it and never asks the predictor.
    r = _post(stack, "/v1/chat/completions", _chat(stack, "Name a colour.", max_tokens=4))
    assert r.status_code == 200, r.text
    assert (r.headers["x-routing-policy"], r.headers["x-length-source"]) == ("estp", "max_tokens")
    assert "x-routing-fallback" not in r.headers and r.json()["length_prediction"]["source"] == "max_tokens"
    # A request that needs the head goes to the fallback policy and is served.
    r = _post(stack, "/v1/chat/completions", _chat(stack, "Name a colour.", max_tokens=600))
    assert r.status_code == 200, r.text
    assert r.headers["x-routing-fallback"] in ("error", "timeout") and r.headers["x-routing-policy"] == "input_length"
    assert r.json()["length_prediction"] is None and r.json()["choices"][0]["message"]["content"]

    deadline = time.time() + 300  # Serve restarts the replica: leave the stack as we found it
    while _post(stack, "/v1/length", _chat(stack, "Name a colour.")).status_code != 200:
        assert time.time() < deadline, "the predictor did not come back"
        time.sleep(5)

