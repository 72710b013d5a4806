"""Growing a built dataset (more samples of the val/test prompts) resumes and never duplicates.

The engine is stubbed: it "generates" each pending (prompt, sample) with a length of its own,
and can stop part-way like a killed build, leaving a cut last line. Prompts come from a small
data folder of the layout `benchmarks.forelen.sources` reads.
"""

import json
from collections import Counter

import pytest

from benchmarks.forelen import build as builder

SIZES = {"longseq": 0, "reasoning": 0, "rl": 5, "chat": 10}
BEFORE = {"longseq": 1, "reasoning": 1, "rl": 2, "chat": 1}  # no extension yet
AFTER = {"longseq": 1, "reasoning": 1, "rl": 3, "chat": 4}


@pytest.fixture
def data_dir(tmp_path):
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "deepscaler_math.json").write_text(json.dumps([{"problem": f"Compute {i} + {i}."} for i in range(8)]))
    (tmp_path / "chat").mkdir()
    (tmp_path / "chat" / "sharegpt_firstturn.jsonl").write_text(
        "".join(json.dumps({"id": f"c{i}", "prompt": f"Tell me about topic {i}."}) + "\n" for i in range(14)))
    return tmp_path


class StubEngine:
    """Stands in for `_generate`: writes records for the pending samples, optionally only some."""

    def __init__(self, stop_after: int | None = None):
        self.stop_after = stop_after
        self.calls: list[list[tuple[str, int]]] = []

    def __call__(self, path, pending, settings, prompt_ids, samples_path, *rest):
        self.calls.append([(item.prompt_id, k) for item, k in pending])
        with open(samples_path, "a", encoding="utf-8") as fh:
            for n, (item, k) in enumerate(pending):
                if self.stop_after is not None and n == self.stop_after:
                    fh.write('{"prompt_id": "cut sho')  # a hard stop mid-line
                    return
                fh.write(json.dumps({"prompt_id": item.prompt_id, "sample_idx": k, "scenario": item.scenario,
                                     "source": item.source, "split": item.split, "prompt": item.text,
                                     "prompt_tokens": len(prompt_ids(item.text)), "output_tokens": 10 + k,
                                     "finish_reason": "stop"}) + "\n")


def _run(out, data_dir, heldout, engine, monkeypatch):
    monkeypatch.setattr(builder, "_generate", engine)
    builder.build(out, data_dir=data_dir, prompts=SIZES, samples={"rl": 2}, heldout_samples=heldout)


def _records(out) -> list[dict]:
    rows = []
    for line in (out / "samples.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def test_extension_resumes_and_never_duplicates_a_prompt_sample_pair(tmp_path, data_dir, monkeypatch):
    out = tmp_path / "ds"
    _run(out, data_dir, BEFORE, StubEngine(stop_after=7), monkeypatch)  # killed part-way
    first = _records(out)
    assert len(first) == 7
    _run(out, data_dir, BEFORE, StubEngine(), monkeypatch)  # resumed
    built = _records(out)
    assert len(built) == 5 * 2 + 10 and len({(r["prompt_id"], r["sample_idx"]) for r in built}) == len(built)

    engine = StubEngine(stop_after=3)
    _run(out, data_dir, AFTER, engine, monkeypatch)  # the extension, killed part-way
    done_before = {(r["prompt_id"], r["sample_idx"]) for r in built}
    assert not set(engine.calls[0]) & done_before  # nothing built is asked for again
    _run(out, data_dir, AFTER, StubEngine(), monkeypatch)  # and resumed
    rows = _records(out)
    keys = Counter((r["prompt_id"], r["sample_idx"]) for r in rows)
    assert max(keys.values()) == 1
    per_prompt = Counter(r["prompt_id"] for r in rows)
    split = {r["prompt_id"]: (r["scenario"], r["split"]) for r in rows}
    for prompt, n in per_prompt.items():
        scenario, part = split[prompt]
        wanted = {"rl": 2, "chat": 1}[scenario] if part == "train" else AFTER[scenario]
        assert n == wanted, prompt
        assert sorted(k for p, k in keys if p == prompt) == list(range(wanted))
    assert {s for s, _ in split.values()} == {"rl", "chat"} and {p for _, p in split.values()} == {"train", "val", "test"}
    assert json.loads((out / "meta.json").read_text())["settings"]["heldout_samples"] == AFTER

    idle = StubEngine()
    _run(out, data_dir, AFTER, idle, monkeypatch)
    assert idle.calls == [] and _records(out) == rows  # complete: nothing to generate


def test_a_dataset_never_shrinks(tmp_path, data_dir, monkeypatch):
    out = tmp_path / "ds"
    _run(out, data_dir, AFTER, StubEngine(), monkeypatch)
    with pytest.raises(SystemExit, match="other settings"):
        _run(out, data_dir, BEFORE, StubEngine(), monkeypatch)
