"""Continuing a partial rollout sample: a signed token that carries all the continuation needs.

A partial sample (stopped at a rollout's token budget) comes back with a `continuation_id`; a
later rollout passes it to continue the sample where it stopped. The id is the sample itself, not
a reference into the router: the prompt's token ids as the engine rendered them, the output's
token ids so far, what remains of its `max_tokens`, its prompt's history key and the replica
whose prefix cache holds it. So the router keeps nothing (no store to bound, to lose in a restart
or to miss on another router replica), and the continuation sends exactly the tokens the engine
saw, which its prefix cache recognises, with nothing re-tokenized. The cost is size: about 3
characters per token, so continuing many long partials at once over HTTP may need a larger
`router.max_body_bytes` (the Python API has no limit).

The token is compressed JSON with an HMAC-SHA256 tag. The key comes from the environment
(`LENGTHSERVE_CONTINUATION_KEY`), so every router replica, and a restarted one, accepts the others'
tokens; without it each router replica draws its own at start, and its tokens are good only there
until it restarts. A token that does not verify (altered, or signed with another key) is unknown;
one of another model is foreign: both are a 400, never a continuation of something else.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import secrets
import zlib
from dataclasses import asdict, dataclass

from router.serving.errors import APIError

log = logging.getLogger("ray.serve")
KEY_ENV = "LENGTHSERVE_CONTINUATION_KEY"
VERSION = 1


@dataclass(frozen=True)
class Partial:
    """A sample stopped at its budget, as a later rollout continues it."""

    model: str
    prompt_ids: list[int]  # as the engine rendered the prompt
    output_ids: list[int]  # what it generated so far
    remaining_tokens: int  # what is left of its max_tokens
    prompt_key: str | None  # its prompt's history key (router.serving.history)
    replica: str | None  # the replica whose prefix cache holds its tokens


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Continuations:
    def __init__(self, key: bytes):
        self._key = key

    @classmethod
    def from_env(cls) -> "Continuations":
        key = os.environ.get(KEY_ENV)
        if not key:
            log.info("%s is not set: partial samples can be continued on this router replica only, until it "
                     "restarts", KEY_ENV)
        return cls(key.encode() if key else secrets.token_bytes(32))

    def _tag(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()[:16]

    def issue(self, partial: Partial) -> str:
        body = zlib.compress(json.dumps({"v": VERSION, **asdict(partial)}, separators=(",", ":")).encode())
        return f"{_b64(body)}.{_b64(self._tag(body))}"

    def open(self, token: str, index: int, model: str) -> Partial:
        """The partial sample `token` (the `index`th continuation asked for) stands for; 400 when it
        is unknown, or foreign to `model`."""
        param = f"continuations[{index}]"
        try:
            body, tag = (_unb64(part) for part in token.split("."))
            verified = hmac.compare_digest(tag, self._tag(body))
        except ValueError:
            verified = False
        if not verified:
            raise APIError(400, f"Unknown continuation: {param} was not issued by this router (altered, another "
                           f"router's, or issued before a restart without {KEY_ENV}).", param=param)
        fields = json.loads(zlib.decompress(body))
        version = fields.pop("v")
        if (fields["model"], version) != (model, VERSION):
            raise APIError(400, f"Foreign continuation: {param} is a partial sample of model {fields['model']!r} "
                           f"(token version {version}); this rollout is of {model!r} (version {VERSION}).",
                           param=param)
        return Partial(**fields)
