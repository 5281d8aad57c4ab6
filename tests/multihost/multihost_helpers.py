"""Shared by the multi-host tests: skip (or, under CI=true, fail) where network namespaces cannot be made."""

from __future__ import annotations

from ci_gate import unavailable

from multihost.netns import available


def need_netns() -> None:
    ok, why = available()
    if not ok:
        unavailable(f"network namespaces cannot be made here: {why}")
