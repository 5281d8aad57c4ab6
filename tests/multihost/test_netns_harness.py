"""The harness itself: hosts reach each other and the runner across the bridge, a cut link stops
traffic until restored, kill_all leaves nothing running, and close() removes every namespace and veth."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import pytest

from multihost.netns import HostNet

FETCH = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=2).status)"


def _fetch(net, host: str, url: str) -> subprocess.CompletedProcess:
    return net.run(host, [sys.executable, "-c", FETCH, url], timeout=30)


def _ours(prefix: str) -> list[str]:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line for line in (ns + links).splitlines() if prefix in line]


def test_hosts_talk_across_the_bridge_and_a_cut_link_stops_traffic_until_restored(hostnet):
    net = hostnet(["a", "b"])
    assert net.addr("a") != net.addr("b")
    server = net.spawn("a", [sys.executable, "-m", "http.server", "--bind", net.addr("a"), "8080"])
    url = f"http://{net.addr('a')}:8080/"
    for _ in range(50):  # until it listens
        if _fetch(net, "b", url).stdout.strip() == "200":
            break
    assert _fetch(net, "b", url).stdout.strip() == "200"
    assert urllib.request.urlopen(url, timeout=5).status == 200  # the runner reaches every host too
    # host a cannot see b's loopback: separate network stacks
    assert net.run("a", ["ip", "-4", "-o", "addr"]).stdout.count("inet ") == 2  # lo + eth0
    net.cut("a")
    r = _fetch(net, "b", url)
    assert r.returncode != 0 and "timed out" in r.stderr
    net.restore("a")
    assert _fetch(net, "b", url).stdout.strip() == "200"
    assert server.poll() is None  # the cut did not kill it
    killed = net.kill_all("a")
    assert server.pid in killed and server.poll() is not None and net.pids("a") == []
    c = net.add_host("c")  # a host added later joins the same bridge
    assert _fetch(net, "c", url).returncode != 0  # a's server is gone
    assert c.addr.startswith(net.addr("a").rsplit(".", 1)[0])


def test_close_removes_every_namespace_and_veth_also_after_a_failure(hostnet):
    net = hostnet(["x"])
    net.spawn("x", ["sleep", "300"])
    prefix = net.prefix
    assert _ours(prefix)
    with pytest.raises(ValueError, match="host name"):
        net.add_host("Bad_Name!")
    net.close()
    assert _ours(prefix) == []
    net.close()  # twice is fine


def test_a_context_manager_cleans_up_when_the_body_raises(hostnet):
    hostnet([])  # skips / fails like the others where namespaces cannot be made
    with pytest.raises(RuntimeError, match="boom"), HostNet(["p", "q"]) as net:
        prefix = net.prefix
        net.spawn("p", ["sleep", "300"])
        raise RuntimeError("boom")
    assert _ours(prefix) == []


def test_sweep_removes_the_hosts_of_a_harness_whose_owner_died(hostnet):
    from multihost.netns import sweep

    hostnet([])  # skips / fails like the others where namespaces cannot be made
    dead = 4_000_000 + 7  # above pid_max: no such process
    ns, dev = f"jrl{dead}x1-a", f"jrl{dead}x1"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", dev, "type", "veth", "peer", "name", f"{dev}p"], check=True)
    removed = sweep()
    assert ns in removed and dev in removed and _ours(f"jrl{dead}x1") == []
