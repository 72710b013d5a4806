"""Every finished request's record as one JSON line: what benchmarks replay and join on.

A benchmark's client sees its requests from outside (sent, first chunk, last chunk); only the
router knows when each was decided, waited, dispatched, where it ran and when its prediction
landed (before or after dispatch). With `router.request_log` set, the pipeline appends each
request's record (router.scheduling.request.Request) here as it completes, so a real run leaves the
per-request records the simulator replays. Times are Unix
seconds, the clock the benchmark's clients use too.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from router.scheduling.request import Request


class RequestLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8", buffering=1)  # a line at a time: a killed run keeps its records

    def write(self, request: Request) -> None:
        self._file.write(json.dumps(asdict(request)) + "\n")
