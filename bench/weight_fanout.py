"""Weight fan-out across namespace hosts whose links, not the two cores, are the limit (issue 32): the
weight store on one host, N worker hosts fetching one version at once, every host's sending rate limited
with tc (`HostNet.limit`, a token bucket on its eth0). The physical limit is the time one link needs to
carry the version once, S/B; the star (`weights.fanout=store`: every worker downloads from the store)
needs about N x S/B, since the store's link carries N copies; the relay chain
(`weights.fanout=relay`, weight_store/relay.py) about S/B plus N pieces.

    python bench/weight_fanout.py [--gib 0.25] [--mbit 400] [--hosts 1,4,8,16] [--piece-mb 1]
    python -m bench.weight_sync --cross-host      # the same

For each N and each mode (store, relay), the fetchers start their interpreters first and wait on a start
file; the time is from the start to the last host's verified copy. Prints, per run, time / (S/B), the
copies the store sent, and the machine's CPU busy share over the run (/proc/stat, both cores: a run
near 100 % is CPU-bound, not link-bound, and says so). Last line `weight_fanout_ratio: X`, time / (S/B)
at N = 8 with the default fan-out (relay). Needs root (namespaces, tc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]
    return sum(f) - idle, sum(f)


def _bytes_out(url: str) -> float:
    from bench.weights_common import TOKEN

    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    for line in urllib.request.urlopen(req, timeout=10).read().decode().splitlines():
        if line.startswith("jetrl_weights_bytes_out_total "):
            return float(line.split()[1])
    raise RuntimeError("no jetrl_weights_bytes_out_total")


def _round(net, hosts: list[str], url: str, version: int, work: Path, fanout: str) -> dict:
    """Every host fetches `version` at once; the time from the start file to the last verified copy."""
    go, done = work / "go", work / "done"
    for p in (go, done):
        p.unlink(missing_ok=True)
    procs = {}
    for h in hosts:
        out = work / f"fetch-{h}.json"
        out.unlink(missing_ok=True)
        Path(f"{out}.ready").unlink(missing_ok=True)
        procs[h] = net.spawn(h, [sys.executable, "-m", "bench.weight_fanout", "fetch", url, str(version),
                                 str(work / f"cache-{h}"), str(go), str(done), str(out), fanout],
                             log=work / f"fetch-{h}.log", cwd=REPO, env={"PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 300
    while not all((work / f"fetch-{h}.json.ready").exists() for h in hosts):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
            raise RuntimeError("fetchers did not get ready: " + " | ".join(
                (work / f"fetch-{h}.log").read_text()[-800:] for h in hosts if (work / f"fetch-{h}.log").exists()))
        time.sleep(0.05)
    time.sleep(0.5)
    before, cpu0 = _bytes_out(url), _cpu()
    go.write_text("go")
    deadline = time.monotonic() + 1800
    while not all((work / f"fetch-{h}.json").exists() for h in hosts):
        bad = [h for h, p in procs.items() if p.poll() is not None and not (work / f"fetch-{h}.json").exists()]
        if bad or time.monotonic() > deadline:
            raise RuntimeError(f"fetch on {bad} failed: {(work / f'fetch-{bad[0]}.log').read_text()[-3000:]}"
                               if bad else "fetchers timed out")
        time.sleep(0.05)
    cpu1 = _cpu()
    served = _bytes_out(url) - before
    done.write_text("done")
    results = {h: json.loads((work / f"fetch-{h}.json").read_text()) for h in hosts}
    for p in procs.values():
        p.wait(60)
    for h in hosts:
        shutil.rmtree(work / f"cache-{h}", ignore_errors=True)
    start = min(r["start"] for r in results.values())
    return {"seconds": max(r["end"] for r in results.values()) - start, "served": served,
            "cpu_busy": (cpu1[0] - cpu0[0]) / max(1, cpu1[1] - cpu0[1]),
            "done_s": sorted(round(r["end"] - start, 2) for r in results.values()),
            "peer_failures": sum(r.get("peer_failures", 0) for r in results.values())}


async def _publish(url: str, gib: float) -> tuple[int, int]:
    from bench.weights_common import TOKEN, make_state_dict
    from shared.config import WeightStoreConfig
    from weight_store.client import WeightStoreClient

    client = WeightStoreClient(WeightStoreConfig(url=url, shared_fs=False, token=TOKEN))
    wv = await client.publish("bench", 0, make_state_dict(gib), step=0)
    return wv.version, sum(f["size"] for f in wv.files)


def run(gib: float = 0.25, mbit: float = 400, hosts_n: tuple[int, ...] = (1, 4, 8, 16), piece_kb: int = 256,
        work_dir: str | None = None, modes: tuple[str, ...] = ("store", "relay")) -> float:
    from bench.weights_common import start_service_argv, wait_http
    from multihost.netns import HostNet

    work = Path(tempfile.mkdtemp(prefix="jetrl-bench-fanout-", dir=work_dir))
    workers = [f"w{i}" for i in range(1, max(hosts_n) + 1)]
    rows: dict[tuple[int, str], dict] = {}
    try:
        with HostNet(["store", *workers]) as net:
            for h in ["store", *workers]:
                net.limit(h, mbit)
            port = 8700
            net.spawn("store", [*start_service_argv(work / "store", port, net.addr("store")),
                                f"weights.piece_kb={piece_kb}"], log=work / "store.log")
            url = f"http://{net.addr('store')}:{port}"
            wait_http(url + "/healthz", 60, work / "store.log")
            version, nbytes = asyncio.run(_publish(url, gib))
            ideal = nbytes * 8 / (mbit * 1e6)
            print(f"version of {nbytes / 2**30:.3f} GiB; every host sends at most {mbit:g} Mbit/s (tc tbf); "
                  f"S/B = {ideal:.2f} s; pieces of {piece_kb} KiB", flush=True)
            for n in hosts_n:
                for mode in modes:
                    r = _round(net, workers[:n], url, version, work, mode)
                    rows[(n, mode)] = r
                    print(f"N={n:3d} {mode:6s} {r['seconds']:7.2f} s = {r['seconds'] / ideal:5.2f} x S/B; the store "
                          f"sent {r['served'] / nbytes:5.2f} copies; CPU busy {100 * r['cpu_busy']:3.0f} %; hosts done at "
                          f"{r['done_s']} s; peer failures {r['peer_failures']}", flush=True)
        for n in hosts_n:
            line = f"weight_fanout_ratio_{n}:"
            for mode in modes:
                line += f" {mode} {rows[(n, mode)]['seconds'] / ideal:.2f}"
            print(line)
        key = (8, "relay") if (8, "relay") in rows else max(rows)
        ratio = rows[key]["seconds"] / ideal
        print(f"weight_fanout_ratio: {ratio:.2f}")
        return ratio
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _fetch_one(url: str, version: int, cache: str, go: str, done: str, out: str, fanout: str) -> None:
    """One worker host: wait for the start file, fetch, record the times; a relay keeps serving until `done`."""
    from bench.weights_common import TOKEN
    from shared.config import WeightStoreConfig
    from weight_store.client import WeightStoreClient

    client = WeightStoreClient(WeightStoreConfig(url=url, shared_fs=False, cache_dir=cache, token=TOKEN,
                                                 fanout=fanout, relay_timeout_s=10.0))
    if fanout == "relay":
        from weight_store.relay import RelayNode

        client.relay = RelayNode(client.cfg)
        await client.relay.start()
    Path(f"{out}.ready").write_text("ready")
    while not Path(go).exists():
        await asyncio.sleep(0.005)
    start = time.time()
    path = await client.fetch("bench", version)
    end = time.time()
    assert path.is_relative_to(cache)
    stats = dict(client.relay.stats) if client.relay else {}
    Path(out).write_text(json.dumps({"start": start, "end": end, **stats}))
    while not Path(done).exists():
        await asyncio.sleep(0.05)
    await client.close()


def main() -> None:
    if sys.argv[1:2] == ["fetch"]:
        url, version, cache, go, done, out, fanout = sys.argv[2:9]
        asyncio.run(_fetch_one(url, int(version), cache, go, done, out, fanout))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=0.25, help="Size of the version (bf16 matrices).")
    ap.add_argument("--mbit", type=float, default=400, help="Every host's sending rate (Mbit/s).")
    ap.add_argument("--hosts", default="1,4,8,16", help="Numbers of worker hosts.")
    ap.add_argument("--piece-kb", type=int, default=256, help="The store's weights.piece_kb.")
    ap.add_argument("--modes", default="store,relay")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    run(a.gib, a.mbit, tuple(int(x) for x in a.hosts.split(",")), a.piece_kb, a.dir, tuple(a.modes.split(",")))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
