"""Shared by the multi-host tests: skip (or, under CI=true, fail) where network namespaces cannot be made."""

from __future__ import annotations

import os

import pytest

from multihost.netns import available


def need_netns() -> None:
    ok, why = available()
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must be able to make network namespaces: {why}")
        pytest.skip(f"cannot make network namespaces here: {why}")
