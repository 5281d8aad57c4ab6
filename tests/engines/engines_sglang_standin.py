"""A stand-in of SGLang's native HTTP API, for testing the sglang engine client on a CPU machine.

SGLang has no CPU build, so this FastAPI app serves the endpoints the client uses, with SGLang's
request and response shapes (docs: "SGLang Native APIs", "SGLang for RL systems"), on top of jetrl's
own local engine (real model, real logprobs, continuous batching):

  POST /generate                 {input_ids, rid, sampling_params, return_logprob}
                                 -> {text, output_ids, meta_info: {id, finish_reason: {type, ...},
                                     prompt_tokens, completion_tokens, output_token_logprobs:
                                     [[logprob, token_id, null], ...], weight_version}}
  POST /abort_request            {rid, abort_all}
  POST /pause_generation         {mode: abort | retract | in_place}
  POST /continue_generation
  POST /update_weights_from_disk {model_path, weight_version, ...} -> {success, message, num_paused_requests}
  POST /load_lora_adapter        {lora_name, lora_path} -> {success, message}
  POST /unload_lora_adapter      {lora_name} -> {success, message}
  GET  /health, /get_model_info, /get_weight_version

and /generate's `lora_path` (the name of a loaded adapter). It is a stand-in, not SGLang: scheduling,
radix cache and the exact numerics are jetrl's, and it serves ONE adapter at a time (merged into the
local engine's weights; SGLang batches requests of many adapters): a request naming another adapter than
the newest loaded one, or none while one is loaded, gets a 400.
"""

from __future__ import annotations

import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request

from rollout_service.engines.base import GenerateRequest, SamplingParams
from rollout_service.engines.local import LocalEngine
from shared.config import JetrlConfig


def sampling_from_sglang(sp: dict) -> SamplingParams:
    top_k = int(sp.get("top_k", -1))
    return SamplingParams(
        temperature=float(sp.get("temperature", 1.0)),
        top_p=float(sp.get("top_p", 1.0)),
        top_k=0 if top_k < 0 else top_k,
        max_new_tokens=int(sp.get("max_new_tokens", 128)),
        stop=list(sp.get("stop") or []),
        stop_token_ids=list(sp.get("stop_token_ids") or []),
        seed=sp.get("sampling_seed"),
        ignore_eos=bool(sp.get("ignore_eos", False)),
    )


def make_app(cfg: JetrlConfig) -> FastAPI:
    engine = LocalEngine(cfg)
    state = {"weight_version": "0", "paused": False, "lora": None, "loras": {}}

    @asynccontextmanager
    async def lifespan(app):
        await engine.start()
        yield
        await engine.close()

    app = FastAPI(title="SGLang API stand-in (jetrl tests)", lifespan=lifespan)
    app.state.engine = engine

    @app.get("/health")
    async def health():
        return {}

    @app.get("/get_model_info")
    async def model_info():
        return {"model_path": cfg.model.path, "tokenizer_path": cfg.model.path, "is_generation": True}

    @app.get("/get_weight_version")
    async def weight_version():
        return {"weight_version": state["weight_version"]}

    @app.post("/generate")
    async def generate(request: Request):
        body = await request.json()
        if body.get("input_ids") is None:
            raise HTTPException(400, "this stand-in needs input_ids (no text prompts)")
        if body.get("lora_path") != state["lora"]:
            raise HTTPException(400, f"this stand-in serves adapter {state['lora']!r} only, not {body.get('lora_path')!r}")
        rid = body.get("rid") or None
        req = GenerateRequest(
            prompt_ids=list(body["input_ids"]),
            sampling=sampling_from_sglang(body.get("sampling_params") or {}),
        )
        if rid:
            req.request_id = rid
        res = await engine.generate(req)
        if res.finish_reason == "abort":
            fr = {
                "type": "abort",
                "message": "Abort before prefill" if not res.output_ids else "Abort in waiting queue",
            }
        elif res.finish_reason == "length":
            fr = {"type": "length", "length": len(res.output_ids)}
        else:
            fr = {"type": "stop", "matched": res.output_ids[-1] if res.output_ids else None}
        meta = {
            "id": req.request_id,
            "finish_reason": fr,
            "prompt_tokens": len(res.prompt_ids),
            "completion_tokens": len(res.output_ids),
            "cached_tokens": 0,
            "weight_version": state["weight_version"],
            "e2e_latency": res.timings.get("total", 0.0),
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(res.logprobs, res.output_ids, strict=True)
            ]
        text = engine.tokenizer.decode(res.output_ids) if engine.tokenizer is not None else ""
        return {"text": text, "output_ids": res.output_ids, "meta_info": meta}

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await request.json()
        if body.get("abort_all"):
            await engine.abort(None)
        elif body.get("rid"):
            await engine.abort(body["rid"])
        return {}

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        body = await request.json() if await request.body() else {}
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            raise HTTPException(400, f"unknown pause mode {mode!r}")
        if mode == "abort":
            await engine.abort(None)
        else:
            await engine.pause()
            state["paused"] = True
        return {}

    @app.post("/continue_generation")
    async def continue_generation():
        await engine.resume()
        state["paused"] = False
        return {}

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        body = await request.json()
        label = str(body.get("weight_version") or int(state["weight_version"]) + 1)
        try:
            await engine.update_weights(
                int(label) if label.isdigit() else engine.version + 1, path=body["model_path"]
            )
        except Exception as e:
            return {"success": False, "message": f"Failed to update weights: {e}", "num_paused_requests": 0}
        state["weight_version"] = label
        state["lora"] = None
        return {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            raise HTTPException(400, "lora_name and lora_path are required")
        try:
            await engine.update_weights(engine.version + 1, path=path)
        except Exception as e:
            return {"success": False, "message": f"Failed to load LoRA adapter: {e}"}
        state["loras"][name] = path
        state["lora"] = name
        return {"success": True, "message": f"LoRA adapter {name} loaded"}

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        name = (await request.json()).get("lora_name")
        if name not in state["loras"]:
            raise HTTPException(400, f"LoRA adapter {name!r} is not loaded")
        if name == state["lora"]:
            raise HTTPException(400, f"LoRA adapter {name!r} is the one being served (stand-in: load another first)")
        del state["loras"][name]
        return {"success": True, "message": f"LoRA adapter {name} unloaded"}

    return app


class StandinServer:
    """Runs the stand-in under uvicorn in a thread (its own event loop) on 127.0.0.1:port."""

    def __init__(self, cfg: JetrlConfig, port: int):
        import uvicorn

        self.app = make_app(cfg)
        self.port = port
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, name="sglang-standin", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def engine(self) -> LocalEngine:
        return self.app.state.engine

    def start(self) -> StandinServer:
        import time

        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("SGLang stand-in did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
