"""Replay metrics and accounting on hand-made records (no Ray, no server)."""

import pytest

from benchmarks.replay.actors import account, benchmark_headers
from benchmarks.replay.metrics import decode_groups, padding_ratio, short_ids, summarise
from benchmarks.replay.records import RequestRecord, read_records, write_records
from benchmarks.replay.trace import TraceRequest


def _rec(i, arrival, finish, tokens, true=None, pool="short", mode="open", group=None, status="ok", **kw):
    done = status == "ok"
    return RequestRecord(
        policy="estp", mode=mode, request_id=f"r{i}", scenario="chat", arrival_s=arrival,
        first_token_s=arrival + 0.5 if done else None, finish_s=finish if done else None, prompt_tokens=10,
        completion_tokens=tokens if done else None, true_output_tokens=true or tokens, pool=pool,
        group=group, status=status, **kw,
    )


def _req(i, true=10):
    return TraceRequest(request_id=f"r{i}", arrival_s=i, prompt_id="p", scenario="chat",
                        messages=[{"role": "user", "content": "x"}], max_tokens=64,
                        true_output_tokens=true, prompt_tokens=5)


def test_padding_ratio_is_padding_over_useful_tokens():
    assert padding_ratio([[10, 10], [5]]) == 0
    assert padding_ratio([[10, 30], [20]]) == pytest.approx(20 / 60)  # (2*30 - 40) / 60
    assert padding_ratio([]) is None


def test_batch_groups_are_the_groups_and_open_loop_cuts_each_pool_in_arrival_order():
    batch = [_rec(0, 0, 5, 10, mode="batch", group=0), _rec(1, 0, 9, 30, mode="batch", group=0),
             _rec(2, 0, 7, 20, mode="batch", group=1)]
    assert sorted(decode_groups(batch, batch_size=8)) == [[10, 30], [20]]
    open_loop = [_rec(0, 0, 5, 10), _rec(1, 1, 9, 300, pool="long"), _rec(2, 2, 7, 20), _rec(3, 3, 8, 40),
                 _rec(4, 4, 9, 5, status="failed")]
    assert sorted(decode_groups(open_loop, batch_size=2)) == [[10, 20], [40], [300]]


def test_summary_percentiles_throughput_and_short_requests():
    records = [_rec(i, arrival=i, finish=i + 1 + i, tokens=10 * (i + 1)) for i in range(4)]
    records.append(_rec(9, arrival=4, finish=0, tokens=0, true=500, status="failed", error="timeout"))
    s = summarise(records, batch_size=8)
    jcts = [1, 2, 3, 4]
    assert s["mean_jct_s"] == pytest.approx(2.5) and s["p50_jct_s"] == pytest.approx(2.5)
    assert s["p99_jct_s"] == pytest.approx(4 - 0.03)
    assert s["throughput_tok_s"] == pytest.approx(100 / 7) and s["throughput_req_s"] == pytest.approx(4 / 7)
    assert (s["completed"], s["failed"], s["pools"]) == (4, 1, {"short": 4})
    assert short_ids(records) == {"r0", "r1"} and s["short_p99_jct_s"] == pytest.approx(jcts[0] + 0.99)
    assert s["short_answer_mean_jct_s"] == pytest.approx(jcts[0])  # by what the run generated: r0's 10 tokens
    assert s["mean_ttft_s"] == pytest.approx(0.5)


def test_accounting_counts_every_request_once():
    trace = [_req(i) for i in range(4)]
    records = [_rec(0, 0, 1, 5), _rec(1, 0, 1, 5, status="failed", error="x"), _rec(2, 0, 1, 5)]
    tally = account(trace, records)
    assert (tally.sent, tally.completed, tally.failed, tally.lost) == (4, 2, 1, 1)
    assert str(tally) == "sent 4 = completed 2 + failed 1; lost 1"
    with pytest.raises(ValueError):
        account(trace, records + records[:1])


def test_benchmark_headers_only_for_what_the_router_must_be_told(monkeypatch):
    monkeypatch.delenv("LENGTHSERVE_BENCHMARK_KEY", raising=False)
    assert benchmark_headers(_req(0, true=42), None) == {}  # any client's request
    assert benchmark_headers(_req(0, true=42), "oracle") == {"X-Routing-Policy": "oracle", "X-True-Output-Tokens": "42"}
    monkeypatch.setenv("LENGTHSERVE_BENCHMARK_KEY", "k")
    assert benchmark_headers(_req(0, true=42), "ceiling")["X-Benchmark-Key"] == "k"
    assert "X-True-Output-Tokens" not in benchmark_headers(_req(0, true=42), "ceiling")  # no median: nothing
    assert benchmark_headers(_req(0, true=42), None) == {}  # no header: no key sent either


def test_a_fixed_length_request_tells_the_engines_its_length_through_the_router_only(monkeypatch):
    monkeypatch.delenv("LENGTHSERVE_BENCHMARK_KEY", raising=False)
    fixed = _req(0, true=42).model_copy(update={"fixed_tokens": 42})
    assert benchmark_headers(fixed, None) == {"X-Fixed-Output-Tokens": "42"}  # the configured policy, not told
    assert benchmark_headers(fixed, "last_work")["X-Fixed-Output-Tokens"] == "42"
    assert "min_tokens" not in str(fixed.body("m")) and "ignore_eos" not in str(fixed.body("m"))


def test_records_round_trip(tmp_path):
    records = [_rec(0, 0, 1, 5), _rec(1, 0, 1, 5, status="failed", error="boom")]
    write_records(tmp_path / "r.jsonl", records[:1])
    write_records(tmp_path / "r.jsonl", records[1:], append=True)
    assert read_records(tmp_path / "r.jsonl") == records
