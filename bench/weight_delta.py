"""Delta versions on a real run: bytes on the wire per weight version, delta against full, over the
versions of the SmolLM2-135M addition run published in bf16 (issue 32; weight_store/delta.py).

    jetrl model import-gguf --out jetrl-models/smollm2-135m      # once
    python bench/weight_delta.py [--versions 20] [--out jetrl-bench/weight-delta]

1. Trains the addition run (examples/smollm2_addition.yaml, bench/smollm2_addition.py's launcher) for
   `--versions` steps with `trainer.publish_dtype=bfloat16`, every version kept (weights.keep_last).
2. For each version v >= 1 against v-1: the share of bf16 values whose bits changed, and the delta the
   store wrote at commit (bytes, against the full version's).
3. Publishes the same versions again into two fresh stores on loopback, one with deltas and one
   without, and fetches each version in order with a reader of each: publish seconds (upload + commit,
   the delta's zstd included), fetch seconds (download + rebuild + digest check of every file), and the
   bytes each reader downloaded. Loopback is not a network, so fetch seconds show the CPU cost of the
   rebuild, not the wire time a delta saves on a real link; the bytes are what a link would carry.
Last line: `weight_delta_ratio: X` (delta bytes / full bytes over versions 1..N, as the reader downloaded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def changed_share(new_dir: Path, base_dir: Path) -> tuple[int, int]:
    """(values whose bits differ, floating-point values) between two versions' safetensors."""
    import torch

    from weight_store.client import load_state_dict

    a, b = load_state_dict(new_dir), load_state_dict(base_dir)
    changed = total = 0
    for k, t in a.items():
        if t.is_floating_point():
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
            changed += int((t.view(bits) != b[k].view(bits)).sum())
            total += t.numel()
    return changed, total


def _serve(cfg):
    import uvicorn

    from weight_store.server import create_app, http_protocol

    server = uvicorn.Server(uvicorn.Config(create_app(cfg), host="127.0.0.1", port=cfg.port, log_level="warning",
                                           lifespan="off", http=http_protocol(), loop="asyncio", access_log=False))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server


async def replay(version_dirs: list[Path], work: Path, delta: bool) -> dict:
    """Publish the versions into a fresh store (deltas on or off) and fetch each in order with one reader."""
    from shared.config import WeightStoreConfig
    from shared.runtime.natsd import free_port
    from weight_store.client import WeightStoreClient

    port = free_port()
    cfg = WeightStoreConfig(url=f"http://127.0.0.1:{port}", port=port, root=str(work / "root"), shared_fs=False,
                            insecure_no_auth=True, keep_last=len(version_dirs) + 1, delta=delta,
                            cache_dir=str(work / "cache"), cache_keep=2)
    server = _serve(cfg)
    srcs = []
    for d in version_dirs:  # the version's own files (hard links), without the store's manifest and .delta/
        src = work / "src" / d.name
        for f in d.rglob("*"):
            rel = f.relative_to(d)
            if f.is_file() and rel.parts[0] not in ("manifest.json", ".delta"):
                (src / rel).parent.mkdir(parents=True, exist_ok=True)
                os.link(f, src / rel)
        srcs.append(src)
    pub, reader = WeightStoreClient(cfg), WeightStoreClient(cfg)
    publish_s, fetch_s = [], []
    try:
        for v, d in enumerate(srcs):
            t0 = time.perf_counter()
            await pub.publish("bench", v, d)
            t1 = time.perf_counter()
            await reader.fetch("bench", v)
            t2 = time.perf_counter()
            publish_s.append(t1 - t0)
            fetch_s.append(t2 - t1)
    finally:
        server.should_exit = True
    return {"publish_s": publish_s, "fetch_s": fetch_s, "stats": dict(reader.stats)}


