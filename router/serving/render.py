"""The token ids the engine will see for a request, so the predictor reads the same prompt.

A prediction on other tokens than the engine's (no chat template, no default system prompt) is
a prediction for another request. This mirrors vLLM's rendering for text requests: content
parts joined by newlines, the request's own template options, `add_special_tokens` as vLLM reads
it. Anything else (images, audio) raises UnsupportedPrompt and the router routes without a
prediction; the engine stays the judge of whether the request is valid.
"""

from __future__ import annotations


class UnsupportedPrompt(ValueError):
    pass


def _text(content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("text", None) or "text" not in part:
            raise UnsupportedPrompt(f"content part of type {kind!r} has no text the predictor can read")
        texts.append(part["text"])
    return "\n".join(texts)


def chat_ids(tokenizer, body) -> list[int]:
    messages = [{**m, "content": _text(m.get("content"))} for m in body.messages]
    kwargs = {
        **(body.chat_template_kwargs or {}),
        "add_generation_prompt": body.add_generation_prompt,
        "continue_final_message": body.continue_final_message,
    }
    if body.tools:
        kwargs["tools"] = [t.model_dump(exclude_none=True) for t in body.tools]
    if body.documents:
        kwargs["documents"] = body.documents
    if body.chat_template:
        kwargs["chat_template"] = body.chat_template
    return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs))


def completion_ids(tokenizer, body) -> list[list[int]]:
    """One id list per prompt of a (possibly batched) completion request."""
    prompt = body.prompt
    if isinstance(prompt, str):
        prompt = [prompt]
    elif prompt and isinstance(prompt[0], int):
        return [list(prompt)]
    return [
        list(p) if not isinstance(p, str) else tokenizer(p, add_special_tokens=body.add_special_tokens)["input_ids"]
        for p in prompt
    ]


def prompt_ids(tokenizer, body, kind: str) -> list[list[int]]:
    try:
        return [chat_ids(tokenizer, body)] if kind == "chat" else completion_ids(tokenizer, body)
    except UnsupportedPrompt:
        raise
    except Exception as e:  # a template that rejects the conversation: let the engine say why
        raise UnsupportedPrompt(f"cannot render the prompt: {type(e).__name__}: {e}") from None
