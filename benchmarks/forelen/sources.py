"""Pick the benchmark's prompts from `../shared/data`, per scenario, reproducibly.

The four scenarios mirror ForeLen's: long-form writing (LongSeq), chain-of-thought maths
(Reasoning), RL rollouts (one prompt sampled several times) and chat. Prompts are chosen with a
seeded shuffle and each prompt gets its split here, so every sample of a prompt lands in one split.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = Path(os.environ.get("FORELEN_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))

SCENARIOS = ("longseq", "reasoning", "rl", "chat")
DEFAULT_PROMPTS = {"longseq": 400, "reasoning": 400, "rl": 200, "chat": 600}
DEFAULT_SAMPLES = {"longseq": 1, "reasoning": 1, "rl": 8, "chat": 1}
# Val and test prompts get at least this many samples: the spread of one prompt's lengths is the
# noise floor of every scenario, and a floor needs several samples of the same prompt.
DEFAULT_HELDOUT_SAMPLES = {"longseq": 4, "reasoning": 4, "rl": 8, "chat": 4}
SPLIT_FRACTIONS = (("train", 0.8), ("val", 0.1), ("test", 0.1))


@dataclass(frozen=True)
class PromptItem:
    prompt_id: str
    scenario: str
    source: str
    text: str
    samples: int
    split: str = ""


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _candidates(data_dir: Path, scenario: str) -> list[tuple[str, str, str]]:
    """(source, id within source, prompt text) for every usable prompt of a scenario."""
    rows: list[tuple[str, str, str]] = []
    if scenario == "longseq":
        for name in ("longbench_write", "longwrite_ruler"):
            for i, r in enumerate(_jsonl(data_dir / "longseq" / f"{name}.jsonl")):
                rows.append((name, str(i), r["prompt"]))
        for name in ("chat", "heuristic_text_generation", "open_ended_qa", "text_completion"):
            for r in _jsonl(data_dir / "longseq" / f"hellobench_{name}.jsonl"):
                rows.append((f"hellobench_{name}", r["id"], r["instruction"]))
    elif scenario == "reasoning":
        for i, r in enumerate(_jsonl(data_dir / "reasoning" / "gsm8k_test.jsonl")):
            rows.append(("gsm8k", str(i), r["question"]))
        for name in ("math500", "minerva_math"):
            for i, r in enumerate(_jsonl(data_dir / "reasoning" / f"{name}.jsonl")):
                rows.append((name, str(i), r["problem"]))
    elif scenario == "rl":
        with open(data_dir / "rl" / "deepscaler_math.json", encoding="utf-8") as fh:
            for i, r in enumerate(json.load(fh)):
                rows.append(("deepscaler", str(i), r["problem"]))
    elif scenario == "chat":
        for r in _jsonl(data_dir / "chat" / "sharegpt_firstturn.jsonl"):
            if r["prompt"].strip():
                rows.append(("sharegpt", r["id"], r["prompt"]))
    else:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
    return rows


def _balanced_pick(rows: list[tuple[str, str, str]], n: int, rng: random.Random) -> list:
    """Round-robin over sources so a scenario is not dominated by its biggest source."""
    by_source: dict[str, list] = {}
    for row in rows:
        by_source.setdefault(row[0], []).append(row)
    for group in by_source.values():
        rng.shuffle(group)
    picked: list = []
    queues = [by_source[k] for k in sorted(by_source)]
    while len(picked) < n and any(queues):
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop())
    return picked


def _assign_splits(items: list[PromptItem], rng: random.Random) -> list[PromptItem]:
    order = list(range(len(items)))
    rng.shuffle(order)
    out = list(items)
    start = 0
    for k, (name, frac) in enumerate(SPLIT_FRACTIONS):
        stop = len(order) if k == len(SPLIT_FRACTIONS) - 1 else start + round(frac * len(order))
        for idx in order[start:stop]:
            out[idx] = replace(out[idx], split=name)
        start = stop
    return out


def select_prompts(
    data_dir: Path = DEFAULT_DATA_DIR,
    prompts: dict[str, int] | None = None,
    samples: dict[str, int] | None = None,
    seed: int = 0,
    accept=lambda text: True,
    heldout_samples: dict[str, int] | None = None,
) -> list[PromptItem]:
    """Seeded, source-balanced choice per scenario; splits stratified by scenario.

    `accept` lets the builder drop prompts the engine cannot take (too long for the context),
    before counting, so a scenario still gets its full size. `heldout_samples` raises the sample
    count of val and test prompts; it changes neither which prompts are chosen nor their splits.
    """
    prompts = {**DEFAULT_PROMPTS, **(prompts or {})}
    samples = {**DEFAULT_SAMPLES, **(samples or {})}
    heldout = heldout_samples or {}
    chosen: list[PromptItem] = []
    for scenario in SCENARIOS:
        if prompts.get(scenario, 0) <= 0:
            continue
        rng = random.Random(f"{seed}-{scenario}")
        rows = [r for r in _candidates(Path(data_dir), scenario) if accept(r[2])]
        picked = _balanced_pick(rows, prompts[scenario], rng)
        items = [
            PromptItem(
                prompt_id=f"{scenario}/{source}/{sid}",
                scenario=scenario,
                source=source,
                text=text,
                samples=samples[scenario],
            )
            for source, sid, text in picked
        ]
        chosen.extend(
            replace(it, samples=max(it.samples, heldout.get(scenario, 0))) if it.split != "train" else it
            for it in _assign_splits(items, rng)
        )
    return chosen
