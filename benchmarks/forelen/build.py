"""Build a ForeLen-style dataset: generate every prompt with the serving model, record lengths.

Generation runs through vLLM's engine loop with continuous batching; each finished sample is
appended to `samples.jsonl` at once, so a stopped build resumes where it stopped (finished samples
are skipped). The engine is seeded, but sampled lengths are not bit-reproducible: per-request seeds
crash vLLM's CPU sampler under chunked prefill ('CPU Generator does not use offset'), and without
them the random stream depends on batch composition. Lengths are a distribution anyway; the RL
scenario's repeated samples measure exactly that spread.

    python -m benchmarks.forelen.build --out benchmarks/datasets/smollm2-135m-instruct
    python -m benchmarks.forelen.build --model /path/to/hf-folder --out my-dataset   # another model
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from predictor.dataset import META_FILE, SAMPLES_FILE
from benchmarks.forelen.sources import (
    DEFAULT_DATA_DIR,
    DEFAULT_HELDOUT_SAMPLES,
    DEFAULT_PROMPTS,
    DEFAULT_SAMPLES,
    PromptItem,
    select_prompts,
)

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "datasets" / "smollm2-135m-instruct"


@dataclass
class GenerationSettings:
    """Everything that decides the lengths; a resumed build must match it exactly."""

    model_id: str
    weights_hash: str
    chat_template_sha: str
    default_system_prompt: bool = True
    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 1024
    max_model_len: int = 4096
    dtype: str = "float32"
    seed: int = 0
    prompts: dict = field(default_factory=lambda: dict(DEFAULT_PROMPTS))
    samples: dict = field(default_factory=lambda: dict(DEFAULT_SAMPLES))
    heldout_samples: dict = field(default_factory=lambda: dict(DEFAULT_HELDOUT_SAMPLES))


# How many samples a prompt gets decides no length: a dataset may grow them (an extension appends
# samples to prompts it already has), never shrink them, so meta.json always describes the file.
SAMPLE_COUNTS = ("samples", "heldout_samples")


def _model_identity(model_source: str) -> tuple[str, str, str]:
    from predictor.model_files import EMBEDDED_MODEL_ID, model_weights_hash, resolve_model_source

    path = resolve_model_source(model_source)
    model_id = EMBEDDED_MODEL_ID if model_source == "embedded" else model_source
    return path, model_id, model_weights_hash(path) if Path(path).is_dir() else "hub-revision-unpinned"


def _done_keys(samples_path: Path) -> set[tuple[str, int]]:
    done: set[tuple[str, int]] = set()
    if samples_path.exists():
        with open(samples_path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a hard stop: its sample is regenerated
                done.add((r["prompt_id"], r["sample_idx"]))
    return done


def _end_cut_line(samples_path: Path) -> None:
    """Terminate a line cut by a hard stop, so the next record appended starts a line of its own
    instead of being glued to the fragment (and lost with it)."""
    if samples_path.exists() and samples_path.stat().st_size:
        with open(samples_path, "rb+") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.write(b"\n")


def _grown(have: dict | None, wanted: dict) -> bool:
    have = have or {}
    return all(wanted.get(k, 0) >= v for k, v in have.items())


def _check_meta(out: Path, settings: GenerationSettings) -> None:
    """Refuse other generation settings; record grown sample counts (an extension)."""
    meta_path = out / META_FILE
    wanted = asdict(settings)
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        have = meta["settings"]
        diff = {k: (have.get(k), v) for k, v in wanted.items() if k not in SAMPLE_COUNTS and have.get(k) != v}
        shrunk = [k for k in SAMPLE_COUNTS if not _grown(have.get(k), wanted[k])]
        if diff or shrunk:
            diff.update({k: (have.get(k), wanted[k]) for k in shrunk})
            raise SystemExit(
                f"{out} was built with other settings {diff}; use another --out or delete it"
            )
        if have != wanted:
            meta_path.write_text(json.dumps({**meta, "settings": wanted}, indent=2) + "\n")
    else:
        out.mkdir(parents=True, exist_ok=True)
        meta_path.write_text(json.dumps({"settings": wanted, "format": 1}, indent=2) + "\n")


def build(
    out: Path,
    model: str = "embedded",
    data_dir: Path = DEFAULT_DATA_DIR,
    prompts: dict | None = None,
    samples: dict | None = None,
    heldout_samples: dict | None = None,
    max_tokens: int = 1024,
    max_model_len: int = 4096,
    seed: int = 0,
    inflight: int = 128,
    kv_cache_gib: int = 4,
) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    import hashlib

    from tqdm import tqdm
    from transformers import AutoTokenizer

    path, model_id, whash = _model_identity(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    settings = GenerationSettings(
        model_id=model_id,
        weights_hash=whash,
        chat_template_sha=hashlib.sha256((tokenizer.chat_template or "").encode()).hexdigest()[:16],
        max_tokens=max_tokens,
        max_model_len=max_model_len,
        seed=seed,
        prompts={**DEFAULT_PROMPTS, **(prompts or {})},
        samples={**DEFAULT_SAMPLES, **(samples or {})},
        heldout_samples={**DEFAULT_HELDOUT_SAMPLES, **(heldout_samples or {})},
    )
    out = Path(out)
    _check_meta(out, settings)

    def prompt_ids(text: str) -> list[int]:
        # The template's default system prompt stays in: it is what the served model sees.
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
            return_dict=False,
        )

    budget = max_model_len - max_tokens
    items = select_prompts(
        Path(data_dir), settings.prompts, settings.samples, seed,
        accept=lambda text: len(text) < 4 * budget and len(prompt_ids(text)) <= budget,
        heldout_samples=settings.heldout_samples,
    )
    work = [(it, k) for it in items for k in range(it.samples)]
    random.Random(seed).shuffle(work)  # interleave scenarios: a partial build covers all of them
    samples_path = out / SAMPLES_FILE
    _end_cut_line(samples_path)
    done = _done_keys(samples_path)
    pending = [(it, k) for it, k in work if (it.prompt_id, k) not in done]
    print(f"{len(work)} samples, {len(work) - len(pending)} already built, {len(pending)} to go")
    if pending:
        _generate(path, pending, settings, prompt_ids, samples_path, inflight, len(work) - len(pending), len(work), tqdm)
    return out


def _generate(path, pending, settings, prompt_ids, samples_path, inflight, n_done, n_total, tqdm):
    from vllm import LLM

    llm = LLM(
        model=path, dtype=settings.dtype, max_model_len=settings.max_model_len,
        enforce_eager=True, max_num_seqs=inflight, seed=settings.seed,
    )
    engine = llm.llm_engine
    try:
        _drain(engine, pending, settings, prompt_ids, samples_path, inflight, n_done, n_total, tqdm)
    finally:
        # Free the engine's processes now, not at interpreter exit (tests build in-process).
        engine.engine_core.shutdown()


def _drain(engine, pending, settings, prompt_ids, samples_path, inflight, n_done, n_total, tqdm):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    queue = list(reversed(pending))
    live: dict[str, tuple[PromptItem, int, int]] = {}
    bar = tqdm(total=n_total, initial=n_done, unit="sample", smoothing=0.05)
    tokens_out, t0 = 0, time.time()
    with open(samples_path, "a", encoding="utf-8") as fh:
        while queue or live:
            while queue and len(live) < inflight:
                item, k = queue.pop()
                ids = prompt_ids(item.text)
                rid = f"{item.prompt_id}#{k}"
                params = SamplingParams(
                    temperature=settings.temperature, top_p=settings.top_p, max_tokens=settings.max_tokens
                )
                engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), params)
                live[rid] = (item, k, len(ids))
            for output in engine.step():
                if not output.finished:
                    continue
                item, k, n_prompt = live.pop(output.request_id)
                completion = output.outputs[0]
                record = {
                    "prompt_id": item.prompt_id, "sample_idx": k, "scenario": item.scenario,
                    "source": item.source, "split": item.split, "prompt": item.text,
                    "prompt_tokens": n_prompt, "output_tokens": len(completion.token_ids),
                    "finish_reason": completion.finish_reason,
                }
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
                fh.flush()
                tokens_out += record["output_tokens"]
                bar.update(1)
                bar.set_postfix(tok_s=f"{tokens_out / (time.time() - t0):.0f}")
    bar.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--model", default="embedded", help="'embedded', a HF folder, or a HF id")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    p.add_argument("--prompts", type=json.loads, default=None,
                   help='per-scenario prompt counts, e.g. \'{"longseq": 4, "rl": 2}\'')
    p.add_argument("--samples", type=json.loads, default=None, help="per-scenario samples per prompt")
    p.add_argument("--heldout-samples", type=json.loads, default=None,
                   help="per-scenario minimum samples of val and test prompts (their noise floor)")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--inflight", type=int, default=128, help="requests decoded together")
    p.add_argument("--kv-cache-gib", type=int, default=4)
    a = p.parse_args()
    build(a.out, a.model, a.data_dir, a.prompts, a.samples, a.heldout_samples, a.max_tokens, a.max_model_len,
          a.seed, a.inflight, a.kv_cache_gib)


if __name__ == "__main__":
    main()
