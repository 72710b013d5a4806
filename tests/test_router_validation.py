"""Request parsing rules, checked without a server (the e2e tests check them over HTTP)."""

import json

import pytest

from router.errors import APIError
from router.validation import parse_request

MODEL = "m"


def _parse(payload, kind="chat"):
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return parse_request(raw, kind, MODEL, max_model_len=100)


def test_valid_chat_and_completion_parse():
    chat = _parse({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
    assert chat.max_tokens == 5 and chat.messages[0]["content"] == "hi"
    comp = _parse({"model": MODEL, "prompt": "x"}, kind="completions")
    assert comp.prompt == "x"


@pytest.mark.parametrize(
    "payload,status,param",
    [
        (b"\xff", 400, None),
        (b"{", 400, None),
        ({"messages": []}, 400, "model"),
        ({"model": "other", "messages": [{"role": "user", "content": "a"}]}, 404, "model"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "a"}], "max_tokens": 101}, 400, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 0}, 400, "max_completion_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "a"}], "n": "two"}, 400, "n"),
        ({"model": MODEL, "prompt": ""}, 400, "prompt"),
    ],
)
def test_rejections_carry_status_and_param(payload, status, param):
    kind = "completions" if isinstance(payload, dict) and "prompt" in payload else "chat"
    with pytest.raises(APIError) as exc:
        _parse(payload, kind)
    assert exc.value.status == status
    assert exc.value.body()["error"]["param"] == param
