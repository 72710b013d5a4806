"""What the router adds to responses and takes out of streams, and the prompt it predicts on."""

import asyncio
import gc
import json

import pytest

from router.forwarding import _UsageTap
from router.prompt_ids import UnsupportedPrompt, prompt_ids
from router.routing import Route
from tests import MODEL_DIR
from router.validation import parse_request, request_kind

USAGE = 'data: {"id":"x","choices":[],"usage":{"prompt_tokens":30,"completion_tokens":7,"total_tokens":37}}'
DELTA = 'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}]}'


def _parse(payload: dict, kind: str = "chat"):
    return parse_request(json.dumps(payload).encode(), kind)


@pytest.mark.parametrize("keep", [True, False])
def test_usage_tap_reads_the_usage_chunk_and_hides_it_unless_asked(keep):
    tap = _UsageTap(keep=keep)
    assert tap(f"{DELTA}\n\n") == f"{DELTA}\n\n"
    out = tap(f"{DELTA}\n\n{USAGE}\n\ndata: [DONE]\n\n")
    assert tap.completion_tokens == 7
    assert ('"usage"' in out) is keep
    assert out.startswith(DELTA) and out.endswith("data: [DONE]\n\n")


def test_route_headers_and_extension():
    prediction = {"expected_tokens": 123.4, "quantiles": {"p50": 100.0}, "bin": "medium",
                  "pool_probabilities": {"short": 0.2, "medium": 0.5, "long": 0.3}}
    route = Route(pool="long", policy="estp", prompt_tokens=40, prediction=prediction, priority=123,
                  spilled_from="medium", routing_ms=12.34, queued_ms=2500.0)
    assert route.headers() == {"X-Pool": "long", "X-Routing-Policy": "estp", "X-Routing-Ms": "12.3",
                               "X-Queue-Ms": "2500.0", "X-Predicted-Tokens": "123", "X-Length-Bin": "medium",
                               "X-Spilled-From": "medium"}
    ext = route.extension()
    assert ext["length_prediction"]["prompt_tokens"] == 40 and ext["length_prediction"]["bin"] == "medium"
    assert ext["routing"] == {"pool": "long", "policy": "estp", "spilled_from": "medium", "fallback": None,
                              "priority": 123, "routing_ms": 12.3, "queued_ms": 2500.0}
    fallback = Route(pool="short", policy="input_length", prompt_tokens=40, prediction=None, priority=100,
                     fallback="timeout")
    assert fallback.headers() == {"X-Pool": "short", "X-Routing-Policy": "input_length", "X-Routing-Ms": "0.0",
                                  "X-Queue-Ms": "0.0", "X-Routing-Fallback": "timeout"}
    assert fallback.extension()["length_prediction"] is None


def test_request_kind_by_body_shape():
    assert request_kind(b'{"prompt": "x"}') == "completions"
    assert request_kind(b'{"messages": []}') == "chat"
    assert request_kind(b"{") == "chat"


def test_prompt_ids_match_the_dataset_encoding_and_engine_rules():
    from transformers import AutoTokenizer

    from predictor.estimator import encode_prompt

    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    chat = _parse({"model": "m", "messages": [{"role": "user", "content": "Name a colour."}]})
    assert prompt_ids(tok, chat, "chat") == [encode_prompt(tok, "Name a colour.")]
    parts = _parse({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Name a"}, {"type": "text", "text": "colour."}]}]})
    assert "Name a\ncolour." in tok.decode(prompt_ids(tok, parts, "chat")[0])  # vLLM joins text parts
    batch = _parse({"model": "m", "prompt": ["The capital of France is", "Hi"]}, "completions")
    assert prompt_ids(tok, batch, "completions") == [tok("The capital of France is")["input_ids"], tok("Hi")["input_ids"]]
    ids = _parse({"model": "m", "prompt": [1, 2, 3]}, "completions")
    assert prompt_ids(tok, ids, "completions") == [[1, 2, 3]]
    image = _parse({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})
    with pytest.raises(UnsupportedPrompt):
        prompt_ids(tok, image, "chat")


class _FakeStream:
    """A pool's response generator: yields `items`, or hangs forever before the first one."""

    def __init__(self, items: list | None):
        self.items, self.cancelled = items, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.items is None:
            await asyncio.sleep(3600)
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    def cancel(self):
        self.cancelled = True


class _FakeHandle:
    def __init__(self, stream):
        self.stream = stream
        self.chat = self  # handle.chat.remote(body, None)

    def remote(self, body, _):
        return self.stream


def _body(stream: bool):
    return _parse({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream})


def test_a_timed_out_request_cancels_the_engine_call_instead_of_abandoning_it():
    from router.forwarding import forward

    stream = _FakeStream(items=None)
    calls = []

    async def run():
        async with asyncio.timeout(0.05):
            await forward(_FakeHandle(stream), "chat", _body(False), {}, {}, False, calls.append, lambda: None)

    with pytest.raises(TimeoutError):
        asyncio.run(run())
    assert stream.cancelled  # vLLM stops decoding for nobody


def test_a_stream_whose_task_dies_before_its_body_starts_still_releases_its_slot():
    from router.forwarding import forward

    stream = _FakeStream(items=[[DELTA + "\n\n"], [DELTA + "\n\n"]])
    done = []

    async def run():
        # The handler returns the response; the ASGI task is cancelled before the body starts.
        await forward(_FakeHandle(stream), "chat", _body(True), {}, {}, False, done.append, lambda: None)

    asyncio.run(run())
    gc.collect()
    assert done == [None] and stream.cancelled


def test_a_finished_stream_releases_its_slot_with_its_usage():
    from router.forwarding import forward

    stream = _FakeStream(items=[[DELTA + "\n\n"], [USAGE + "\n\ndata: [DONE]\n\n"]])
    done, sent = [], []

    async def run():
        response = await forward(_FakeHandle(stream), "chat", _body(True), {}, {}, False, done.append, lambda: None)

        async def receive():
            await asyncio.sleep(3600)

        async def send(message):
            sent.append(message)

        await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)

    asyncio.run(run())
    gc.collect()
    assert done[0] == 7 and not stream.cancelled  # ran to the end: nothing to cancel
    assert b"[DONE]" in b"".join(m.get("body", b"") for m in sent)
