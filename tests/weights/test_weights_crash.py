"""SIGKILL of `jetrl weights serve` in the middle of an upload: no partial version is ever visible,
and a restarted service cleans the leftovers and serves the previous version."""

from __future__ import annotations

import socket
import time

import torch
from weights_helpers import ProcServer, state_dict, store_config

from weight_store import transfer
from weight_store.client import WeightStoreClient, load_state_dict


async def test_sigkill_during_an_upload_leaves_no_partial_version_and_a_restart_serves_the_last(tmp_path):
    root = tmp_path / "root"
    cfg = store_config(root, token="t")
    srv = ProcServer(cfg).start()
    try:
        client = WeightStoreClient(cfg)
        sd0 = state_dict(n=2, seed=0)
        await client.publish("crash", 0, sd0, step=0)
        # version 1: one file fully uploaded, a second one half sent when the service dies
        first = b"{}"
        transfer.put_stream(transfer.file_url(cfg.url, "crash", 1, "config.json"), lambda: [first], len(first),
                            {"Authorization": "Bearer t"}, timeout=30)
        body = b"\x01" * (32 << 20)
        s = socket.create_connection(("127.0.0.1", cfg.port))
        s.sendall((f"PUT /v1/runs/crash/versions/1/files/model.safetensors HTTP/1.1\r\nHost: x\r\n"
                   f"Authorization: Bearer t\r\nContent-Length: {len(body)}\r\n\r\n").encode())
        s.sendall(body[: 20 << 20])  # more than one 8 MiB write buffer of the service
        staging = root / ".staging" / "crash" / "1"
        deadline = time.monotonic() + 30
        while not any(p.suffix == ".part" and p.stat().st_size > 0 for p in staging.glob(".*.part")):
            assert time.monotonic() < deadline, "the upload never reached the disk"
            time.sleep(0.02)
        assert len(list((staging / ".files").glob("*.json"))) == 1  # one file of version 1 was complete
        srv.kill()
        s.close()
        assert sorted(p.name for p in (root / "crash").iterdir()) == ["0"]  # no version 1, not even partly
        srv.start()  # same root and port
        assert not any((root / ".staging").iterdir())  # leftovers removed at start-up
        assert await client.versions("crash") == [0]
        assert (await client.latest("crash"))["version"] == 0
        got = load_state_dict(await client.fetch("crash", 0))
        assert all(torch.equal(got[k], sd0[k]) for k in sd0)
        # and the run goes on: version 1 can be published after the crash
        await client.publish("crash", 1, state_dict(n=2, seed=1), step=1)
        assert await client.versions("crash") == [0, 1]
    finally:
        srv.stop()
