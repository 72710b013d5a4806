"""Each prompt's own past lengths, kept across restarts: the best predictor of a prompt RL re-sends.

RL training sends the same prompts epoch after epoch, and a prompt's last lengths predict its next
ones better than any head reading the prompt (RhymeRL); any exact repeat of a chat prompt gets
the same. The router records the length of every request that ended by itself, at its cap or cut
(`Request.natural_length`: a censored length stays censored) under its prompt's key, and looks
each new request's prompt up after render (`Request.history`, router.scheduling.length_stats).

- Key: a hash of the model's name and the prompt's rendered token ids (router.serving.render),
  so no prompt text is stored and another model's lengths never match.
- Bounds: `max_prompts` prompts, the least recently finished forgotten first; each keeps its
  `lengths_per_prompt` most recent lengths.
- Persistence: one JSON file, rewritten every `flush_interval_s` while new lengths came in, off
  the event loop (a worker thread), through a temporary file and `os.replace`, so a reader (and
  a restart) sees the old file or the new one, never half of one.
- Several router replicas on one machine share the file: each writes under an exclusive `flock`
  of a lock file beside it, reading the file again, adding only its own new lengths and
  replacing it, so none overwrites another's; each reads the others' lengths back at its next
  write. Replicas on several machines need a local path each (a network file system's locks
  are not trusted): each then learns only from its own traffic.
- A file that is not valid (corrupt) is moved aside to `<name>.corrupt-<time>` and a new one is
  started; a file of another format, version or model (foreign) is left alone and the history
  stays in memory only. Either way one clear log line, and no request ever fails for it.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import time
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from router.scheduling.length_stats import censored_stats
from router.scheduling.request import HistoryStats

log = logging.getLogger("ray.serve")
FORMAT, VERSION = "lengthserve-length-history", 1
Lengths = list[tuple[int, bool]]  # (tokens, censored), oldest first
Prompts = OrderedDict  # key -> (last finished, wall clock; Lengths), least recently finished first


class Refused(Exception):
    """The file is not one this history may read: `foreign` (another model's, format's or
    version's: left alone) or corrupt (moved aside)."""

    def __init__(self, reason: str, foreign: bool):
        super().__init__(reason)
        self.foreign = foreign


def prompt_key(model: str, ids: Sequence[int]) -> str:
    """A prompt's key: the model's name and its token ids, hashed (128 bits)."""
    text = model + "\0" + ",".join(map(str, ids))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class LengthHistory:
    def __init__(self, path: str | os.PathLike, model: str, max_prompts: int, lengths_per_prompt: int,
                 flush_interval_s: float):
        self.path, self.model = Path(path), model
        self._max_prompts, self._per_prompt, self._interval_s = max_prompts, lengths_per_prompt, flush_interval_s
        self._new: list[tuple[str, int, bool, float]] = []  # recorded since the last write
        self._flusher: asyncio.Task | None = None
        self.persisting = True  # False once the file was refused as foreign
        self._prompts: Prompts = self._load()

    # -- reading and recording (on the event loop) ---------------------------------------------

    def key(self, ids: Sequence[int]) -> str:
        return prompt_key(self.model, ids)

    def lookup(self, key: str) -> HistoryStats | None:
        entry = self._prompts.get(key)
        return None if entry is None else censored_stats(entry[1])

    def record(self, key: str, tokens: int, censored: bool) -> None:
        """A finished sample's length; a length censored at 0 says nothing and is not kept."""
        if censored and tokens <= 0:
            return
        now = time.time()
        self._add(self._prompts, key, tokens, censored, now)
        if not self.persisting:
            return
        self._new.append((key, tokens, censored, now))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_later())

    def status(self) -> dict:
        return {"path": str(self.path), "prompts": len(self._prompts), "persisting": self.persisting,
                "unwritten": len(self._new)}

    # -- writing -------------------------------------------------------------------------------

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._interval_s)
        await self.flush()

    async def flush(self) -> None:
        """Write the new lengths in a worker thread; the event loop only swaps in the result."""
        if not self._new:
            return
        new, self._new = self._new, []
        merged = await asyncio.to_thread(self._write, new)
        if not self.persisting:  # the file turned out foreign: nothing more is written
            self._new = []
        if merged is not None:
            for key, tokens, censored, seen in self._new:  # recorded while the file was written
                self._add(merged, key, tokens, censored, seen)
            self._prompts = merged

    def close(self) -> None:
        """The last new lengths, written at once (the replica is shutting down)."""
        if self._new:
            new, self._new = self._new, []
            self._write(new)

    def _write(self, new: list[tuple[str, int, bool, float]]) -> Prompts | None:
        """Merge `new` into the file under its lock and replace it; the merged prompts, or None
        when nothing could be written (the memory then keeps what it has)."""
        try:
            with self._locked():
                try:
                    prompts = self._read()
                except Refused as e:
                    if not self._refuse(e):
                        return None
                    prompts = Prompts()
                for key, tokens, censored, seen in new:
                    self._add(prompts, key, tokens, censored, seen)
                body = {"format": FORMAT, "version": VERSION, "model": self.model,
                        "prompts": {key: [seen, lengths] for key, (seen, lengths) in prompts.items()}}
                with tempfile.NamedTemporaryFile("w", dir=self.path.parent, prefix=f".{self.path.name}.",
                                                 delete=False) as tmp:
                    json.dump(body, tmp, separators=(",", ":"))
                    tmp.flush()
                    os.fsync(tmp.fileno())
                os.replace(tmp.name, self.path)
                return prompts
        except OSError as e:
            log.error("length history: could not write %s (%s); %d new lengths stay in memory only",
                      self.path, e, len(new))
            return None

    @contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- the file ------------------------------------------------------------------------------

    def _load(self) -> Prompts:
        try:
            with self._locked():
                try:
                    prompts = self._read()
                except Refused as e:
                    self._refuse(e)
                    return Prompts()
        except OSError as e:
            log.error("length history: cannot use %s (%s); the history stays in memory only", self.path, e)
            self.persisting = False
            return Prompts()
        log.info("length history: %d prompts from %s", len(prompts), self.path)
        return prompts

    def _read(self) -> Prompts:
        """The file's prompts (none when there is no file yet); Refused when it is not ours."""
        try:
            body = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return Prompts()
        except (OSError, ValueError) as e:
            raise Refused(f"not readable JSON ({type(e).__name__}: {e})", foreign=False) from None
        if not isinstance(body, dict) or not isinstance(body.get("prompts"), dict):
            raise Refused("not a length history", foreign=False)
        header = (body.get("format"), body.get("version"), body.get("model"))
        if header != (FORMAT, VERSION, self.model):
            raise Refused(f"format {header[0]!r} version {header[1]!r} of model {header[2]!r}, this router's is "
                          f"{FORMAT!r} version {VERSION} of {self.model!r}", foreign=True)
        try:
            entries = sorted((float(seen), key, [(int(t), bool(c)) for t, c in lengths])
                             for key, (seen, lengths) in body["prompts"].items())
        except (TypeError, ValueError) as e:
            raise Refused(f"a malformed entry ({type(e).__name__}: {e})", foreign=False) from None
        return Prompts((key, (seen, lengths)) for seen, key, lengths in entries)

    def _refuse(self, e: Refused) -> bool:
        """Say why the file is refused; True when a new one may replace it."""
        if e.foreign:
            log.error("length history: %s is refused, %s; the history stays in memory only (point "
                      "router.history.path elsewhere to keep it)", self.path, e)
            self.persisting = False
            return False
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        log.error("length history: %s is refused, %s; moved aside to %s, a new history starts", self.path, e, aside)
        try:
            os.replace(self.path, aside)
        except OSError:
            pass
        return True

    def _add(self, prompts: Prompts, key: str, tokens: int, censored: bool, seen: float) -> None:
        last, lengths = prompts.pop(key, (0.0, []))
        prompts[key] = (max(last, seen), [*lengths, (tokens, censored)][-self._per_prompt:])
        while len(prompts) > self._max_prompts:
            prompts.popitem(last=False)
