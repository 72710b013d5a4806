"""Request parsing and limits, checked without a server (the e2e tests check them over HTTP)."""

import json

import pytest

from router.api.auth import Keys
from router.api.validation import check_request, parse_request
from router.serving.config import RequestLimits
from router.serving.errors import APIError

MODEL = "m"
LIMITS = RequestLimits(max_n=8, max_prompts=4, max_stop=4)
VOCAB = 1000


def _parse(payload, kind="chat", limits=LIMITS, seeded_sampling=True):
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    body = parse_request(raw, kind)
    check_request(body, kind, MODEL, 100, limits, VOCAB, seeded_sampling)
    return body


def _chat(**extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": "a"}], **extra}


def test_valid_chat_and_completion_parse():
    chat = _parse(_chat(max_tokens=5))
    assert chat.max_tokens == 5 and chat.messages[0]["content"] == "a"
    assert _parse({"model": MODEL, "prompt": "x"}, kind="completions").prompt == "x"
    assert _parse({"model": MODEL, "prompt": [[1, 2], [3]]}, kind="completions").prompt == [[1, 2], [3]]


@pytest.mark.parametrize(
    "payload,kind,status,param,fragment",
    [
        (b"\xff", "chat", 400, None, "JSON"),
        (b"{", "chat", 400, None, "JSON"),
        (b'["a"]', "chat", 400, None, "JSON object"),
        (b'{"messages": ' + b"[" * 20000 + b"]" * 20000 + b"}", "chat", 400, None, ""),  # nesting: no 500
        ({"messages": [{"role": "user", "content": "a"}]}, "chat", 400, "model", "model"),
        ({"model": "other", "messages": [{"role": "user", "content": "a"}]}, "chat", 404, "model", "does not exist"),
        (_chat(max_tokens=101), "chat", 400, "max_tokens", "context"),
        (_chat(max_completion_tokens=0), "chat", 400, "max_completion_tokens", "at least 1"),
        (_chat(n="two"), "chat", 400, "n", ""),
        (_chat(n=1000, max_tokens=2), "chat", 400, "n", "limit"),
        ({"model": MODEL, "prompt": "x", "best_of": 1000}, "completions", 400, "best_of", "not supported"),
        (_chat(stop=["a", "b", "c", "d", "e"]), "chat", 400, "stop", "stop"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "a"}]}, "chat", 400, "messages.0.role", "role"),
        ({"model": MODEL, "messages": []}, "chat", 400, "messages", "at least one"),
        (_chat(chat_template="{{ 'x' }}"), "chat", 400, "chat_template", "not accepted"),
        (_chat(chat_template_kwargs={"chat_template": "{{ 'x' }}"}), "chat", 400, "chat_template", "not accepted"),
        ({"model": MODEL, "prompt": ""}, "completions", 400, "prompt", "empty"),
        ({"model": MODEL, "prompt": [[]]}, "completions", 400, "prompt", "empty"),
        ({"model": MODEL, "prompt": [10**9]}, "completions", 400, "prompt", "vocabulary"),
        ({"model": MODEL, "prompt": ["a"] * 5}, "completions", 400, "prompt", "at most 4"),
        # vLLM's own validators raise TypeError on these (found by the fuzz run): 400, not 500.
        ({"model": MODEL, "messages": None, "max_tokens": 2}, "chat", 400, None, "malformed"),
        ({"model": MODEL, "messages": True}, "chat", 400, None, "malformed"),
        ({"model": MODEL, "messages": 6695608905}, "chat", 400, None, "malformed"),
    ],
)
def test_rejections_carry_status_and_param(payload, kind, status, param, fragment):
    with pytest.raises(APIError) as exc:
        _parse(payload, kind)
    assert exc.value.status == status
    assert exc.value.body()["error"]["param"] == param
    assert fragment.lower() in exc.value.message.lower()


def test_a_trusted_deployment_accepts_request_templates():
    assert _parse(_chat(chat_template="{{ 'x' }}"), limits=LIMITS.model_copy(update={"trust_request_chat_template": True}))


def test_api_keys_off_by_default_then_bearer_only(tmp_path):
    Keys.from_env({}).check({})  # no keys configured: open
    (tmp_path / "keys").write_text("from-file\n\n")
    keys = Keys.from_env({"LENGTHSERVE_API_KEYS": "a, b", "LENGTHSERVE_API_KEY_FILE": str(tmp_path / "keys")})
    assert keys.api == {"a", "b", "from-file"} and keys.benchmark == frozenset()
    keys.check({"authorization": "Bearer b"})
    keys.check({"authorization": "bearer from-file"})
    for headers in ({}, {"authorization": "Bearer c"}, {"authorization": "Basic a"}, {"authorization": "a"}):
        with pytest.raises(APIError) as err:
            keys.check(headers)
        assert err.value.status == 401 and err.value.body()["error"]["type"] == "authentication_error"


def test_a_seed_is_refused_where_the_engines_cannot_honour_it():
    """vLLM's CPU sampler kills the engine on a seeded request (every request it held failed with
    EngineDeadError in a seeded burst); a GPU engine takes it."""
    assert _parse(_chat(seed=7)).seed == 7
    for kind, payload in (("chat", _chat(seed=7)), ("completions", {"model": MODEL, "prompt": "x", "seed": 0})):
        with pytest.raises(APIError) as e:
            _parse(payload, kind, seeded_sampling=False)
        assert e.value.status == 400 and e.value.param == "seed"
    assert _parse(_chat(), seeded_sampling=False).seed is None
