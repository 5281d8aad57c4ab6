"""Hosts as network namespaces on a private bridge (multihost/netns.py). Where namespaces cannot be made
(not root, a sandbox without CAP_NET_ADMIN) the tests skip with the reason, except under CI=true, where
the machine can make them and a failure to do so is a failure."""

from __future__ import annotations

import pytest
from multihost_helpers import need_netns

from multihost.netns import HostNet


@pytest.fixture
def hostnet():
    """A factory: hostnet(["a", "b"]) -> a created HostNet; every one is torn down after the test, also when
    it fails (its processes killed, namespaces and veths deleted)."""
    need_netns()
    made: list[HostNet] = []

    def make(names) -> HostNet:
        net = HostNet(names)
        made.append(net)
        return net.create()

    yield make
    for net in made:
        net.close()
