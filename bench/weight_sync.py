"""Weight sync against its physical floor on the same disk (docs/weight_store.md).

    python bench/weight_sync.py            # 1 GiB bf16 state dict
    python bench/weight_sync.py --gib 0.25 --repeats 2
    python -m bench.weight_sync --cross-host   # the store on another (namespace) host, N fetching hosts on
                                               # rate-limited links, star vs relay (bench/weight_fanout.py; root)

(a) publish: state dict in memory -> committed version over HTTP   vs  safetensors.save_file
(b) fetch over HTTP: store -> a reader's local dir (sha256 checked) vs  cp of the same files
(c) shared filesystem: announcement -> state dict loaded            vs  safetensors.load_file
    (both then copied into preallocated tensors, as a weight swap does)
Each figure is the best of --repeats runs (the machine is shared). Also prints the service's peak
RSS (VmHWM: start-up plus uploads). Last line: `weight_fetch_ratio_http: X`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.weights_common import TOKEN, make_state_dict, peak_rss_mib, start_service  # noqa: E402
from shared.config import NatsConfig, StreamsConfig, WeightStoreConfig  # noqa: E402
from shared.contract import bus  # noqa: E402
from shared.runtime.natsd import EmbeddedNats, free_port  # noqa: E402
from weight_store.announce import announce, latest  # noqa: E402
from weight_store.client import WeightStoreClient, load_state_dict  # noqa: E402


def best(times: list[float]) -> float:
    return min(times)


async def main(args) -> None:
    work = Path(tempfile.mkdtemp(prefix="jetrl-bench-weights-", dir=args.dir))
    proc = nats = None
    try:
        sd = make_state_dict(args.gib)
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        print(f"state dict: {len(sd)} bf16 tensors, {nbytes / 2**30:.3f} GiB; work dir {work}")
        root, port = work / "store", free_port()
        proc = start_service(root, port)
        http_cfg = WeightStoreConfig(url=f"http://127.0.0.1:{port}", root=str(root), shared_fs=False, token=TOKEN,
                                     cache_dir=str(work / "cache"), keep_last=args.repeats + 1)
        client = WeightStoreClient(http_cfg)

        # (a) publish vs save_file
        t_save, t_pub, version, wv = [], [], 0, None
        for _ in range(args.repeats):
            out = work / "save.safetensors"
            os.sync()  # start each timed step with no dirty pages of the last one being written back
            t0 = time.perf_counter()
            save_file(sd, str(out))
            t_save.append(time.perf_counter() - t0)
            out.unlink()
            os.sync()  # start each timed step with no dirty pages of the last one being written back
            t0 = time.perf_counter()
            wv = await client.publish("bench", version, sd, step=version)
            t_pub.append(time.perf_counter() - t0)
            version += 1
        rss = peak_rss_mib(proc.pid)
        v = wv.version
        vdir = root / "bench" / str(v)
        files = [vdir / f["name"] for f in wv.files]
        print(f"(a) save_file {best(t_save):.3f} s {nbytes / best(t_save) / 1e9:.2f} GB/s | publish "
              f"{best(t_pub):.3f} s {nbytes / best(t_pub) / 1e9:.2f} GB/s ({len(wv.files)} files)")

        # (b) HTTP fetch vs cp
        t_cp, t_fetch = [], []
        for i in range(args.repeats):
            dst = work / f"cp{i}"
            dst.mkdir()
            os.sync()  # start each timed step with no dirty pages of the last one being written back
            t0 = time.perf_counter()
            subprocess.run(["cp", *map(str, files), str(dst)], check=True)
            t_cp.append(time.perf_counter() - t0)
            shutil.rmtree(dst)
            shutil.rmtree(work / "cache", ignore_errors=True)
            os.sync()  # start each timed step with no dirty pages of the last one being written back
            t0 = time.perf_counter()
            path = await client.fetch("bench", v)
            t_fetch.append(time.perf_counter() - t0)
            assert path.is_relative_to(work / "cache")
        shutil.rmtree(work / "cache", ignore_errors=True)
        print(f"(b) cp {best(t_cp):.3f} s {nbytes / best(t_cp) / 1e9:.2f} GB/s | HTTP fetch "
              f"{best(t_fetch):.3f} s {nbytes / best(t_fetch) / 1e9:.2f} GB/s (sha256 checked)")

        # (c) shared filesystem: announcement -> state dict, vs load_file
        nats = EmbeddedNats(work / "nats").start()
        nc = await bus.connect(NatsConfig(servers=[nats.url]), name="bench")
        js = nc.jetstream()
        await bus.ensure_streams(js, StreamsConfig())
        await announce(js, wv)
        # the default reader checks every file's sha256 (weights.verify_shared_sha256); `trusting` is the
        # explicit opt-out
        shared = WeightStoreClient(http_cfg.model_copy(update={"shared_fs": True}))
        trusting = WeightStoreClient(http_cfg.model_copy(update={"shared_fs": True, "verify_shared_sha256": False}))
        # "Loaded" = copied into the reader's own tensors (a model's parameters), as a weight swap does:
        # load_file maps the file lazily, so without the copy neither side would read a byte.
        params = {k: torch.empty_like(t) for k, t in sd.items()}
        t_load, t_shared, t_trusting = [], [], []
        for _ in range(args.repeats):
            os.sync()  # start each timed step with no dirty pages of the last one being written back
            t0 = time.perf_counter()
            for f in files:
                if f.suffix == ".safetensors":
                    for k, t in load_file(str(f)).items():
                        params[k].copy_(t)
            t_load.append(time.perf_counter() - t0)
            os.sync()  # start each timed step with no dirty pages of the last one being written back
            t0 = time.perf_counter()
            got = await latest(js, "bench")
            path = await shared.fetch("bench", got.version)
            loaded = load_state_dict(path)
            for k, t in loaded.items():
                params[k].copy_(t)
            t_shared.append(time.perf_counter() - t0)
            assert path == vdir and len(loaded) == len(sd)
            del loaded
            os.sync()
            t0 = time.perf_counter()
            got = await latest(js, "bench")
            loaded = load_state_dict(await trusting.fetch("bench", got.version))
            for k, t in loaded.items():
                params[k].copy_(t)
            t_trusting.append(time.perf_counter() - t0)
            del loaded
        assert all(torch.equal(params[k], sd[k]) for k in sd)
        await nc.close()
        print(f"(c) load_file {best(t_load):.3f} s {nbytes / best(t_load) / 1e9:.2f} GB/s | announcement -> "
              f"state dict {best(t_shared):.3f} s {nbytes / best(t_shared) / 1e9:.2f} GB/s (sha256 checked, the "
              f"default) | {best(t_trusting):.3f} s {nbytes / best(t_trusting) / 1e9:.2f} GB/s "
              f"(verify_shared_sha256: false)")

        r_pub, r_http, r_fs = best(t_pub) / best(t_save), best(t_fetch) / best(t_cp), best(t_shared) / best(t_load)
        print(f"weight_publish_ratio: {r_pub:.2f} (target <= 1.5)")
        print(f"weight_fetch_ratio_shared_fs: {r_fs:.2f} (sha256 checked; "
              f"{best(t_trusting) / best(t_load):.2f} with verify_shared_sha256: false, target <= 1.2)")
        print(f"weight_service_peak_rss_mib: {rss:.0f} (target < 256)")
        print(f"weight_fetch_ratio_http: {r_http:.2f}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        if nats is not None:
            nats.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="Size of the bf16 state dict in GiB.")
    ap.add_argument("--repeats", type=int, default=3, help="Runs of each step; the best is reported.")
    ap.add_argument("--dir", default=None, help="Where temporary files go (default: the system temp dir).")
    ap.add_argument("--cross-host", action="store_true",
                    help="The fan-out across namespace hosts instead (bench/weight_fanout.py; needs root).")
    args = ap.parse_args()
    if args.cross_host:
        from bench.weight_fanout import run

        run(gib=args.gib, work_dir=args.dir)
    else:
        asyncio.run(main(args))
