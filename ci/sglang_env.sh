#!/usr/bin/env bash
# Builds a CPU-only venv holding one real SGLang release (installed --no-deps: its declared
# dependencies would pull CUDA) with the pure-Python packages its memory classes and its real
# Scheduler module import, plus torch's CPU wheel (what each package is for: the comments below;
# the import stubs the drivers install instead of GPU-only packages: invariants/targets/sglang/
# driver/stubs.py).
#   SGLANG_VERSION  0.5.23 (default) -> .sglang-venv; any other supported release -> .sglang-venv-<version>
#   SGLANG_VENV     another directory for the venv (overrides the default above)
# Idempotent: the stamp file <venv>/.installed holds the recipe it was built from; when it matches,
# the script exits at once without touching the venv. Never installs an unpinned torch, sgl_kernel
# or sgl-kernel (those resolve to CUDA wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
PYTHON=${PYTHON:-python3}

# what every release needs: the imports of its memory classes ...
COMMON="numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq
    tqdm IPython aiohttp dill sentencepiece compressed-tensors gguf partial_json_parser"
# ... and, per release, its own pins plus what sglang.srt.managers.scheduler imports beyond the
# memory classes (checked by importing it with each package left out in turn)
case "$SGLANG_VERSION" in
    0.5.23)   # its scheduler also imports uvicorn and fastapi (whose telemetry module needs
              # opentelemetry-api); 0.5.1x's do not
        PINS="transformers==5.19.0 openai setproctitle einops uvicorn fastapi opentelemetry-api" ;;
    0.5.11)   # not the wheel's transformers==5.6.0: there AutoImageProcessor needs torchvision, so
              # sglang.srt.configs (janus_pro registers an image processor) fails to import
        PINS="transformers==5.3.0 openai==2.6.1 setproctitle einops" ;;
    0.5.10.post1)
        PINS="transformers==5.3.0 openai==2.6.1 setproctitle einops" ;;
    *)
        echo "ci/sglang_env.sh: no recipe for SGLANG_VERSION=$SGLANG_VERSION" \
            "(supported: 0.5.23, 0.5.11, 0.5.10.post1)" >&2
        exit 2
        ;;
esac
if [ "$SGLANG_VERSION" = 0.5.23 ]; then
    DEFAULT_VENV=.sglang-venv
else
    DEFAULT_VENV=.sglang-venv-$SGLANG_VERSION
fi
VENV=${SGLANG_VENV:-$DEFAULT_VENV}
STAMP="$VENV/.installed"
RECIPE="sglang==$SGLANG_VERSION torch==2.13.0 $(echo $COMMON $PINS)"

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$RECIPE" ]; then
    echo "$VENV: sglang $SGLANG_VERSION up to date"
    exit 0
fi
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip install --quiet"
$PIP --upgrade pip
$PIP torch==2.13.0   # the CPU wheel these machines provide; an unpinned torch pulls CUDA packages
$PIP --no-deps "sglang==$SGLANG_VERSION"
# shellcheck disable=SC2086  # word splitting intended
$PIP $COMMON $PINS
echo "$RECIPE" >"$STAMP"
echo "$VENV: sglang $SGLANG_VERSION built"
