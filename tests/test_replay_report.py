"""The replay report: per-policy table, targets against round-robin, files written."""

import json

import pytest

from benchmarks.replay.records import RequestRecord
from benchmarks.replay.report import build_report, targets, write_report


def _records(policy, jct_scale, lengths, mode="open", load=0.5):
    out = []
    for i, n in enumerate(lengths):
        arrival = 0.0 if mode == "batch" else float(i)
        out.append(RequestRecord(
            policy=policy, mode=mode, load_rps=load if mode == "open" else None, request_id=f"r{i}", scenario="chat",
            arrival_s=arrival, sent_s=arrival, first_token_s=arrival + 0.1, finish_s=arrival + jct_scale * (i + 1),
            prompt_tokens=5, completion_tokens=n, true_output_tokens=n, predicted_tokens=n, pool="short",
            group=i // 2 if mode == "batch" else None, status="ok",
        ))
    return out


def test_targets_compare_estp_with_round_robin_and_the_oracle():
    policies = {
        "round_robin": {"mean_jct_s": 10.0, "batch_padding_ratio": 1.0, "throughput_tok_s": 50.0},
        "estp": {"mean_jct_s": 7.0, "batch_padding_ratio": 0.5, "throughput_tok_s": 55.0},
        "oracle": {"mean_jct_s": 6.0, "batch_padding_ratio": 0.1, "throughput_tok_s": 60.0},
    }
    t = targets(policies)
    assert t["mean_jct_change"] == pytest.approx(-0.3) and t["mean_jct_target_met"]
    assert t["batch_padding_change"] == pytest.approx(-0.5) and t["batch_padding_target_met"]
    assert t["throughput_target_met"] and t["share_of_oracle_jct_gain"] == pytest.approx(0.75)
    policies["estp"]["mean_jct_s"] = 9.5
    assert not targets(policies)["oracle_share_target_met"] and not targets(policies)["mean_jct_target_met"]
    assert targets({"estp": {}}) == {}


def test_report_has_one_row_per_policy_and_writes_its_files(tmp_path):
    records = (_records("round_robin", 2.0, [10, 40, 20, 30]) + _records("estp", 1.0, [10, 40, 20, 30])
               + _records("round_robin", 1.0, [10, 40, 20, 30], mode="batch")
               + _records("estp", 1.0, [10, 20, 30, 40], mode="batch"))
    report = build_report(records, batch_size=2, settings={}, lost=0)
    assert list(report["policies"]) == ["round_robin", "estp"] and report["main_load_rps"] == 0.5
    rr, estp = report["policies"]["round_robin"], report["policies"]["estp"]
    assert rr["mean_jct_s"] == pytest.approx(5.0) and estp["mean_jct_s"] == pytest.approx(2.5)
    assert rr["batch_padding_ratio"] == pytest.approx(40 / 100) and estp["batch_padding_ratio"] == pytest.approx(20 / 100)
    assert len(report["runs"]) == 4

    settings = dict(machine="m", dataset="d", split="test", n=4, seed=0, max_tokens=64, arrival="azure",
                    loads=[0.5], batch_size=2, actors=2, output_edges=[10, 20])
    write_report(tmp_path, records, 2, settings, lost=0)
    data = json.loads((tmp_path / "replay.json").read_text())
    assert data["lost_requests"] == 0 and set(data["policies"]) == {"round_robin", "estp"}
    assert "| estp |" in (tmp_path / "replay.md").read_text()
    assert (tmp_path / "replay_jct_cdf.png").stat().st_size > 0 and (tmp_path / "replay_throughput.png").exists()
