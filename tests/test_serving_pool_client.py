"""The one pool client: ids, retries, the first-chunk check, the relay and its usage, cleanup (no server)."""

import asyncio
import json

import pytest
from ray.serve import context as serve_context

from router.api.validation import parse_request
from router.scheduling.request import CUT, Request
from router.serving.errors import APIError
from router.serving.pool_client import Output, PoolClient, ReplicaFailed
from router.serving.replica_ledger import ReplicaLedger
from tests.fakes import FakePool, chunks


def _body(stream: bool):
    return parse_request(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                     "stream": stream}).encode(), "chat")


def _client(**pool) -> tuple[PoolClient, FakePool]:
    ledger = ReplicaLedger()
    fake = FakePool(ledger, **pool)
    return PoolClient("p", fake, ledger, backoff_s=0.001), fake


async def _drain(answer, keep_usage=False) -> str:
    return "".join([chunk async for chunk in answer.sse(keep_usage)])


@pytest.mark.parametrize("keep", [True, False])
def test_a_stream_is_relayed_with_its_usage_read_and_hidden_unless_asked(keep):
    client, fake = _client(tokens=4, finish="length")
    done = []

    async def run():
        request = Request("req-1", "x")
        answer = await client.open(request, "chat", _body(True), done.append)
        return request, await _drain(answer, keep)

    request, text = asyncio.run(run())
    assert ('"usage"' in text) is keep and text.endswith("data: [DONE]\n\n")
    assert (request.completion_tokens, request.finish_reason, request.streamed) == (4, "length", 4)
    assert request.first_token_at is not None and request.error is None
    assert done == [request] and client.ledger.get("req-1") is None  # done once, and off the ledger


def test_a_json_answer_completes_the_request_at_once():
    client, _ = _client(tokens=7)
    done = []

    async def run():
        request = Request("req-1", "x")
        answer = await client.open(request, "chat", _body(False), done.append)
        return request, answer.json()

    request, payload = asyncio.run(run())
    assert payload["usage"]["completion_tokens"] == 7
    assert (request.completion_tokens, request.finish_reason) == (7, "stop") and done == [request]


def test_every_call_runs_under_an_internal_request_id_of_its_own():
    """Ray gives every handle call made inside one HTTP request that request's internal id; the
    pool client must not let a rollout's samples share it (the ledger and Ray key by it)."""
    client, fake = _client(tokens=2)

    async def run():
        serve_context._set_request_context(_internal_request_id="the-http-request")
        requests = [Request(f"sample-{i}", "x") for i in range(4)]
        answers = await asyncio.gather(*(client.open(r, "chat", _body(True), lambda r: None) for r in requests))
        await asyncio.gather(*(_drain(a) for a in answers))
        return serve_context._get_serve_request_context()._internal_request_id

    parent = asyncio.run(run())
    assert parent == "the-http-request"  # the request's own context is untouched
    assert [c.internal_id for c in fake.calls] == [c.request_id for c in fake.calls]
    assert len({c.internal_id for c in fake.calls}) == 4


def test_a_replica_that_fails_before_answering_is_retried_then_reported():
    client, fake = _client(failures=2)

    async def run(request):
        answer = await client.open(request, "chat", _body(True), lambda r: None)
        return await _drain(answer)

    assert "[DONE]" in asyncio.run(run(Request("ok-after-retries", "x")))
    assert len(fake.calls) == 3
    client, fake = _client(failures=3)
    with pytest.raises(ReplicaFailed) as err:
        asyncio.run(run(Request("never", "x")))
    assert err.value.status == 503 and err.value.headers["Retry-After"]
    assert client.ledger.get("never") is None  # a request that never reached a replica is not left behind


def test_an_engine_rejection_is_a_client_error_not_a_stream():
    from vllm.entrypoints.serve.engine.protocol import ErrorInfo, ErrorResponse

    rejection = ErrorResponse(error=ErrorInfo(message="prompt too long", type="BadRequestError", code=400))
    client, fake = _client(rejection=rejection)
    with pytest.raises(APIError) as err:
        asyncio.run(client.open(Request("bad", "x"), "chat", _body(True), lambda r: None))
    assert err.value.status == 400 and "too long" in err.value.message and fake.streams[0].cancelled


def test_a_timed_out_call_cancels_the_engine_call_instead_of_abandoning_it():
    client, fake = _client(delay_s=3600)

    async def run():
        async with asyncio.timeout(0.05):
            await client.open(Request("slow", "x"), "chat", _body(False), lambda r: None)

    with pytest.raises(TimeoutError):
        asyncio.run(run())
    assert fake.streams[0].cancelled  # vLLM stops decoding for nobody


def test_an_abandoned_answer_still_completes_and_stops_the_engine():
    client, fake = _client(tokens=3)
    done = []

    async def run():
        answer = await client.open(Request("gone", "x"), "chat", _body(True), done.append)
        answer.abandon()  # the response was dropped before its body started

    asyncio.run(run())
    assert [r.id for r in done] == ["gone"] and done[0].error == "abandoned" and fake.streams[0].cancelled


def test_a_client_that_leaves_mid_stream_frees_its_request():
    client, fake = _client(tokens=50, delay_s=0.001)
    done = []

    async def run():
        answer = await client.open(Request("left", "x"), "chat", _body(True), done.append)
        relay = answer.sse(False)
        await relay.__anext__()
        await relay.aclose()  # Starlette closes the body iterator when the client disconnects

    asyncio.run(run())
    assert done and done[0].error is not None and fake.streams[0].cancelled


def test_the_stream_shape_the_fakes_give_is_vllms():
    items = chunks(2)
    assert items[-1][0].startswith('data: {"id":"x","choices":[],"usage"') and items[-1][0].endswith("[DONE]\n\n")


def test_a_sample_cut_mid_stream_keeps_what_it_generated_and_leaves_nothing_in_the_engine():
    client, fake = _client(replicas=["r1", "r2"], tokens=500, delay_s=0.001)
    output, done = Output(), []

    async def run():
        request = Request("cut-1", "x", pinned="r2")
        body = _body(True)
        body.return_token_ids = True
        answer = await client.open(request, "chat", body, done.append)
        task = asyncio.create_task(answer.collect(output))
        while len(output.token_ids) < 3:
            await asyncio.sleep(0.001)
        during = await client.engine_requests()
        request.finish_reason = CUT  # what a first-k rollout marks before it cancels
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return request, during, await client.engine_requests()

    request, during, after = asyncio.run(run())
    assert during == {"r1": 0, "r2": 1} and after == {"r1": 0, "r2": 0} and fake.streams[0].cancelled
    assert request.error is None and request.completion_tokens == len(output.token_ids) >= 3
    assert output.prompt_ids == [1, 2, 3] and output.text == "t" * len(output.token_ids) and done == [request]
    assert all(load.requests == 0 for load in client.ledger.loads())


def test_a_replica_that_does_not_answer_its_engine_count_is_unknown_not_zero():
    client, fake = _client(replicas=["r1"])
    fake.engine_requests.silent = True
    assert asyncio.run(client.engine_requests(timeout_s=0.01)) == {"r1": None}
    assert fake.engine_requests.responses[0].cancelled and all(load.requests == 0 for load in client.ledger.loads())
