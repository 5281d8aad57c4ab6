"""Remote engines (vLLM, SGLang clients) when the world moves under them: a version dir deleted by the
weight store's retention right after the swap starts, and a started inference server that exits (the
worker side of that: tests/rollout/test_rollout_service.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from engines_helpers import TINY, engine_config
from engines_sglang_standin import StandinServer

from rollout_service.engines import make_engine
from rollout_service.engines.base import EngineDead, GenerateRequest, SamplingParams
from rollout_service.engines.vllm import VllmEngine
from shared.config import JetrlConfig
from shared.natsd import free_port


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
