"""sort-6 in one process: sample -> score -> the trainer's own step code, no services. What the demo's
sort settings were chosen with (launcher/demo/run.py, SORT_OPTIM / SORT_ALGORITHM), and the reference the
services' runs are held against.

The tiny policy (2 layers, hidden 64) answers "sort 3 8 1 5 2 0 =" with six tokens limited to the ten
digits (the same logits mask as rollout.sampling.allowed_token_ids); 128 prompts x 8 samples per
version (the demo's sort settings: 16 PPO minibatches, lr 3e-4); GRPO advantages; held-out greedy
reward on 200 prompts of the held-out side of the split.
`--stale K` samples each batch from the policy K versions old (a fixed staleness, as a stand-in for
an asynchronous run) so the objectives can be compared without the services.

    python -m bench.sort_loop [--versions 100] [--lr 3e-4] [--minibatches 16] [--prompts 128] [--stale 0]
                              [--objective ppo] [--set trainer.algorithm.KEY=VALUE ...]

Last line: `sort_loop_heldout: X` (held-out reward after the last version).
"""

from __future__ import annotations

import argparse
import collections
import copy
import time

import numpy as np
import torch

from launcher.demo.run import digit_token_ids
from launcher.demo.task import make_rows
from reward_service.scorers.sortdigits import score
from shared.config import JetrlConfig, load_config
from shared.model.logits_mask import allowed_vector, mask_logits
from trainer_service.algorithms.advantages import group_advantages
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import TrainItem
from trainer_service.step import train_step

ANSWER = 6


@torch.no_grad()
def generate(model, tok, prompts: list[str], n: int, allowed, greedy: bool = False):
    """n answers per prompt (all prompts have the same length): token ids [P*n, L+6] and logprobs [P*n, 6]."""
    ids = torch.tensor([tok.encode(p) for p in prompts for _ in range(n)])
    model.eval()
    lps = []
    for _ in range(ANSWER):
        lp = torch.log_softmax(mask_logits(model(input_ids=ids, use_cache=False).logits[:, -1].float(), allowed), -1)
        nxt = lp.argmax(-1, keepdim=True) if greedy else torch.multinomial(lp.exp(), 1)
        lps.append(lp.gather(-1, nxt))
        ids = torch.cat([ids, nxt], 1)
    return ids, torch.cat(lps, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", type=int, default=100)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--minibatches", type=int, default=16)
    ap.add_argument("--objective", default="ppo")
    ap.add_argument("--stale", type=int, default=0, help="sample from the policy this many versions old")
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="more config overrides, key=value")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    digits = digit_token_ids()
    cfg = load_config(JetrlConfig, None, [
        "trainer.device=cpu", f"trainer.optim.lr={a.lr}", "trainer.optim.lr_schedule=constant",
        f"trainer.algorithm.ppo_minibatches={a.minibatches}", f"trainer.algorithm.objective={a.objective}",
        f"model.seed={a.seed}", f"rollout.sampling.allowed_token_ids={digits}", *a.set])
    backend = FSDPBackend(cfg)
    model, tok = backend.model, backend.tokenizer
    allowed = allowed_vector(digits, model.config.vocab_size)
    train = make_rows(a.versions * a.prompts, seed=a.seed, digits=6, side="train", unique=False, task="sort")
    held = make_rows(200, seed=a.seed + 1_000_003, digits=6, side="heldout", unique=False, task="sort")

    def heldout() -> float:
        ids, _ = generate(model, tok, [r["prompt"] for r in held], 1, allowed, greedy=True)
        outs = [tok.decode(ids[i, -ANSWER:].tolist()) for i in range(len(held))]
        return float(np.mean([score(o, r["reference"]).reward for o, r in zip(outs, held, strict=True)]))

    old = collections.deque(maxlen=a.stale + 1)
    t0, h = time.perf_counter(), heldout()
    print(f"version 0: held-out {h:.3f}", flush=True)
    for v in range(a.versions):
        old.append(copy.deepcopy(model) if a.stale else model)
        rows = train[v * a.prompts:(v + 1) * a.prompts]
        ids, lps = generate(old[0], tok, [r["prompt"] for r in rows], a.group, allowed)
        plen = ids.shape[1] - ANSWER
        rewards = [[score(tok.decode(ids[i * a.group + j, -ANSWER:].tolist()), r["reference"]).reward
                    for j in range(a.group)] for i, r in enumerate(rows)]
        advs = group_advantages(rewards, cfg.trainer.algorithm.adv_estimator, cfg.trainer.algorithm.adv_eps)
        mask = np.array([0] * plen + [1] * ANSWER, np.uint8)
        items = [TrainItem(tokens=ids[k].numpy().astype(np.int32), loss_mask=mask,
                           behav_logp=np.concatenate([np.zeros(plen, np.float32), lps[k].numpy().astype(np.float32)]),
                           advantage=float(advs[k // a.group][k % a.group])) for k in range(len(ids))]
        train_step(backend, items, cfg.trainer, norm_length=ANSWER)
        if (v + 1) % a.eval_every == 0 or v + 1 == a.versions:
            h = heldout()
            print(f"version {v + 1}: held-out {h:.3f}, train {np.mean(rewards):.3f}, "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
    print(f"sort_loop_heldout: {h:.3f}")


if __name__ == "__main__":
    main()
