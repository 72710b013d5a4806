"""Generated request bodies against both endpoints: whatever a client sends, never a 5xx.

Bodies come from hypothesis strategies (seeded, derandomized: the same run every time): a valid
chat or completions body with some fields replaced by hostile values (wrong types, huge numbers,
deep nesting, control characters, unknown roles, templates), plus raw byte strings that are no
JSON at all. Every generated body keeps a small `max_tokens` unless that field is the one made
hostile, so the run stays bounded in time: each body is one short request.
"""

from __future__ import annotations

import json

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e308, -1e308, 2**31, -1, 0]),
    st.text(max_size=64), st.sampled_from(["", "\x00", "\ud7ff" * 3, "💥" * 100, "x" * 20000]),
    st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=8),
    st.lists(st.lists(st.integers(min_value=-5, max_value=10**9), max_size=4), max_size=4),
    st.dictionaries(st.text(max_size=8), st.integers(), max_size=4),
    st.recursive(st.integers(), lambda inner: st.lists(inner, max_size=3), max_leaves=40),
)
ROLES = st.sampled_from(["user", "system", "assistant", "tool", "developer", "wizard", "", None, 7])
CONTENT = st.one_of(st.text(max_size=200), HOSTILE,
                    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "audio", "x"]),
                                                    "text": st.text(max_size=40)}), max_size=3))
MESSAGE = st.fixed_dictionaries({"role": ROLES, "content": CONTENT})
CHAT_FIELDS = ("model", "messages", "max_tokens", "n", "temperature", "top_p", "stop", "stream", "stream_options",
               "logprobs", "top_logprobs", "ignore_eos", "min_tokens", "chat_template", "chat_template_kwargs",
               "tools", "response_format", "seed", "priority", "request_id", "logit_bias", "max_completion_tokens")
COMPLETION_FIELDS = ("model", "prompt", "max_tokens", "n", "temperature", "stop", "stream", "echo", "logprobs",
                     "ignore_eos", "min_tokens", "suffix", "seed", "priority", "prompt_embeds")
RAW = st.one_of(st.binary(max_size=200), st.sampled_from([
    b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"model": ' + b'"' + b"a" * 100000 + b'"}', b'{"a": 1, "a": 2}',
]))


def _valid(kind: str, model: str) -> dict:
    if kind == "chat":
        return {"model": model, "messages": [{"role": "user", "content": "Say one word."}], "max_tokens": 2}
    return {"model": model, "prompt": "One, two,", "max_tokens": 2}


@st.composite
def bodies(draw, model: str):
    """(path, raw body bytes)."""
    kind = draw(st.sampled_from(["chat", "completions"]))
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    if draw(st.integers(0, 9)) == 0:
        return path, draw(RAW)
    body = _valid(kind, model)
    fields = CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS
    for name in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True)):
        if name == "messages" and draw(st.booleans()):
            body[name] = draw(st.lists(MESSAGE, max_size=4))
        elif name == "model" and draw(st.booleans()):
            body.pop("model")
        else:
            body[name] = draw(HOSTILE)
    if body.get("n") not in (None, 1) and isinstance(body.get("n"), int) and 0 < body["n"] <= 1000:
        body["max_tokens"] = 1  # a hostile n that passes must still be quick to answer
    return path, json.dumps(body, allow_nan=False).encode()


def run(base_url: str, model: str, examples: int, headers: dict | None = None, timeout_s: float = 120) -> dict:
    """Send `examples` generated bodies; counts by status class, and the 5xx ones for the report."""
    seen: dict[str, int] = {}
    server_errors: list[dict] = []
    client = httpx.Client(base_url=base_url, timeout=timeout_s, headers={"content-type": "application/json",
                                                                          **(headers or {})})

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(bodies(model))
    def send(case):
        path, raw = case
        try:
            r = client.post(path, content=raw)
            status = r.status_code
            body = r.text[:300]
        except httpx.HTTPError as e:
            status, body = 0, repr(e)
        seen[f"{status // 100}xx" if status else "no_answer"] = seen.get(f"{status // 100}xx" if status else
                                                                         "no_answer", 0) + 1
        if status >= 500 or status == 0:
            server_errors.append({"path": path, "body": raw[:300].decode("utf-8", "replace"), "status": status,
                                  "answer": body})

    send()
    client.close()
    return {"bodies": sum(seen.values()), "by_status": seen, "status_5xx": sum(1 for e in server_errors if e["status"]),
            "no_answer": seen.get("no_answer", 0), "examples_5xx": server_errors[:10]}
