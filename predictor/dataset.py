"""Read a built ForeLen-style dataset: the one place that knows its files.

The builder (benchmarks.forelen.build) writes them; the predictor's training and every benchmark
read them through here, so the predictor needs nothing from the benchmarks to train.
"""

from __future__ import annotations

import json
from pathlib import Path

SAMPLES_FILE = "samples.jsonl"
META_FILE = "meta.json"


def load_samples(root: Path, split: str | None = None, scenario: str | None = None,
                 first: int | None = None) -> list[dict]:
    """Samples, optionally of one split/scenario. `first` keeps the first N samples built: the
    builder only appends, so a prefix is a frozen snapshot that results on a still-growing
    dataset can name and a rerun can reproduce."""
    rows = []
    with open(Path(root) / SAMPLES_FILE, encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            if first is not None and n >= first:
                break
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a hard stop of the builder
            if (split is None or r["split"] == split) and (scenario is None or r["scenario"] == scenario):
                rows.append(r)
    return rows


def load_meta(root: Path) -> dict:
    return json.loads((Path(root) / META_FILE).read_text())
