"""Bad input gets an OpenAI-format error with the right status, and the server keeps serving."""

import httpx
import openai
import pytest

pytestmark = pytest.mark.stack


def _chat(stack, **overrides) -> dict:
    body = {"model": stack.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    body.update(overrides)
    return body


def _post(stack, path: str, content: bytes | None = None, json_body=None) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return httpx.post(f"{stack.base_url}{path}", content=content, json=json_body, headers=headers, timeout=120)


def _assert_error(r: httpx.Response, status: int, fragment: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert fragment.lower() in err["message"].lower(), err


@pytest.fixture
def still_serving(client, stack):
    yield
    r = client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "Still there?"}], max_tokens=2
    )
    assert r.usage.completion_tokens >= 1


CASES = {
    "malformed_json": (b'{"model": "x", "messages": [', 400, "not valid JSON"),
    "not_an_object": (b'["a", "b"]', 400, "JSON object"),
    "non_utf8": (b'{"model": "\xff\xfe"}', 400, "UTF-8"),
    # 10 KB of nesting: a RecursionError (500) before; FastAPI's parser answers 400.
    "deeply_nested": (b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, ""),
}


@pytest.mark.parametrize("name", list(CASES))
def test_unparseable_bodies(stack, still_serving, name):
    raw, status, fragment = CASES[name]
    _assert_error(_post(stack, "/v1/chat/completions", content=raw), status, fragment)


@pytest.mark.parametrize(
    "overrides,param,fragment",
    [
        ({"messages": "hi"}, "messages", "valid list"),
        ({"temperature": "hot"}, "temperature", "valid number"),
        ({"messages": []}, "messages", "at least one message"),
        ({"max_tokens": 0}, "max_tokens", "at least 1"),
        ({"max_tokens": -3}, "max_tokens", "at least 1"),
        ({"max_tokens": 100000}, "max_tokens", "exceeds the model's context"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role", "invalid role"),
        ({"n": 1000, "max_tokens": 2}, "n", "exceeds this server's limit"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "stop"),
        ({"chat_template": "{% for i in range(10**9) %}x{% endfor %}"}, "chat_template", "not accepted"),
        # vLLM's CPU sampler kills the engine on a seeded request; still_serving checks it lives.
        ({"seed": 1}, "seed", "not supported"),
        # The field as the client sent it, not the validator's union members and wrappers.
        ({"messages": [{"role": "user", "content": None}]}, "messages.0.content", "valid string"),
        ({"stop": [1]}, "stop.0", "valid string"),
        ({"response_format": {"type": "nope"}}, "response_format.type", "'text'"),
        # A length hint: a whole number of tokens within the context (router.api.protocol).
        ({"metadata": {"expected_output_tokens": "lots"}}, "metadata.expected_output_tokens", "whole number"),
        ({"metadata": {"expected_output_tokens": 0}}, "metadata.expected_output_tokens", "greater than or equal to 1"),
        ({"metadata": {"expected_output_tokens": 100000}}, "metadata.expected_output_tokens", "context"),
        ({"metadata": {"team": 3}}, "metadata", "must be a string"),
    ],
)
def test_invalid_fields(stack, still_serving, overrides, param, fragment):
    r = _post(stack, "/v1/chat/completions", json_body=_chat(stack, **overrides))
    _assert_error(r, 400, fragment)
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("missing", ["model", "messages"])
def test_missing_fields(stack, still_serving, missing):
    body = _chat(stack)
    del body[missing]
    r = _post(stack, "/v1/chat/completions", json_body=body)
    _assert_error(r, 400, f"'{missing}'")


def test_a_hint_never_fails_a_request_it_fits(client, stack, still_serving):
    """A hint above max_tokens, or on a completions call, is a hint: the cap wins, nothing fails."""
    r = client.chat.completions.with_raw_response.create(
        model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=50,
        metadata={"expected_output_tokens": "4000", "team": "search"})
    assert r.headers["x-length-source"] == "hint" and r.headers["x-predicted-tokens"] == "50"
    done = client.completions.create(model=stack.model, prompt="Hello", max_tokens=60,
                                     extra_body={"metadata": {"expected_output_tokens": 7}})
    assert done.usage.completion_tokens >= 1


def test_unknown_model_is_404_for_the_openai_client(client, still_serving):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert "no-such-model" in str(exc.value)


def test_prompt_longer_than_context_is_rejected_by_the_engine(client, stack, still_serving):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=stack.model, prompt="hello " * 6000, max_tokens=4)
    assert "token" in str(exc.value).lower()


@pytest.mark.parametrize("prompt,fragment", [("", "empty"), ([[]], "empty"), ([10**9], "vocabulary"),
                                             (["a"] * 17, "at most 16")])
def test_bad_completion_prompts(stack, still_serving, prompt, fragment):
    r = _post(stack, "/v1/completions", json_body={"model": stack.model, "prompt": prompt, "max_tokens": 2})
    _assert_error(r, 400, fragment)
    assert r.json()["error"]["param"] == "prompt"


def test_models_retrieve(client, stack, still_serving):
    assert client.models.retrieve(stack.model).id == stack.model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_oversized_body_is_413(stack, still_serving):
    body = _chat(stack, messages=[{"role": "user", "content": "x" * 2_000_000}])
    _assert_error(_post(stack, "/v1/chat/completions", json_body=body), 413, "exceeds the limit")


def test_unknown_route_is_404_in_openai_format(stack, still_serving):
    r = httpx.get(f"{stack.base_url}/v1/nothing-here", timeout=30)
    _assert_error(r, 404, "not found")


def test_health_is_readiness_and_liveness_is_apart(stack):
    r = httpx.get(f"{stack.base_url}/health", timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    running = r.json()["running_replicas"]
    assert set(running) == {"pool-default", "length-predictor"} and all(n >= 1 for n in running.values())
    assert httpx.get(f"{stack.base_url}/health/live", timeout=30).json() == {"status": "alive"}
