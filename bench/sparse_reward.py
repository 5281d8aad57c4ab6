"""Learning where rewards are rare (issue 31): the same model, task and training-time budget twice,
without and with adaptive sampling + the learnable-first release order, side by side in one run.

    jetrl model import-gguf --out jetrl-models/smollm2-135m      # once
    python bench/sparse_reward.py [--minutes 15] [--config examples/sparse_smollm2.yaml] [key=value ...]

Each side is bench/smollm2_addition.py's run (`jetrl up` in-process, the budget counted from every
service up, then the held-out set evaluated greedily at version 0 and at the last version). "without" is
the config as it is; "with" adds rollout.adaptive.max_samples (--max-samples, default 16; with the default
rollout.adaptive.stop=yield and weights=draws), launch.sampling=learnable-first and schedule.batch_wait_s
(--batch-wait, default 0: the trainer waits for full batches). Prints, per side: held-out accuracy before and after, samples generated
(every draw, extra rounds included) and trained, groups trained and the share with a reward spread, steps.
Last line `sparse_gain_pp: X`: held-out percentage points gained with the mechanism minus those gained
without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.smollm2_addition, when run as a script


def side(name: str, res: dict) -> dict:
    groups = res.get("groups_trained", 0)
    return {"side": name, "heldout_before": res.get("heldout_before"), "heldout_after": res.get("heldout_after"),
            "gain_pp": round(100 * (res["heldout_after"] - res["heldout_before"]), 1),
            "steps": res["steps"], "samples_generated": res.get("samples_drawn", 0),
            "samples_trained": res["completions"], "groups_trained": groups,
            "signal_share": round(res.get("groups_with_signal", 0) / groups, 3) if groups else 0.0,
            "completions_per_s": res["completions_per_s"], "train_s": res["train_s"], "run": res["run"]}


def main() -> None:
    from bench.smollm2_addition import run

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(ROOT / "examples" / "sparse_smollm2.yaml"))
    p.add_argument("--minutes", type=float, default=15.0, help="Training-time budget of each side.")
    p.add_argument("--max-samples", type=int, default=16, help="rollout.adaptive.max_samples of the 'with' side "
                   "(16: better than 64 in docs/benchmarks.md's runs).")
    p.add_argument("--batch-wait", type=float, default=0.0, help="schedule.batch_wait_s of the 'with' side: "
                   "the longest a group with signal waits for its batch (0 = wait for batch_size; 10 measured no "
                   "better in docs/benchmarks.md).")
    p.add_argument("--out", default="jetrl-bench/sparse-reward", help="Run dirs (logs, state) go here.")
    p.add_argument("--only", choices=("with", "without"), help="Run one side only (no sparse_gain_pp).")
    p.add_argument("overrides", nargs="*", help="Config overrides key=value for both sides.")
    args = p.parse_args()
    sides = {"without": [], "with": [f"rollout.adaptive.max_samples={args.max_samples}",
                                      "launch.sampling=learnable-first", f"schedule.batch_wait_s={args.batch_wait}"]}
    out = {}
    for name, extra in sides.items():
        if args.only and name != args.only:
            continue
        a = argparse.Namespace(config=args.config, minutes=args.minutes, out=args.out, no_eval=False, target=0.2,
                               overrides=["schedule.total_steps=100000", *args.overrides, *extra])
        out[name] = side(name, asyncio.run(run(a)))
        print(json.dumps(out[name]), flush=True)
    for s in out.values():
        print(f"{s['side']:>8}: held-out {s['heldout_before']:.3f} -> {s['heldout_after']:.3f} ({s['gain_pp']:+.1f} pp); "
              f"{s['steps']} steps, samples generated {s['samples_generated']}, trained {s['samples_trained']}; "
              f"groups trained {s['groups_trained']}, {100 * s['signal_share']:.0f} % with a reward spread")
    if len(out) == 2:
        print(f"sparse_gain_pp: {out['with']['gain_pp'] - out['without']['gain_pp']:.1f}")


if __name__ == "__main__":
    main()
