"""Where a trainer step's memory goes: the trainer backend alone (no services) on a config's model, with
batches shaped like the config's (batch_size groups x group_size samples, a shared prompt of --prompt
tokens and --completion generated tokens), each step followed by the publish path's state dict, written
to files and dropped before the next step (as `trainer.publish_snapshot: disk` does; with the default
`memory` the service writes it beside the next step, so its copy adds to that step's first second).

    python bench/trainer_memory.py [--config examples/smollm2_addition.yaml] [--steps 8] [key=value ...]
    python bench/trainer_memory.py trainer.optim.name=adamw_8bit trainer.release_memory=true

    python bench/trainer_memory.py --long model.path=jetrl-models/smollm2-135m   # long agent samples

--long: one group of --group-size (8) samples of --prompt (500) shared + --completion (2000) generated
tokens, the size of the smolagents CodeAgent group that got a trainer OOM-killed, for --steps
(1) steps; last line `trainer_long_sample_peak_gib: X`, the highest step peak, the first step included
(GiB). Compare `trainer.activation_checkpointing=false` (before: every micro-batch keeps its activations)
with the default `auto` (long micro-batches checkpointed, trainer_service/activations.py).

Prints, per step, the resident set (RSS) before the step and the peak (VmHWM, reset before each phase
through /proc/self/clear_refs) of its forward, backward and optimizer phases and of the publish snapshot,
with each phase's seconds. Last line: `trainer_step_peak_rss_gb: X`, the highest step peak after the
first step (the first faults the weights in). Linux only (/proc). docs/benchmarks.md, "SmolLM2-135M
addition", has what it measured.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_gb() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in GB."""
    d = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, value = line.split(":")
            d[key] = int(value.split()[0]) * 1024 / 1e9
    return d["VmRSS"], d["VmHWM"]


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


class PhaseMeter:
    """Wraps backend methods: for each call, RSS before, peak during, seconds (on a GPU the call's kernels
    are waited for, so each phase's seconds are its own)."""

    def __init__(self, backend, names):
        import torch

        self.sync = torch.cuda.synchronize if backend.device.type == "cuda" else (lambda: None)
        self.rows: list[tuple[str, float, float, float]] = []
        for name in names:
            setattr(backend, name, self._wrap(name, getattr(backend, name)))

    def _wrap(self, name, fn):
        def call(*a, **k):
            before = rss_gb()[0]
            reset_peak()
            t = time.perf_counter()
            out = fn(*a, **k)
            self.sync()
            self.rows.append((name, before, rss_gb()[1], time.perf_counter() - t))
            return out
        return call


def batch(rng: random.Random, groups: int, size: int, prompt: int, completion: int, vocab: int):
    from trainer_service.packing import TrainItem

    items = []
    for g in range(groups):
        head = [rng.randrange(vocab) for _ in range(prompt)]
        for _ in range(size):
            items.append(TrainItem(tokens=head + [rng.randrange(vocab) for _ in range(completion)],
                                   loss_mask=[0] * prompt + [1] * completion,
                                   behav_logp=[0.0] * prompt + [-1.0] * completion,
                                   advantage=rng.choice([-1.0, 1.0]), group_id=f"g{g}", reward=0.0))
    return items


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples/smollm2_addition.yaml"))
    ap.add_argument("--steps", type=int, default=None, help="Steps (8; 1 with --long).")
    ap.add_argument("--prompt", type=int, default=None, help="Prompt tokens per group (the addition prompt: ~45; "
                    "500 with --long).")
    ap.add_argument("--completion", type=int, default=None, help="Generated tokens per sample (8; 2000 with --long).")
    ap.add_argument("--long", action="store_true", help="One group of --group-size long samples (see above).")
    ap.add_argument("--group-size", type=int, default=8, help="With --long: samples in the group.")
    ap.add_argument("overrides", nargs="*", help="Config overrides key=value.")
    args = ap.parse_args()
    long_defaults = (1, 500, 2000) if args.long else (8, 45, 8)
    args.steps, args.prompt, args.completion = (v if v is not None else d for v, d in zip(
        (args.steps, args.prompt, args.completion), long_defaults, strict=True))
    if not Path("/proc/self/clear_refs").exists():
        sys.exit("bench/trainer_memory.py reads /proc (Linux)")

    import torch

    from shared.config import JetrlConfig, load_config
    from trainer_service.backends.fsdp import FSDPBackend
    from trainer_service.service import execute

    cfg = load_config(JetrlConfig, args.config, args.overrides)
    torch.set_num_threads(max(1, cfg.launch.torch_threads))
    print(f"start: RSS {rss_gb()[0]:.2f} GB")
    backend = FSDPBackend(cfg)
    print(f"backend built: RSS {rss_gb()[0]:.2f} GB (the weights fault in at the first forward)")
    meter = PhaseMeter(backend, ("forward", "backward", "clip_and_step"))
    rng = random.Random(0)
    vocab = min(backend.hf_config().vocab_size, 32000)
    peaks = []
    with tempfile.TemporaryDirectory(prefix="jetrl-trainer-memory-") as tmp:
        for i in range(args.steps):
            meter.rows.clear()
            groups, size = (1, args.group_size) if args.long else (cfg.schedule.batch_size, cfg.rollout.group_size)
            items = batch(rng, groups, size, args.prompt, args.completion, vocab)
            before = rss_gb()[0]
            reset_peak()
            t = time.perf_counter()
            execute(backend, {"kind": "step", "items": items}, cfg)
            step_s, step_peak = time.perf_counter() - t, rss_gb()[1]  # since the last phase's reset
            reset_peak()
            t = time.perf_counter()
            # the state dict, written and dropped, then (trainer.release_memory) freed memory handed back
            execute(backend, {"kind": "stage", "parent": Path(tmp)}, cfg).discard()
            pub_s, pub_peak = time.perf_counter() - t, rss_gb()[1]
            # forward/backward run once per micro-batch: report each phase's highest peak and total seconds
            phases = {}
            for name, _, peak, sec in meter.rows:
                p, s = phases.get(name, (0.0, 0.0))
                phases[name] = (max(p, peak), s + sec)
            # each phase reset the high-water mark: the step's peak is the highest of its phases' peaks
            step_peak = max([step_peak] + [p for p, _ in phases.values()])
            shown = " ".join(f"{n} {p:.2f} GB {s:.2f} s" for n, (p, s) in phases.items())
            if backend.device.type == "cuda":  # the GPU's own peak (the RSS figures are the host's)
                shown += f"; GPU peak allocated {torch.cuda.max_memory_allocated() / 1e9:.2f} GB"
                torch.cuda.reset_peak_memory_stats()
            print(f"step {i}: RSS before {before:.2f} GB, step peak {step_peak:.2f} GB in {step_s:.2f} s ({shown}); "
                  f"publish snapshot peak {pub_peak:.2f} GB in {pub_s:.2f} s, RSS after {rss_gb()[0]:.2f} GB",
                  flush=True)
            if i > 0 or args.long:
                peaks.append(max(step_peak, pub_peak))
    if args.long:
        print(f"micro-batches run checkpointed, all steps: {backend.checkpointed_micro_batches}")
        print(f"trainer_long_sample_peak_gib: {max(peaks) * 1e9 / 2**30:.2f}")
    else:
        print(f"trainer_step_peak_rss_gb: {max(peaks) if peaks else 0.0:.2f}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
