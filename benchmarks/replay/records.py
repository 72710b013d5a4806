"""One record per replayed request: what the serving metrics and the simulator's validation read.

Times are seconds after the replay's start (one wall-clock origin shared by every actor), so
records from actors on different nodes line up. A request is either `ok` (its stream ended with
usage) or `failed` (with the error); there is no third state, which is what makes `lost = 0` a
real check: every request of the trace has exactly one record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel


class RequestRecord(BaseModel):
    policy: str  # the policy asked for (X-Routing-Policy), or the router's own when none was
    mode: Literal["open", "batch"]
    load_rps: float | None = None  # offered load of an open-loop run; None in batch mode
    request_id: str
    scenario: str
    arrival_s: float  # when the trace says it arrives (open loop) or its group was released (batch)
    sent_s: float | None = None  # when the client actually sent it (late under a backed-up client)
    first_token_s: float | None = None
    finish_s: float | None = None
    prompt_tokens: int
    completion_tokens: int | None = None
    true_output_tokens: int  # the dataset's length for this prompt (another sample of the same answer)
    predicted_tokens: int | None = None  # X-Predicted-Tokens: the length it was ranked by
    length_source: str | None = None  # X-Length-Source: where that length came from (router.scheduling.signals)
    pool: str | None = None  # X-Pool: where it was served (after spillover)
    routed_policy: str | None = None  # X-Routing-Policy: the policy that decided (the fallback's if it did)
    group: int | None = None  # batch mode: the group it was decoded with
    queued_s: float | None = None  # X-Queue-Ms: how long it waited for a slot in the router's queue
    fallback: str | None = None  # X-Routing-Fallback: why the policy asked for could not decide
    status: Literal["ok", "failed"]
    error: str | None = None

    @property
    def jct_s(self) -> float | None:
        """Job completion time: arrival to last token."""
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: the decode speed, whatever the length."""
        if self.first_token_s is None or self.finish_s is None or (self.completion_tokens or 0) < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.completion_tokens - 1)


def write_records(path: Path, records: list[RequestRecord], append: bool = False) -> None:
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        fh.writelines(r.model_dump_json() + "\n" for r in records)


def read_records(path: Path) -> list[RequestRecord]:
    with open(path, encoding="utf-8") as fh:
        return [RequestRecord.model_validate(json.loads(line)) for line in fh if line.strip()]
