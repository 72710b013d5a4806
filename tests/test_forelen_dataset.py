"""The ForeLen-style builder: prompt choice, splits, datasheet, and a real end-to-end slice."""

import json

import pytest

from benchmarks.forelen.datasheet import (ceiling_pool_accuracy, leave_one_out_medians, noise_floor_mae,
                                          target_samples, within_prompt_variance_share, write_datasheet)
from router.scheduling.pools import Pools
from benchmarks.forelen.sources import select_prompts
from tests import FORELEN_TINY as FIXTURE



def test_selection_is_seeded_balanced_and_split_by_prompt():
    sizes = {"longseq": 20, "reasoning": 20, "rl": 10, "chat": 20}
    a = select_prompts(prompts=sizes, seed=3)
    b = select_prompts(prompts=sizes, seed=3)
    assert [i.prompt_id for i in a] == [i.prompt_id for i in b]
    assert [i.prompt_id for i in a] != [i.prompt_id for i in select_prompts(prompts=sizes, seed=4)]
    for scenario, n in sizes.items():
        items = [i for i in a if i.scenario == scenario]
        assert len(items) == n
        assert {i.split for i in items} == {"train", "val", "test"}  # stratified by scenario
        assert sum(i.split == "train" for i in items) == round(0.8 * n)
    assert {i.samples for i in a if i.scenario == "rl"} == {8}
    assert len({i.source for i in a if i.scenario == "reasoning"}) == 3  # gsm8k, math500, minerva


def test_noise_floor_is_mae_to_each_prompts_median():
    rows = [{"prompt_id": "a", "output_tokens": x} for x in (10, 20, 60)]
    rows += [{"prompt_id": "b", "output_tokens": 5}]  # a single sample says nothing about spread
    assert noise_floor_mae(rows) == pytest.approx((10 + 0 + 40) / 3)


def test_leave_one_out_floor_variance_share_and_ceiling_by_hand():
    rows = [{"prompt_id": "a", "output_tokens": x} for x in (10, 20, 60)]
    rows += [{"prompt_id": "b", "output_tokens": x} for x in (100, 300)]
    assert noise_floor_mae(rows) == pytest.approx((10 + 0 + 40 + 100 + 100) / 5)
    # a's other samples: (20, 60) -> 40, (10, 60) -> 35, (10, 20) -> 15; b has too few for a median of others
    assert noise_floor_mae(rows, leave_one_out_medians) == pytest.approx((30 + 15 + 45) / 3)
    within = (20 ** 2 + 10 ** 2 + 30 ** 2) + 2 * 100 ** 2
    total = sum((x - 98) ** 2 for x in (10, 20, 60, 100, 300))
    assert within_prompt_variance_share(rows) == pytest.approx(within / total)
    pools = Pools(("short", "long"), (50.0,))
    assert ceiling_pool_accuracy(rows, pools) == pytest.approx(4 / 5)  # only 60 is on the other side of a's median
    assert ceiling_pool_accuracy(rows, pools, leave_one_out_medians) == pytest.approx(2 / 3)


def test_target_counts_the_extension_of_held_out_prompts():
    settings = {"prompts": {"chat": 600, "rl": 200}, "samples": {"chat": 1, "rl": 8},
                "heldout_samples": {"chat": 4, "rl": 8}}
    assert target_samples(settings, "chat") == 480 + 120 * 4 and target_samples(settings, "rl") == 1600
    assert target_samples({**settings, "heldout_samples": {}}, "chat") == 600  # a dataset built before extensions


def test_first_n_samples_is_a_prefix_snapshot():
    from predictor.dataset import load_samples

    everything = load_samples(FIXTURE)
    assert load_samples(FIXTURE, first=5) == everything[:5]
    test_rows = load_samples(FIXTURE, split="test", first=len(everything) // 2)
    assert test_rows == [r for r in everything[: len(everything) // 2] if r["split"] == "test"]


def test_datasheet_shape(tmp_path):
    sheet = write_datasheet(FIXTURE, tmp_path)
    on_disk = json.loads((tmp_path / "forelen_dataset.json").read_text())
    assert on_disk == sheet
    for name in ("longseq", "reasoning", "rl", "chat"):
        d = sheet["scenarios"][name]
        assert d["prompts"] >= 1 and d["samples"] >= d["prompts"]
        assert d["output_tokens"]["p10"] <= d["output_tokens"]["p50"] <= d["output_tokens"]["p90"]
        assert (tmp_path / f"forelen_hist_{name}.png").stat().st_size > 0
    assert sheet["noise_floor_mae"]["rl"] > 0
    c = sheet["ceiling"]["rl"]
    assert c["noise_floor_mae_leave_one_out"] >= c["noise_floor_mae_in_sample"] > 0
    assert 0 < c["within_prompt_variance_share"] < 1 and 0 <= c["ceiling_pool_accuracy_in_sample"] <= 1
    assert sheet["ceiling"]["chat"]["noise_floor_mae_in_sample"] is None  # the fixture samples chat once
    assert len(sheet["pools"]["edges"]) == 2
    assert "Noise floor" in (tmp_path / "forelen_dataset.md").read_text()


@pytest.mark.stack
def test_build_small_slice_end_to_end_and_resume(tmp_path):
    """Real vLLM generation of a small slice; a rerun finds everything done and adds nothing."""
    from benchmarks.forelen.build import build

    sizes = {"longseq": 1, "reasoning": 1, "rl": 1, "chat": 1}
    out = build(tmp_path / "ds", prompts=sizes, samples={"rl": 2}, max_tokens=16, inflight=8, kv_cache_gib=1)
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 5
    assert {r["scenario"] for r in rows} == set(sizes)
    for r in rows:
        assert 1 <= r["output_tokens"] <= 16
        assert r["finish_reason"] in ("stop", "length")
        assert r["prompt_tokens"] > 20  # default system prompt included
    meta = json.loads((out / "meta.json").read_text())["settings"]
    assert meta["temperature"] == 0.7 and meta["max_tokens"] == 16 and len(meta["weights_hash"]) == 16
    build(tmp_path / "ds", prompts=sizes, samples={"rl": 2}, max_tokens=16, inflight=8, kv_cache_gib=1)
    assert len((out / "samples.jsonl").read_text().splitlines()) == 5
    with pytest.raises(SystemExit, match="other settings"):
        build(tmp_path / "ds", prompts=sizes, samples={"rl": 2}, max_tokens=32)
