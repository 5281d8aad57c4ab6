"""How rarely SmolLM2-135M-Instruct solves the subtraction task before training (issue 31's task check):
greedy accuracy on the held-out prompts, and pass@k from `--samples` draws per prompt at the training
temperature, on the first `--prompts` held-out prompts.

    jetrl model import-gguf --out jetrl-models/smollm2-135m      # once
    python bench/sparse_task_probe.py [--config examples/sparse_smollm2.yaml] [--prompts 50] [--samples 64]

Prompts are rendered as the single_turn workflow renders them (the model's chat template, one user message),
completions scored by the task's scorer. pass@k is `jetrl eval`'s unbiased estimator
(rollout_service/evaluation/passk.py; Chen et al. 2021, eq. 1), averaged over the prompts. Prints greedy
accuracy, the mean per-sample success, pass@1/8/16/64, the share of prompts never solved; last line `sparse_base_pass64: X` (percent).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reward_service.scorers import load_scorer
    from rollout_service.evaluation.passk import pass_at_k
    from rollout_service.workflows.base import prompt_messages
    from shared.config import JetrlConfig, load_config

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(ROOT / "examples" / "sparse_smollm2.yaml"))
    p.add_argument("--prompts", type=int, default=50, help="Held-out prompts sampled for pass@k.")
    p.add_argument("--samples", type=int, default=64, help="Draws per prompt (n of pass@k).")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    cfg = load_config(JetrlConfig, args.config)
    score = load_scorer(cfg.reward.task)
    rows = [json.loads(x) for x in Path(cfg.eval.dataset).read_text().splitlines() if x.strip()]
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32).eval()
    max_new = cfg.eval.max_new_tokens or cfg.rollout.sampling.max_new_tokens
    temp = cfg.rollout.sampling.temperature
    torch.manual_seed(args.seed)

    def ids(row: dict) -> torch.Tensor:
        text = tok.apply_chat_template(prompt_messages(row), tokenize=False, add_generation_prompt=True)
        return tok(text, return_tensors="pt").input_ids

    def solved(out: torch.Tensor, n_prompt: int, ref) -> list[bool]:
        return [score(tok.decode(o[n_prompt:], skip_special_tokens=True), ref, {}).reward >= 1.0 for o in out]

    t0 = time.monotonic()
    greedy = []
    with torch.inference_mode():
        for r in rows:
            x = ids(r)
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=tok.eos_token_id)
            greedy += solved(out, x.shape[1], r["reference"])
        counts = []
        for r in rows[:args.prompts]:
            x = ids(r)
            xs = x.repeat(args.samples, 1)
            out = model.generate(xs, attention_mask=torch.ones_like(xs), max_new_tokens=max_new, do_sample=True,
                                 temperature=temp, top_p=1.0, top_k=0, pad_token_id=tok.eos_token_id)
            counts.append(sum(solved(out, x.shape[1], r["reference"])))
    n = args.samples
    res = {"heldout": len(rows), "greedy_acc": round(sum(greedy) / len(greedy), 4), "prompts": len(counts),
           "samples": n, "temperature": temp, "per_sample": round(sum(counts) / (n * len(counts)), 4),
           "never_solved": round(sum(c == 0 for c in counts) / len(counts), 3), "seconds": round(time.monotonic() - t0, 1)}
    for k in (1, 8, 16, 64):
        if k <= n:
            res[f"pass@{k}"] = round(sum(pass_at_k(n, c, k) for c in counts) / len(counts), 4)
    print(json.dumps(res))
    print(f"sparse_base_pass64: {100 * res.get('pass@64', 0.0):.1f}")


if __name__ == "__main__":
    main()
