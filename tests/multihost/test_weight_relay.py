"""Relay fan-out across namespace hosts (weight_store/relay.py): the weight store on one host, six hosts
fetching one version with `jetrl weights fetch` and `weights.fanout=relay`, every host's link limited to
200 Mbit/s with tc so that a transfer takes seconds and the links, not the two cores, are the limit.
Clean: every host ends with the store's exact bytes and the store sent less than two copies. Then a
relay SIGKILLed mid-transfer, a relay that serves corrupted pieces, and a host whose link is cut for
10 s: every other host (and the cut one, once back) still ends with the exact bytes."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
import urllib.request
from pathlib import Path

import pytest

RATE_MBIT = 200
HOSTS = [f"h{i}" for i in range(1, 7)]
LIAR = r"""
import socket, sys, json, urllib.request
s = socket.socket(); s.bind((sys.argv[1], 8800)); s.listen(64)
req = urllib.request.Request(sys.argv[2], data=json.dumps({"peer": f"http://{sys.argv[1]}:8800"}).encode(),
                             headers={"Content-Type": "application/json"}, method="POST")
print(urllib.request.urlopen(req, timeout=10).read().decode(), flush=True)
while True:
    c, _ = s.accept()
    c.recv(65536)
    body = b"\0" * 65536
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    c.close()
"""


def _jetrl(*args: str) -> list[str]:
    return [sys.executable, "-c", "from launcher.cli import main; main()", *args]


def _metric(url: str, name: str) -> float:
    for line in urllib.request.urlopen(url + "/metrics", timeout=10).read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(name)


@pytest.fixture
def relay_net(hostnet, tmp_path):
    """(net, store url, publish(version) -> manifest, fetch(hosts, version, **overrides) -> procs)."""
    net = hostnet(["store", *HOSTS])
    for h in ["store", *HOSTS]:
        net.limit(h, RATE_MBIT)
    addr = net.addr("store")
    url = f"http://{addr}:8700"
    root = tmp_path / "root"
    store = net.spawn("store", _jetrl("weights", "serve", "weights.insecure_no_auth=true", f"weights.host={addr}",
                                      "weights.port=8700", f"weights.root={root}", "weights.piece_kb=1024",
                                      "weights.keep_last=10"), log=tmp_path / "store.log")
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2)
            break
        except OSError:
            assert store.poll() is None and time.monotonic() < deadline, (tmp_path / "store.log").read_text()[-2000:]
            time.sleep(0.2)

    def publish(version: int) -> dict:
        import asyncio

        import torch

        from shared.config import WeightStoreConfig
        from weight_store.client import WeightStoreClient

        g = torch.Generator().manual_seed(version)
        sd = {f"w{i}": torch.randn(1024, 4096, generator=g).to(torch.bfloat16) for i in range(6)}  # 48 MiB
        cfg = WeightStoreConfig(url=url, insecure_no_auth=True, shared_fs=False)
        asyncio.run(WeightStoreClient(cfg).publish("relay", version, sd))
        return json.loads((root / "relay" / str(version) / "manifest.json").read_text())

    def fetch(hosts, version: int, *extra: str):
        procs = {}
        for h in hosts:
            procs[h] = net.spawn(h, _jetrl("weights", "fetch", str(version), "--serve-s", "25", "run=relay",
                                           f"weights.url={url}", "weights.insecure_no_auth=true",
                                           "weights.shared_fs=false", "weights.fanout=relay", "weights.relay_min_mb=0",
                                           f"weights.cache_dir={tmp_path / 'cache' / h}",
                                           "weights.relay_timeout_s=3", "weights.timeout_s=5", "weights.retries=6",
                                           *extra), log=tmp_path / f"{h}-{version}.log")
        return procs

    return net, url, publish, fetch, tmp_path


def _wait_fetched(tmp_path: Path, hosts, version: int, timeout: float = 120) -> dict[str, dict]:
    """Each host's first output line (its fetch result), once all have one."""
    deadline, out = time.monotonic() + timeout, {}
    while time.monotonic() < deadline and len(out) < len(hosts):
        for h in hosts:
            log = tmp_path / f"{h}-{version}.log"
            if h not in out and log.exists():
                for line in log.read_text().splitlines():
                    if line.startswith('{"run"'):
                        out[h] = json.loads(line)
        time.sleep(0.2)
    missing = [h for h in hosts if h not in out]
    assert not missing, {h: (tmp_path / f"{h}-{version}.log").read_text()[-1500:] for h in missing}
    return out