async def main_async(args) -> None:
    from bench.smollm2_addition import run as run_addition

    out = Path(args.out).resolve()
    ns = argparse.Namespace(config=str(ROOT / "examples" / "smollm2_addition.yaml"), minutes=args.minutes, out=str(out),
                            no_eval=True, target=0.45,
                            overrides=[f"schedule.total_steps={args.versions}", "trainer.publish_dtype=bfloat16",
                                       f"weights.keep_last={args.versions + 5}", "trainer.checkpoint_every=1000"])
    if args.reuse:  # the versions of an earlier run of this bench
        run_dir = Path(args.reuse).resolve()
        res = {"run": run_dir.name, "steps": "?", "s_per_step": "?"}
        out = run_dir.parent
    else:
        res = await run_addition(ns)
    root = out / res["run"] / "weights" / res["run"]
    versions = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / "manifest.json").is_file())
    dirs = [root / str(v) for v in versions]
    print(f"run {res['run']}: {res['steps']} steps, versions {versions[0]}..{versions[-1]}, "
          f"{res['s_per_step']} s/step", flush=True)
    rows, changed_all, total_all = [], 0, 0
    for prev, d in zip(dirs, dirs[1:], strict=False):
        changed, total = changed_share(d, prev)
        changed_all, total_all = changed_all + changed, total_all + total
        doc_path = d / ".delta" / "delta.json"
        doc = json.loads(doc_path.read_text()) if doc_path.is_file() else None
        full = sum(f["size"] for f in json.loads((d / "manifest.json").read_text())["files"])
        rows.append({"version": int(d.name), "changed_share": round(changed / total, 4), "full_bytes": full,
                     "delta_bytes": doc["delta_bytes"] if doc else None})
        print(f"v{d.name}: {100 * changed / total:.2f} % of bf16 values changed; delta "
              f"{doc['delta_bytes'] / 1e6 if doc else float('nan'):.1f} MB of {full / 1e6:.1f} MB", flush=True)
    work = out / "replay"
    shutil.rmtree(work, ignore_errors=True)
    with_delta = await replay(dirs, work / "delta", delta=True)
    without = await replay(dirs, work / "full", delta=False)
    shutil.rmtree(work, ignore_errors=True)
    n = len(dirs) - 1
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    s = with_delta["stats"]
    full_bytes = sum(r["full_bytes"] for r in rows)
    ratio = s["delta_bytes"] / full_bytes
    summary = {
        "versions": len(dirs), "changed_share_mean": round(changed_all / total_all, 4),
        "full_mb_per_version": round(full_bytes / n / 1e6, 1), "delta_mb_per_version": round(s["delta_bytes"] / n / 1e6, 2),
        "reader_delta_fetches": s["delta_fetches"], "reader_full_fetches": s["full_fetches"],
        "delta_refused": s["delta_refused"],
        "publish_s_delta": round(mean(with_delta["publish_s"][1:]), 3),
        "publish_s_full": round(mean(without["publish_s"][1:]), 3),
        "fetch_apply_s_delta": round(mean(with_delta["fetch_s"][1:]), 3),
        "fetch_s_full": round(mean(without["fetch_s"][1:]), 3),
        "rows": rows,
    }
    (out / "weight_delta.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}), flush=True)
    moved = [r for r in rows if r["delta_bytes"]]  # versions whose weights changed (a step with a gradient)
    if moved:
        print(f"weight_delta_ratio_changed_versions: {sum(r['delta_bytes'] for r in moved) / sum(r['full_bytes'] for r in moved):.4f} "
              f"({len(moved)} of {n} versions changed)", flush=True)
    print(f"weight_delta_ratio: {ratio:.4f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--versions", type=int, default=20, help="Trainer steps (versions after version 0).")
    p.add_argument("--minutes", type=float, default=20.0, help="Budget for the training run.")
    p.add_argument("--out", default="jetrl-bench/weight-delta")
    p.add_argument("--reuse", default="", help="A run dir of an earlier run of this bench: measure its versions again.")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
