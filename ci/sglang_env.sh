#!/usr/bin/env bash
# Builds .sglang-venv: real SGLang 0.5.23 (installed --no-deps: its declared dependencies would
# pull CUDA) with the ~20 pure-Python packages its memory classes import, plus torch's CPU
# wheel. Recipe: research/sglang_cpu.md §1. Used by `kvspec bench anchor --sglang` and the
# sglang target (invariants/sglang/). SGLANG_VENV picks another directory (default .sglang-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SGLANG_VENV:-.sglang-venv}
PYTHON=${PYTHON:-python3}
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip install --quiet"
$PIP --upgrade pip
$PIP torch==2.13.0
$PIP --no-deps sglang==0.5.23
$PIP numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq \
    tqdm IPython aiohttp dill sentencepiece compressed-tensors gguf openai partial_json_parser \
    transformers==5.19.0
touch "$VENV/.installed"