def _exact(res: dict, manifest: dict) -> None:
    for f in manifest["files"]:
        assert hashlib.sha256((Path(res["path"]) / f["name"]).read_bytes()).hexdigest() == f["sha256"], f["name"]


def test_six_hosts_fetch_through_relays_and_the_store_sends_under_two_copies(relay_net):
    net, url, publish, fetch, tmp = relay_net
    manifest = publish(0)
    size = sum(f["size"] for f in manifest["files"])
    before = _metric(url, "jetrl_weights_bytes_out_total")
    t0 = time.monotonic()
    fetch(HOSTS, 0)
    res = _wait_fetched(tmp, HOSTS, 0)
    took = time.monotonic() - t0
    for h in HOSTS:
        _exact(res[h], manifest)
    served = _metric(url, "jetrl_weights_bytes_out_total") - before
    assert served < 2 * size, (served, size)
    assert sum(r["pieces_from_peers"] for r in res.values()) >= 4 * len(manifest["files"]) * 8
    # the star would need 6 copies through the store's 200 Mbit/s link (~12 s); the chain about one
    print(f"6 hosts, {size / 2**20:.0f} MiB at {RATE_MBIT} Mbit/s: {took:.1f} s, store sent {served / size:.2f} copies")


def test_a_relay_killed_mid_transfer_and_a_lying_relay_leave_every_other_host_exact(relay_net):
    net, url, publish, fetch, tmp = relay_net
    manifest = publish(1)
    liar = net.spawn("h6", [sys.executable, "-c", LIAR, net.addr("h6"), f"{url}/v1/runs/relay/versions/1/relay"],
                     log=tmp / "liar.log")
    deadline = time.monotonic() + 30
    while "upstream" not in ((tmp / "liar.log").read_text() if (tmp / "liar.log").exists() else ""):
        assert liar.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    honest = HOSTS[:5]
    procs = fetch(honest, 1)
    part = tmp / "cache" / "h2" / "relay" / ".1.partial"
    deadline = time.monotonic() + 60
    while not (part.is_dir() and any(part.iterdir())):  # h2 is taking pieces: kill it mid-transfer
        assert time.monotonic() < deadline, (tmp / "h2-1.log").read_text()[-1500:]
        time.sleep(0.05)
    time.sleep(0.5)
    procs["h2"].kill()  # SIGKILL: a relay dies mid-transfer, its downstream must go elsewhere
    rest = [h for h in honest if h != "h2"]
    res = _wait_fetched(tmp, rest, 1)
    for h in rest:
        _exact(res[h], manifest)
    assert sum(r["peer_failures"] for r in res.values()) >= 1  # the liar (and the dead relay) were reported


def test_a_host_whose_link_is_cut_for_10_s_still_ends_exact_and_so_do_the_others(relay_net):
    net, url, publish, fetch, tmp = relay_net
    manifest = publish(2)
    fetch(HOSTS, 2)
    part = tmp / "cache" / "h3" / "relay" / ".2.partial"
    deadline = time.monotonic() + 60
    while not (part.is_dir() and any(part.iterdir())):  # h3 is taking pieces: cut it mid-transfer
        assert time.monotonic() < deadline, (tmp / "h3-2.log").read_text()[-1500:]
        time.sleep(0.05)
    net.cut("h3")
    time.sleep(10)
    net.restore("h3")
    res = _wait_fetched(tmp, HOSTS, 2, timeout=180)
    for h in HOSTS:
        _exact(res[h], manifest)
    shutil.rmtree(tmp / "cache", ignore_errors=True)
