"""Cross-host weight fan-out (`python -m bench.weight_sync --cross-host`, issue 19): a version of --gib GiB
in the weight store on one namespace host (multihost/netns.py), fetched over HTTP across the bridge by 1
and then by 4 worker hosts at once, against 1 and 4 parallel `cp` of the same files on one host. Prints
each host's time and the total (first start to last finish); last line
`weight_fanout_ratio: X` = 4-host fan-out total / 4 parallel cp (target <= 1.5). Needs root.

All hosts share this machine's disk, cores and page cache: the bridge removes loopback's shortcuts (each
byte crosses two veth pairs and a bridge), not the shared hardware; on real hosts each fetcher has its
own disk and NIC while the store's NIC is shared.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cp_parallel(files: list[Path], dests: list[Path]) -> tuple[float, list[float]]:
    """Start one `cp` of `files` per destination at once; (total, each one's time)."""
    for d in dests:
        d.mkdir(parents=True)
    os.sync()
    t0 = time.perf_counter()
    procs = [(subprocess.Popen(["cp", *map(str, files), str(d)]), time.perf_counter()) for d in dests]
    each = []
    for p, _ in procs:
        p.wait()
        each.append(time.perf_counter() - t0)
    total = time.perf_counter() - t0
    for d in dests:
        shutil.rmtree(d)
    return total, each


def _fetch_on_hosts(net, hosts: list[str], url: str, version: int, work: Path,
                    verify: bool = True) -> tuple[float, dict[str, float]]:
    """Every host fetches `version` at once (a start file releases them together); (total, per host)."""
    go = work / "go"
    go.unlink(missing_ok=True)
    procs = {}
    for h in hosts:
        out = work / f"fetch-{h}.json"
        out.unlink(missing_ok=True)
        procs[h] = net.spawn(h, [sys.executable, "-m", "bench.weight_fanout", "fetch", url, str(version),
                                 str(work / f"cache-{h}"), str(go), str(out), str(int(verify))],
                             log=work / f"fetch-{h}.log",
                             cwd=REPO, env={"PYTHONPATH": str(REPO)})
    time.sleep(3.0)  # interpreters started and waiting on the start file
    os.sync()
    go.write_text("go")
    results = {}
    for h, p in procs.items():
        if p.wait(900) != 0:
            raise RuntimeError(f"fetch on {h} failed: {(work / f'fetch-{h}.log').read_text()[-3000:]}")
        results[h] = json.loads((work / f"fetch-{h}.json").read_text())
    start = min(r["start"] for r in results.values())
    total = max(r["end"] for r in results.values()) - start
    for h in hosts:
        shutil.rmtree(work / f"cache-{h}", ignore_errors=True)
    return total, {h: r["end"] - r["start"] for h, r in results.items()}


async def _publish(url: str, gib: float, root: Path) -> tuple[int, list[Path]]:
    from bench.weight_sync import TOKEN, make_state_dict
    from shared.config import WeightStoreConfig
    from weight_store.client import WeightStoreClient

    client = WeightStoreClient(WeightStoreConfig(url=url, root=str(root), shared_fs=False, token=TOKEN))
    wv = await client.publish("bench", 0, make_state_dict(gib), step=0)
    vdir = root / "bench" / str(wv.version)
    return wv.version, [vdir / f["name"] for f in wv.files]


def run(gib: float, work_dir: str | None = None) -> float:
    from bench.weight_sync import start_service_argv, wait_http
    from multihost.netns import HostNet

    work = Path(tempfile.mkdtemp(prefix="jetrl-bench-fanout-", dir=work_dir))
    workers = ["w1", "w2", "w3", "w4"]
    try:
        with HostNet(["store", *workers]) as net:
            root, port = work / "store", 8700
            net.spawn("store", start_service_argv(root, port, net.addr("store")), log=work / "store.log")
            url = f"http://{net.addr('store')}:{port}"
            wait_http(url + "/healthz", 60, work / "store.log")
            version, files = asyncio.run(_publish(url, gib, root))
            nbytes = sum(f.stat().st_size for f in files)
            print(f"version of {nbytes / 2**30:.3f} GiB in {len(files)} files on host store {net.addr('store')}; "
                  f"workers {', '.join(f'{w} {net.addr(w)}' for w in workers)}")
            cp1, _ = _cp_parallel(files, [work / "cp-0"])
            cp4, cp4_each = _cp_parallel(files, [work / f"cp-{i}" for i in range(4)])
            f1, f1_each = _fetch_on_hosts(net, workers[:1], url, version, work)
            f4, f4_each = _fetch_on_hosts(net, workers, url, version, work)
            f4n, f4n_each = _fetch_on_hosts(net, workers, url, version, work, verify=False)
        gb = nbytes / 1e9
        print(f"1 cp            {cp1:7.3f} s  {gb / cp1:5.2f} GB/s")
        print(f"4 parallel cp   {cp4:7.3f} s  {4 * gb / cp4:5.2f} GB/s in all; each "
              + ", ".join(f"{t:.2f}" for t in cp4_each) + " s")
        print(f"1 host fetch    {f1:7.3f} s  {gb / f1:5.2f} GB/s ({', '.join(f'{h} {t:.2f} s' for h, t in f1_each.items())})")
        print(f"4 hosts fetch   {f4:7.3f} s  {4 * gb / f4:5.2f} GB/s in all; "
              + ", ".join(f"{h} {t:.2f} s" for h, t in f4_each.items()))
        print(f"4 hosts, no sha256 {f4n:7.3f} s  {4 * gb / f4n:5.2f} GB/s in all (weights.verify_sha256=false); "
              + ", ".join(f"{h} {t:.2f} s" for h, t in f4n_each.items()))
        print(f"weight_fanout_ratio_1: {f1 / cp1:.2f} (1 host fetch / 1 cp)")
        print(f"weight_fanout_ratio_no_sha256: {f4n / cp4:.2f} (4 hosts without the sha256 check / 4 parallel cp)")
        ratio = f4 / cp4
        print(f"weight_fanout_ratio: {ratio:.2f} (target <= 1.5)")
        return ratio
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _fetch_one(url: str, version: int, cache: str, go: str, out: str, verify: bool) -> None:
    from bench.weight_sync import TOKEN
    from shared.config import WeightStoreConfig
    from weight_store.client import WeightStoreClient

    client = WeightStoreClient(WeightStoreConfig(url=url, shared_fs=False, cache_dir=cache, verify_sha256=verify,
                                                 token=TOKEN))
    while not Path(go).exists():
        await asyncio.sleep(0.005)
    start = time.time()
    path = await client.fetch("bench", version)
    end = time.time()
    assert path.is_relative_to(cache)
    Path(out).write_text(json.dumps({"start": start, "end": end}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["fetch"]:
        url, version, cache, go, out, verify = sys.argv[2:8]
        asyncio.run(_fetch_one(url, int(version), cache, go, out, verify == "1"))
    else:
        run(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
