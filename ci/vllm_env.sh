#!/usr/bin/env bash
# Builds a CPU-only venv holding one real vLLM release for the vllm target (invariants/targets/vllm/): the
# wheel --no-deps (its declared dependencies pull CUDA), torch's CPU wheel, and only the
# pure-Python packages vLLM's v1 scheduler, KV cache manager and config import (found by
# importing them on a bare venv; xgrammar --no-deps: it would pull triton). No stubs are needed:
# a missing vllm._C is logged and ignored; the driver selects the CPU platform itself.
#   VLLM_VERSION  0.33.0 (default) -> .vllm-venv; V -> .vllm-venv-V; VLLM_VENV overrides. 0.33.0 and
#   0.30.0 have pinned recipes; any other release takes the ranges its wheel declares.
# Idempotent: <venv>/.installed holds the recipe it was built from; when it matches, nothing runs.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
PYTHON=${PYTHON:-python3}
case "$VLLM_VERSION" in
    0.33.0|0.30.0)   # pinned: the releases CI runs (0.30.0 pins torch==2.13.0 itself)
        PINS="packaging pydantic==2.14.4 regex numpy==2.4.6 cbor2 psutil pyzmq transformers==5.20.2
            aiohttp requests openai-harmony==0.0.8 openai==3.57.0 pillow pybase64 cachetools
            msgspec==0.22.0 cloudpickle uvloop py-cpuinfo prometheus_client fastapi==0.136.3
            partial-json-parser llguidance==1.7.6 einops"
        NODEPS="xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2" ;;
    [0-9]*.[0-9]*.[0-9]*)   # any other release: the same packages, in the ranges its own wheel
        # metadata declares (ci/vllm_requirements.py); the wheel is fetched first to read them
        WHEELS=$(mktemp -d)
        "$PYTHON" -m pip download --quiet --no-deps "vllm==$VLLM_VERSION" -d "$WHEELS"
        RANGES=$("$PYTHON" ci/vllm_requirements.py "$WHEELS"/vllm-*.whl)
        PINS=$(echo "$RANGES" | sed -n 1p)
        NODEPS=$(echo "$RANGES" | sed -n 2p)
        rm -rf "$WHEELS" ;;
    *)
        echo "ci/vllm_env.sh: VLLM_VERSION=$VLLM_VERSION is not a release (X.Y.Z)" >&2
        exit 2 ;;
esac
if [ "$VLLM_VERSION" = 0.33.0 ]; then DEFAULT_VENV=.vllm-venv; else DEFAULT_VENV=.vllm-venv-$VLLM_VERSION; fi
VENV=${VLLM_VENV:-$DEFAULT_VENV}
STAMP="$VENV/.installed"
RECIPE="vllm==$VLLM_VERSION torch==2.13.0 $(echo $NODEPS $PINS)"
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$RECIPE" ]; then
    echo "$VENV: vllm $VLLM_VERSION up to date"
    exit 0
fi
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip install --quiet"
$PIP --upgrade pip
$PIP torch==2.13.0   # the CPU wheel these machines provide; an unpinned torch pulls CUDA packages
$PIP --no-deps "vllm==$VLLM_VERSION"
# shellcheck disable=SC2086  # word splitting intended
$PIP --no-deps $NODEPS
# shellcheck disable=SC2086
$PIP $PINS
echo "$RECIPE" >"$STAMP"
echo "$VENV: vllm $VLLM_VERSION built"
