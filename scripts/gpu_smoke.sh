#!/usr/bin/env bash
# A short GSM8K GRPO run on one GPU: vLLM rollout + FSDP2 trainer + eval, then held-out accuracy
# before and after. Needs a CUDA machine with vllm installed in this python, and the model locally
# or reachable on the hub.
#
#   MODEL=/models/Qwen2.5-0.5B-Instruct STEPS=10 scripts/gpu_smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
STEPS=${STEPS:-10}
EVAL_ROWS=${EVAL_ROWS:-100}
OUT=${OUT:-jetrl-gpu-smoke}
mkdir -p "$OUT"
CFG=(-c examples/gsm8k_grpo.yaml run=gpu-smoke model.path="$MODEL" schedule.total_steps="$STEPS"
     schedule.batch_size=16 rollout.sampling.max_new_tokens=512 rollout.vllm.max_model_len=1024)

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "== resolved plan"
jetrl up "${CFG[@]}" --run-dir "$OUT/run" --dry-run | tail -n 12
echo "== training $STEPS versions"
jetrl up "${CFG[@]}" --run-dir "$OUT/run" --dataset examples/data/gsm8k/train.jsonl --no-panel --quiet
echo "== held-out accuracy, version 0 and the final version ($EVAL_ROWS test rows, greedy)"
# eval connects to NATS: run it against a fresh embedded server for the before/after numbers
jetrl up "${CFG[@]}" --run-dir "$OUT/run" --no-panel --quiet --keep-running &
UP=$!
trap 'kill -INT $UP 2>/dev/null || true; wait $UP || true' EXIT
sleep 60
SERVERS=$(python -c "import yaml;print(yaml.safe_load(open('$OUT/run/config.yaml'))['nats']['servers'][0])")
WURL=$(python -c "import yaml;print(yaml.safe_load(open('$OUT/run/config.yaml'))['weights']['url'])")
for V in 0 "$STEPS"; do
  jetrl eval "${CFG[@]}" nats.embedded=false "nats.servers=[$SERVERS]" weights.url="$WURL" \
    weights.root="$OUT/run/weights" --dataset examples/data/gsm8k/test.jsonl --limit "$EVAL_ROWS" \
    --version "$V" --output "$OUT/eval_v$V.json"
done
