"""The speed probe kept beside each real run: fixed-length answers and their time per token."""

import json

import pytest

from benchmarks.replay.probe import (PROBE_REQUESTS, PROBE_TOKENS, Probe, probe_path, probe_trace, read_probe,
                                     step_seconds)
from benchmarks.replay.records import RequestRecord


def _record(i: int, first: float, finish: float, tokens: int, status: str = "ok") -> RequestRecord:
    return RequestRecord(policy="ray_default", mode="open", request_id=f"p{i}", scenario="probe", arrival_s=0.0,
                         first_token_s=first, finish_s=finish, prompt_tokens=0, completion_tokens=tokens,
                         true_output_tokens=tokens, status=status)


def test_the_probe_asks_every_request_for_exactly_its_length():
    trace = probe_trace("w/p/r0")
    assert len(trace) == PROBE_REQUESTS and len({r.request_id for r in trace}) == PROBE_REQUESTS
    body = trace[0].body("m")
    assert body["max_tokens"] == PROBE_TOKENS and body["extra_body"] == {"min_tokens": PROBE_TOKENS}
    assert "extra_body" not in probe_trace("x")[0].model_copy(update={"min_tokens": None}).body("m")


def test_the_step_time_is_the_median_gap_between_a_requests_tokens():
    records = [_record(0, 1.0, 11.0, 101), _record(1, 1.0, 21.0, 101), _record(2, 2.0, 32.0, 101),
               _record(3, 0.0, 0.0, 0, status="failed")]
    assert step_seconds(records) == pytest.approx(0.2)
    with pytest.raises(RuntimeError, match="no answer"):
        step_seconds(records[3:])


def test_a_run_made_before_probing_has_no_probe(tmp_path):
    run_file = tmp_path / "w__p__r0.jsonl"
    assert read_probe(run_file) is None
    probe_path(run_file).write_text(json.dumps({"step_s": 0.12, "requests": 16, "tokens": 64}))
    assert probe_path(run_file).name == "w__p__r0.probe.json" and read_probe(run_file) == Probe(16, 0.12)


def test_a_run_probed_before_and_after_is_timed_at_the_mean_of_both(tmp_path):
    run_file = tmp_path / "w__p__r0.jsonl"
    probe_path(run_file).write_text(json.dumps({"step_s": 0.6, "requests": 32, "tokens": 64, "after_step_s": 0.4}))
    probe = read_probe(run_file)
    assert probe == Probe(32, 0.6, 0.4) and probe.run_step_s == pytest.approx(0.5)
    assert Probe(32, 0.6).run_step_s == 0.6  # probed only before: that reading


def test_a_run_probed_at_two_sizes_keeps_both_readings_before_and_after(tmp_path):
    run_file = tmp_path / "w__p__r0.jsonl"
    probe_path(run_file).write_text(json.dumps({"step_s": 0.6, "requests": 32, "tokens": 64, "after_step_s": 0.4,
                                                "small_step_s": 0.3, "small_requests": 8,
                                                "after_small_step_s": 0.2}))
    probe = read_probe(run_file)
    assert probe == Probe(32, 0.6, 0.4, 8, 0.3, 0.2)
    assert probe.run_step_s == pytest.approx(0.5) and probe.run_small_step_s == pytest.approx(0.25)
    assert Probe(32, 0.6).run_small_step_s is None
    assert len({r.request_id for r in probe_trace("w/p/r0") + probe_trace("w/p/r0/small", 8)}) == PROBE_REQUESTS + 8
