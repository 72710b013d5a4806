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


_TEXT = [{"role": "user", "content": "a"}]


@pytest.mark.parametrize("payload,kind,param,fragment", [
    # A union of message types: the member whose `role` matches, not the first member tried.
    ({"model": MODEL, "messages": [{"role": "user", "content": None}]}, "chat", "messages.0.content", "valid string"),
    # A union of a string and a list (`str`, `list[str]` branches).
    (_chat(stop=[1]), "chat", "stop.0", "valid string"),
    # vLLM's own wrap validator on a union of formats (`function-wrap[...]`) and their literal tags.
    (_chat(response_format={"type": "nope"}), "chat", "response_format.type", "'text'"),
    # A list of tools, a required key left out.
    (_chat(tools=[{"type": "function"}]), "chat", "tools.0.function", "missing required"),
    (_chat(logit_bias={"a": "b"}), "chat", "logit_bias.a", "valid number"),
    # Prompt: a string, a list of ints or a list of lists (`list[constrained-int]`, ...).
    ({"model": MODEL, "prompt": [1.5]}, "completions", "prompt.0", "valid integer"),
    ({"model": MODEL, "prompt": {"a": 1}}, "completions", "prompt", "valid"),
    # The length hint (router.api.protocol).
    (_chat(metadata={"expected_output_tokens": "many"}), "chat", "metadata.expected_output_tokens", "whole number"),
    (_chat(metadata={"expected_output_tokens": True}), "chat", "metadata.expected_output_tokens", "whole number"),
    (_chat(metadata={"expected_output_tokens": 2.5}), "chat", "metadata.expected_output_tokens", "whole number"),
    (_chat(metadata={"expected_output_tokens": "-3"}), "chat", "metadata.expected_output_tokens", "whole number"),
    (_chat(metadata={"expected_output_tokens": 0}), "chat", "metadata.expected_output_tokens", "greater than or equal"),
    (_chat(metadata={"expected_output_tokens": 101}), "chat", "metadata.expected_output_tokens", "exceeds the model"),
    ({"model": MODEL, "prompt": "x", "metadata": {"expected_output_tokens": "101"}}, "completions",
     "metadata.expected_output_tokens", "context"),
    (_chat(metadata="fast"), "chat", "metadata", "object of string keys"),
    (_chat(metadata={"team": 7}), "chat", "metadata", "must be a string"),
    (_chat(metadata={f"k{i}": "v" for i in range(17)}), "chat", "metadata", "at most 16"),
    (_chat(metadata={"k" * 65: "v"}), "chat", "metadata", "at most 64"),
])
def test_errors_name_the_field_as_the_client_sent_it(payload, kind, param, fragment):
    with pytest.raises(APIError) as exc:
        _parse(payload, kind)
    assert exc.value.status == 400 and exc.value.param == param
    assert fragment.lower() in exc.value.message.lower()
    assert f"'{param}'" in exc.value.message
    for inner in ("Param", "function-", "list[", "str'", "generator", "constrained"):
        assert inner not in exc.value.message, exc.value.message


def test_fastapis_errors_are_told_in_the_body_it_parsed():
    """FastAPI validates the parsed body (python mode) and prefixes its locations with `body`."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    from router.api.protocol import ChatBody
    from router.api.validation import validation_error

    payload = {"model": MODEL, "messages": [{"role": "system", "content": "a"}, {"role": "user", "content": None}]}
    with pytest.raises(ValidationError) as exc:
        ChatBody.model_validate(payload)
    errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.value.errors()]
    err = validation_error(RequestValidationError(errors, body=payload), payload)
    assert err.param == "messages.1.content" and "Param" not in err.message


def test_a_valid_hint_reaches_the_body_and_other_metadata_passes():
    body = _parse(_chat(metadata={"expected_output_tokens": "30", "team": "search"}))
    assert body.metadata.expected_output_tokens == 30 and body.metadata.model_extra == {"team": "search"}
    assert _parse(_chat(metadata={"expected_output_tokens": 100})).metadata.expected_output_tokens == 100  # the context
    assert _parse({"model": MODEL, "prompt": "x", "metadata": {"expected_output_tokens": 7}},
                  kind="completions").metadata.expected_output_tokens == 7
    assert _parse(_chat()).metadata is None
