"""The OpenAI API end to end: official client -> HTTP -> router -> Ray Serve LLM -> vLLM."""

import asyncio

import pytest
from openai import AsyncOpenAI

pytestmark = pytest.mark.stack


def test_models_lists_the_served_model(client, stack):
    ids = [m.id for m in client.models.list().data]
    assert ids == [stack.model]


def test_chat_completion_with_usage(client, stack):
    r = client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=16
    )
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 20  # the chat template's default system prompt is included
    assert 1 <= u.completion_tokens <= 16
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_completion_with_usage(client, stack):
    r = client.completions.create(model=stack.model, prompt="The capital of France is", max_tokens=8)
    assert r.choices[0].text
    assert 1 <= r.usage.completion_tokens <= 8
    assert r.usage.prompt_tokens >= 5


def test_chat_streaming_reassembles_and_reports_usage(client, stack):
    stream = client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=12, stream=True, stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text
    assert finish in ("stop", "length")
    assert usage is not None and 1 <= usage.completion_tokens <= 12


def test_completion_streaming(client, stack):
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model=stack.model, prompt="One, two, three,", max_tokens=6, stream=True
        )
        if c.choices
    ]
    assert "".join(pieces)


def test_concurrent_requests_all_succeed(stack):
    async def run() -> list:
        aclient = AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0)
        calls = [
            aclient.chat.completions.create(
                model=stack.model,
                messages=[{"role": "user", "content": f"Say the number {i}."}],
                max_tokens=8,
            )
            for i in range(8)
        ]
        return await asyncio.gather(*calls)

    results = asyncio.run(run())
    assert len(results) == 8
    assert len({r.id for r in results}) == 8
    assert all(r.usage.completion_tokens >= 1 for r in results)
