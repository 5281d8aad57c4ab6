"""Cross-host weight fan-out (`python -m bench.weight_sync --cross-host`): a version of --gib GiB
in the weight store on one namespace host (multihost/netns.py), fetched over HTTP across the bridge by 1
and then by 4 worker hosts at once, against 1 and 4 parallel `cp` of the same files on one host; the
4-host fetch with the default digest (xxh3_128), with sha256 and with none. `--repeats` rounds, the
modes interleaved; prints each round's totals (first start to last finish) and the medians; last line
`weight_fanout_ratio: X` = median 4-host fan-out (defaults) / median 4 parallel cp (target <= 1.5).
Needs root.

All hosts share this machine's disk, cores and page cache: the bridge removes loopback's shortcuts (each
byte crosses two veth pairs and a bridge), not the shared hardware; on real hosts each fetcher has its
own disk and NIC while the store's NIC is shared.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
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
                    digest: str = "default") -> tuple[float, dict[str, float]]:
    """Every host fetches `version` at once (a start file releases them together); (total, per host)."""
    go = work / "go"
    go.unlink(missing_ok=True)
    procs = {}
    for h in hosts:
        out = work / f"fetch-{h}.json"
        out.unlink(missing_ok=True)
        Path(f"{out}.ready").unlink(missing_ok=True)
        procs[h] = net.spawn(h, [sys.executable, "-m", "bench.weight_fanout", "fetch", url, str(version),
                                 str(work / f"cache-{h}"), str(go), str(out), digest],
                             log=work / f"fetch-{h}.log",
                             cwd=REPO, env={"PYTHONPATH": str(REPO)})
    # Every fetcher has imported what it needs and waits on the start file (a fixed 3 s sleep here let
    # the first 4-host round start while interpreters were still importing on the 2 cores).
    deadline = time.monotonic() + 300
    while not all((work / f"fetch-{h}.json.ready").exists() for h in hosts):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
            raise RuntimeError("fetchers did not get ready: " + " | ".join(
                (work / f"fetch-{h}.log").read_text()[-500:] for h in hosts if (work / f"fetch-{h}.log").exists()))
        time.sleep(0.05)
    time.sleep(0.5)
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
    from bench.weights_common import TOKEN, make_state_dict
    from shared.config import WeightStoreConfig
    from weight_store.client import WeightStoreClient

    client = WeightStoreClient(WeightStoreConfig(url=url, root=str(root), shared_fs=False, token=TOKEN))
    wv = await client.publish("bench", 0, make_state_dict(gib), step=0)
    vdir = root / "bench" / str(wv.version)
    return wv.version, [vdir / f["name"] for f in wv.files]


def run(gib: float, work_dir: str | None = None, repeats: int = 3) -> float:
    from bench.weights_common import start_service_argv, wait_http
    from multihost.netns import HostNet

    work = Path(tempfile.mkdtemp(prefix="jetrl-bench-fanout-", dir=work_dir))
    workers = ["w1", "w2", "w3", "w4"]
    modes = {"4 parallel cp": None, "4 hosts fetch": "default", "4 hosts, sha256": "sha256",
             "4 hosts, no digest": "off"}
    times: dict[str, list[float]] = {m: [] for m in ["1 cp", "1 host fetch", *modes]}
    try:
        with HostNet(["store", *workers]) as net:
            root, port = work / "store", 8700
            net.spawn("store", start_service_argv(root, port, net.addr("store")), log=work / "store.log")
            url = f"http://{net.addr('store')}:{port}"
            wait_http(url + "/healthz", 60, work / "store.log")
            version, files = asyncio.run(_publish(url, gib, root))
            nbytes = sum(f.stat().st_size for f in files)
            print(f"version of {nbytes / 2**30:.3f} GiB in {len(files)} files on host store {net.addr('store')}; "
                  f"workers {', '.join(f'{w} {net.addr(w)}' for w in workers)}; {repeats} rounds, the modes "
                  "interleaved and turned one place each round (the first 4-host run of a round was ~1 s "
                  "slower whatever it checked)", flush=True)
            order = list(modes)
            for r in range(max(1, repeats)):
                times["1 cp"].append(_cp_parallel(files, [work / "cp-0"])[0])
                times["1 host fetch"].append(_fetch_on_hosts(net, workers[:1], url, version, work)[0])
                for m in order:
                    if modes[m] is None:
                        t = _cp_parallel(files, [work / f"cp-{i}" for i in range(4)])[0]
                    else:
                        t = _fetch_on_hosts(net, workers, url, version, work, digest=modes[m])[0]
                    times[m].append(t)
                print(f"round {r + 1}: " + ", ".join(f"{m} {times[m][-1]:.2f} s" for m in times), flush=True)
                order = order[1:] + order[:1]
        gb = nbytes / 1e9
        med = {m: statistics.median(ts) for m, ts in times.items()}
        for m, t in med.items():
            n = 1 if m.startswith("1 ") else 4
            print(f"{m:20s} median {t:7.3f} s  {n * gb / t:5.2f} GB/s in all  (rounds: "
                  + ", ".join(f"{x:.2f}" for x in times[m]) + ")")
        print(f"weight_fanout_ratio_1: {med['1 host fetch'] / med['1 cp']:.2f} (1 host fetch / 1 cp)")
        print(f"weight_fanout_ratio_sha256: {med['4 hosts, sha256'] / med['4 parallel cp']:.2f} "
              "(4 hosts checking sha256 / 4 parallel cp)")
        print(f"weight_fanout_ratio_no_digest: {med['4 hosts, no digest'] / med['4 parallel cp']:.2f} "
              "(4 hosts checking no digest / 4 parallel cp)")
        ratio = med["4 hosts fetch"] / med["4 parallel cp"]
        print(f"weight_fanout_ratio: {ratio:.2f} (the defaults: xxh3_128 checked; medians; target <= 1.5)")
        return ratio
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _fetch_one(url: str, version: int, cache: str, go: str, out: str, digest: str) -> None:
    """One worker host's fetch; `digest`: default (the config's defaults), sha256, or off (no check)."""
    from bench.weights_common import TOKEN
    from shared.config import WeightStoreConfig
    from weight_store.client import WeightStoreClient

    how = {"default": {}, "sha256": {"digest": "sha256"}, "off": {"verify_sha256": False}}[digest]
    client = WeightStoreClient(WeightStoreConfig(url=url, shared_fs=False, cache_dir=cache, token=TOKEN, **how))
    Path(f"{out}.ready").write_text("ready")
    while not Path(go).exists():
        await asyncio.sleep(0.005)
    start = time.time()
    path = await client.fetch("bench", version)
    end = time.time()
    assert path.is_relative_to(cache)
    Path(out).write_text(json.dumps({"start": start, "end": end}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["fetch"]:
        url, version, cache, go, out, digest = sys.argv[2:8]
        asyncio.run(_fetch_one(url, int(version), cache, go, out, digest))
    else:
        run(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
