#!/usr/bin/env bash
# The real-model paths on one CUDA GPU without vLLM (the local engine and the FSDP trainer), for a machine
# that has torch with CUDA and SmolLM2-135M imported (`jetrl model import-gguf --out jetrl-models/smollm2-135m`):
#   1. the GPU tests: `pytest -m gpu` (shared-prompt packing, bf16 steps, activation checkpointing and the
#      local engine on CUDA; the Megatron backend where megatron-core is installed);
#   2. bench/trainer_memory.py on CUDA: seconds of the trainer's forward / backward / optimizer per step;
#   3. bench/smollm2_addition.py with the trainer and the local engine on CUDA for MINUTES of training,
#      then held-out accuracy before and after.
# scripts/gpu_smoke.sh is the vLLM + GSM8K run (needs vllm and a Qwen model).
#
#   MINUTES=3 OUT=jetrl-gpu-check [PYTHON=python3] [SKIP_TESTS=1] scripts/gpu_check.sh
# Logs: $OUT/gpu_tests.log, trainer_cuda.log, addition.log; the addition run's dir (summary.json, plots)
# under $OUT/addition.
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${MINUTES:-3}
OUT=${OUT:-jetrl-gpu-check}
PYTHON=${PYTHON:-python}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PYTHON -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__)"
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== GPU tests"
  $PYTHON -m pytest -q -p no:cacheprovider -m gpu tests/trainer tests/engines 2>&1 | tee "$OUT/gpu_tests.log" || true
fi
echo "== trainer step on CUDA (bench/trainer_memory.py)"
$PYTHON bench/trainer_memory.py --steps 6 trainer.device=cuda 2>&1 | grep -v "^Loading" | tee "$OUT/trainer_cuda.log"
echo "== SmolLM2 addition, trainer and local engine on CUDA, $MINUTES min"
$PYTHON bench/smollm2_addition.py --minutes "$MINUTES" --out "$OUT/addition" trainer.device=cuda rollout.device=cuda \
  2>&1 | grep -v "^Loading" | tee "$OUT/addition.log"
