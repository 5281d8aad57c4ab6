"""A scripted judge behind the OpenAI chat-completions API shape (POST /v1/chat/completions, bearer key),
for tests and benchmarks of reward_service/judge: it reads the fenced completion and the reference out of
the prompt jetrl's templates render and answers by rule, so expected rewards can be computed by hand.

Rules (on the text between the fence lines; the reference is the "Reference answer" line):
- pointwise score_line / json: 10 if the reference occurs in the completion, else min(len(words), 5);
- yes_no (max_tokens 1 with logprobs): top logprobs "Yes" log 0.8 and "No" log 0.2 when the reference
  occurs, else the reverse;
- pairwise: the completion with the reference wins, else the longer one, a tie when equal;
- a completion containing "GARBLE" makes the judge write no score; "SLOW" makes it sleep `slow_s` first.

`serve(port, key)` runs it under uvicorn in a thread; `.calls` counts requests, `.keys` the keys seen.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request

FENCE = re.compile(r"^(<<<[0-9a-f]+>>>)$", re.MULTILINE)


def fenced(text: str) -> list[str]:
    """The texts between pairs of identical fence lines, in order."""
    out, pos = [], 0
    while True:
        m = FENCE.search(text, pos)
        if not m:
            return out
        end = text.find("\n" + m.group(1), m.end())
        if end < 0:
            return out
        out.append(text[m.end() + 1:end])
        pos = end + len(m.group(1)) + 1


def reference(text: str) -> str:
    m = re.search(r"^Reference answer \(may be empty\): ?(.*)$", text, re.MULTILINE)
    return m.group(1).strip() if m else ""


def points(completion: str, ref: str) -> int:
    return 10 if ref and ref in completion else min(len(completion.split()), 5)


class StandIn:
    def __init__(self, key: str = "", slow_s: float = 5.0, delay_s: float = 0.0):
        self.key, self.slow_s, self.delay_s = key, slow_s, delay_s
        self.calls = 0
        self.keys: list[str] = []
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.chat)
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    def answer(self, body: dict) -> tuple[str, list[dict] | None]:
        text = body["messages"][-1]["content"]
        parts, ref = fenced(text), reference(text)
        if any("GARBLE" in p for p in parts):
            return "I cannot decide.", None
        if len(parts) == 2:  # pairwise
            a, b = parts
            pa, pb = (ref in a if ref else False), (ref in b if ref else False)
            if pa != pb:
                return f"One has the answer.\nWinner: {'A' if pa else 'B'}", None
            la, lb = len(a.split()), len(b.split())
            return f"Compared lengths.\nWinner: {'A' if la > lb else 'B' if lb > la else 'tie'}", None
        completion = parts[0] if parts else ""
        if body.get("logprobs"):
            good = bool(ref) and ref in completion
            yes, no = (0.8, 0.2) if good else (0.2, 0.8)
            import math
            top = [{"token": "Yes", "logprob": math.log(yes), "bytes": None},
                   {"token": "No", "logprob": math.log(no), "bytes": None}]
            return ("Yes" if good else "No"), [{"token": "Yes" if good else "No", "logprob": math.log(max(yes, no)),
                                                "bytes": None, "top_logprobs": top}]
        n = points(completion, ref)
        if '"score"' in text:  # the JSON template
            return f'{{"reason": "by rule", "score": {n}}}', None
        return f"By rule.\nScore: {n}", None

    async def chat(self, request: Request) -> dict[str, Any]:
        self.calls += 1
        auth = request.headers.get("authorization", "")
        self.keys.append(auth.removeprefix("Bearer "))
        if self.key and auth != f"Bearer {self.key}":
            raise HTTPException(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
        body = await request.json()
        text = body["messages"][-1]["content"]
        if "SLOW" in "".join(fenced(text)):
            await asyncio.sleep(self.slow_s)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        content, logprobs = self.answer(body)
        return {"id": f"chatcmpl-{self.calls}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "judge"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content},
                             "logprobs": {"content": logprobs} if logprobs else None}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    def start(self, port: int = 0, host: str = "127.0.0.1") -> str:
        import socket

        if not port:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return f"http://{host}:{port}/v1"

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
            self.thread.join(10)


def main() -> None:  # python -m testkit.judge_standin --port P [--key-file F] [--delay-s S]
    import argparse
    from pathlib import Path

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--key-file", default="")
    ap.add_argument("--delay-s", type=float, default=0.0)
    a = ap.parse_args()
    key = Path(a.key_file).read_text().strip() if a.key_file else ""
    s = StandIn(key, delay_s=a.delay_s)
    uvicorn.run(s.app, host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
