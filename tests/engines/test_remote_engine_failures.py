"""Remote engines (vLLM, SGLang clients) when the world moves under them: a version dir deleted by the
weight store's retention right after the swap starts, a started inference server that exits (the
worker side of that: tests/rollout/test_rollout_service.py), and generate requests whose connection is
dropped on the way (sent again up to `connection_retries` times)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys

import httpx
import pytest
from engines_helpers import TINY, engine_config
from engines_sglang_standin import StandinServer

from rollout_service.engines import make_engine
from rollout_service.engines.base import EngineDead, GenerateRequest, SamplingParams
from rollout_service.engines.remote import CONNECTION_ERRORS
from rollout_service.engines.vllm import VllmEngine
from shared.config import JetrlConfig
from shared.runtime.natsd import free_port


async def test_the_server_loads_a_private_snapshot_so_retention_cannot_delete_it_mid_swap(tiny_dirs, tmp_path):
    cfg = JetrlConfig.model_validate({"model": {**TINY, "path": str(tiny_dirs[0]), "dtype": "float32"}})
    server = StandinServer(cfg, free_port()).start()
    loaded: list[str] = []
    real_update = server.engine.update_weights

    async def update_and_record(version, path=None, state_dict=None):
        loaded.append(path)
        await real_update(version, path=path, state_dict=state_dict)

    server.engine.update_weights = update_and_record
    store_dir = tmp_path / "store" / "run" / "1"
    shutil.copytree(tiny_dirs[1], store_dir)
    eng = make_engine(engine_config(engine="sglang", sglang={"url": server.url, "weights_dir": str(tmp_path / "w")}))
    try:
        await eng.start()
        original = eng._load_weights

        async def retention_strikes_then_load(version, path):
            shutil.rmtree(store_dir)  # the store keeps the newest K versions: this one just went
            await original(version, path)

        eng._load_weights = retention_strikes_then_load
        await eng.update_weights(1, path=str(store_dir))
        assert eng.version == 1 and server.engine.version == 1
        assert loaded and loaded[0] != str(store_dir)
        assert not list((tmp_path / "w").iterdir())  # the snapshot is removed once the server loaded it
    finally:
        await eng.close()
        server.stop()


async def test_a_vllm_engine_whose_started_server_exited_raises_engine_dead():
    eng = VllmEngine(JetrlConfig.model_validate({"rollout": {"vllm": {"url": f"http://127.0.0.1:{free_port()}", "model": "m"}}}))
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exited.wait()
    eng.server = type("Server", (), {"proc": exited})()  # what VllmServer holds: the exited process
    await eng.start()
    try:
        with pytest.raises(EngineDead, match="exited with 3"):
            await eng.generate(GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=2)))
    finally:
        eng.server = None
        await eng.close()


class DroppingProxy:
    """A TCP proxy on loopback in front of `target_port` that closes the first `drop` connections whose request
    line names `path`, without an answer (what a reset link or a restarted load balancer looks like to a
    client); every other connection is piped through."""

    def __init__(self, target_port: int, path: bytes, drop: int):
        self.target_port, self.path, self.drop = target_port, path, drop
        self.dropped, self.forwarded = 0, []
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        if self.path in line and self.dropped < self.drop:
            self.dropped += 1
            writer.close()
            return
        self.forwarded.append(line.split()[1].decode() if line else "")
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        up_w.write(line)

        async def pipe(r, w):
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            finally:
                w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer), return_exceptions=True)

    async def close(self) -> None:
        self.server.close()


@pytest.mark.parametrize(("drop", "retries", "succeeds"), [(2, 2, True), (3, 2, False), (1, 0, False)])
async def test_a_generate_whose_connection_drops_is_sent_again_up_to_connection_retries(tiny_dirs, drop, retries,
                                                                                       succeeds):
    cfg = JetrlConfig.model_validate({"model": {**TINY, "path": str(tiny_dirs[0]), "dtype": "float32"}})
    server = StandinServer(cfg, free_port()).start()
    proxy = DroppingProxy(server.port, b"/generate", drop)
    url = await proxy.start()
    eng = make_engine(engine_config(engine="sglang", sglang={"url": url, "connection_retries": retries}))
    try:
        await eng.start()
        # one connection per request, so that the proxy sees every request's first line
        await eng._client.aclose()
        eng._client = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
        req = GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=4, temperature=0.0))
        if succeeds:
            res = await eng.generate(req)
            assert len(res.output_ids) == 4 and res.versions == [0] * 4
            assert eng.stats()["connection_retries"] == drop
            # each lost segment was aborted on the server before it was sent again
            assert proxy.forwarded.count("/abort_request") == drop and proxy.forwarded.count("/generate") == 1
        else:
            with pytest.raises(CONNECTION_ERRORS):
                await eng.generate(req)
            assert eng.stats()["connection_retries"] == retries
        assert proxy.dropped == min(drop, retries + 1)
    finally:
        await eng.close()
        await proxy.close()
        server.stop()


def test_connection_retries_is_bounded_in_the_config():
    with pytest.raises(ValueError, match="connection_retries"):
        JetrlConfig.model_validate({"rollout": {"sglang": {"connection_retries": -1}}})
    assert JetrlConfig().rollout.vllm.connection_retries == 2
