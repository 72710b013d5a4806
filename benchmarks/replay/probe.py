"""The machine's decode speed at a run's start, kept beside the run for the simulator.

Sessions get machines whose speed differs by up to 2-3x (docs/benchmarks.md, the simulator), so
step-time factors fitted on one session's runs mistime another's runs by more than any policy
moves them. Before each run a fixed probe goes through the serving path as deployed (HTTP, the
router, both engines): PROBE_REQUESTS requests at once, each made to answer exactly PROBE_TOKENS
tokens, and the median time between a request's tokens is the run's step time. The same probe
runs again after the run: the machine drifts within a 30-minute run (a 105% load run probed 59%
slower than its pair before it started, then delivered more tokens a second), and the mean of the
two readings times the run. The simulator's validation times the same probe with its fitted model
(the fit runs' machines) and scales a probed run's steps by its probe against that.

A second, small probe (SMALL_PROBE_REQUESTS at once) follows the full one, to separate a machine's
slowdown of a step's fixed cost from that of its per-sequence work (load runs decoding 6-9
requests an engine were timed 38% slow by one full-batch reading). On the first six runs with both,
that split timed them worse than the full probe alone (the probe's contexts are short; the
traffic's attention is over long ones): the validation reports it and times runs at the full probe.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.replay.actors import replay
from benchmarks.replay.records import RequestRecord
from benchmarks.replay.trace import TraceRequest

# The default stack's 32 slots (two engines of 16): the batch a burst runs at, and nothing waits or is
# predicted. The first probes sent 16 (8 per engine); a machine's slowdown at 8 did not carry to 16
# (docs/benchmarks.md), so a probe file says how many it sent.
PROBE_REQUESTS = 32
SMALL_PROBE_REQUESTS = 8  # 4 an engine: below the 6-9 that load runs decode at, for a well-spread pair
PROBE_TOKENS = 64
PROBE_MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the ships she watches."}]


@dataclass(frozen=True)
class Probe:
    """What a run's probe measured: `requests` at once, `step_s` between a request's tokens before
    the run, `after_step_s` after it (None: a run probed only before); the same at `small_requests`
    (None: runs probed at one size)."""

    requests: int
    step_s: float
    after_step_s: float | None = None
    small_requests: int | None = None
    small_step_s: float | None = None
    after_small_step_s: float | None = None

    @property
    def run_step_s(self) -> float:
        """The machine's step over the run: the mean of the readings it has."""
        return _mean(self.step_s, self.after_step_s)

    @property
    def run_small_step_s(self) -> float | None:
        return None if self.small_step_s is None else _mean(self.small_step_s, self.after_small_step_s)


def _mean(before: float, after: float | None) -> float:
    return before if after is None else (before + after) / 2


def probe_trace(run: str, requests: int = PROBE_REQUESTS) -> list[TraceRequest]:
    return [TraceRequest(request_id=f"{run}:probe{i:02d}", arrival_s=0.0, prompt_id="probe", scenario="probe",
                         messages=PROBE_MESSAGES, max_tokens=PROBE_TOKENS,
                         min_tokens=PROBE_TOKENS, true_output_tokens=PROBE_TOKENS, prompt_tokens=0)
            for i in range(requests)]


def probe_prompt_tokens(model_source: str) -> int:
    """The probe's prompt as the engines see it (the model's chat template): the simulator times the probe too."""
    from transformers import AutoTokenizer

    from predictor.estimator import encode_prompt
    from predictor.model_files import resolve_model_source

    return len(encode_prompt(AutoTokenizer.from_pretrained(resolve_model_source(model_source)), PROBE_MESSAGES))


def step_seconds(records: list[RequestRecord]) -> float:
    """The median time between two tokens of one request."""
    gaps = [(r.finish_s - r.first_token_s) / (r.completion_tokens - 1) for r in records
            if r.status == "ok" and r.completion_tokens and r.completion_tokens > 1]
    if not gaps:
        raise RuntimeError(f"the speed probe got no answer: {[r.error for r in records][:3]}")
    return float(np.median(gaps))


def measure(base_url: str, actors: list, run: str, start_lead_s: float) -> dict:
    """Both probes against a running stack, one after the other (the router's own policy: nothing waits)."""
    def step(label: str, requests: int) -> float:
        trace = probe_trace(label, requests)
        return step_seconds(replay(base_url, trace, actors=actors, timeout_s=600, t0=time.time() + start_lead_s,
                                   label="probe"))

    return {"step_s": step(run, PROBE_REQUESTS), "requests": PROBE_REQUESTS, "tokens": PROBE_TOKENS,
            "small_step_s": step(f"{run}/small", SMALL_PROBE_REQUESTS), "small_requests": SMALL_PROBE_REQUESTS}


def probe_path(run_file: Path) -> Path:
    return run_file.with_suffix(".probe.json")


def read_probe(run_file: Path) -> Probe | None:
    """A run's probe; None for runs made before runs were probed."""
    path = probe_path(run_file)
    if not path.exists():
        return None
    probe = json.loads(path.read_text())
    return Probe(probe["requests"], probe["step_s"], probe.get("after_step_s"), probe.get("small_requests"),
                 probe.get("small_step_s"), probe.get("after_small_step_s"))
