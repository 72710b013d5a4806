"""The prompt the predictor reads is the one the engine sees (no server)."""

import json

import pytest

from router.api.validation import parse_request, request_kind
from router.serving.render import UnsupportedPrompt, prompt_ids
from tests import MODEL_DIR


def _parse(payload: dict, kind: str = "chat"):
    return parse_request(json.dumps(payload).encode(), kind)


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
