"""A prompt task over the worker's bounds is dead-lettered unread (once, a 137-byte PromptTask with
group_size 200000 grew a worker from 310 MB to 1.2 GB and SIGTERM no longer stopped it). A real
`jetrl rollout` process (sim engine) against a real nats-server."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import yaml

from shared.config import JetrlConfig
from shared.contract import bus, codec, subjects
from shared.contract.messages import DeadLetter, PromptTask

RUN = "bounds"


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def test_tasks_over_the_bounds_are_dead_lettered_and_sigterm_still_stops_the_worker(nats_server, js, nc, tmp_path):
    cfg = {"run": RUN, "nats": {"servers": [nats_server.url]}, "telemetry": {"metrics_port": -1, "log_level": "WARNING"},
           "rollout": {"engine": "sim", "sim": {"time_scale": 0}, "service": {"follow_weights": False,
                                                                              "stop_timeout_s": 10,
                                                                              "max_prompt_tokens": 100}}}
    JetrlConfig.model_validate(cfg)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "launcher.cli", "rollout", "-c", str(tmp_path / "c.yaml"),
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        tasks = [PromptTask(run=RUN, prompt_id="huge-group", epoch=0, payload={"prompt": "x"}, group_size=200_000),
                 PromptTask(run=RUN, prompt_id="huge-tokens", epoch=0, payload={"prompt": "x"}, group_size=1,
                            sampling={"max_new_tokens": 10**9}),
                 PromptTask(run=RUN, prompt_id="huge-prompt", epoch=0, payload={"prompt": "x" * 1_500_000}, group_size=1),
                 # under max_prompt_chars, but over max_prompt_tokens (by tokens, then unread by characters)
                 PromptTask(run=RUN, prompt_id="long-prompt", epoch=0, payload={"prompt": "3 + 4 = 7. " * 40}, group_size=1),
                 PromptTask(run=RUN, prompt_id="long-text", epoch=0, payload={"prompt": "x" * 900_000}, group_size=1)]
        assert len(codec.encode(tasks[0])) < 200  # a tiny message ...
        for t in tasks:
            await bus.publish(js, nc, subjects.prompts(RUN), t, msg_id=t.group_id)
        sub = await js.pull_subscribe(subjects.dlq_all(RUN), stream=subjects.DLQ_STREAM)
        letters: list[DeadLetter] = []
        deadline = asyncio.get_running_loop().time() + 120
        while len(letters) < 5:
            assert asyncio.get_running_loop().time() < deadline, f"dead letters: {[d.reason for d in letters]}"
            assert proc.returncode is None, (await proc.stderr.read()).decode()[-3000:]
            try:
                msgs = await sub.fetch(5, timeout=1)
            except Exception:
                continue
            letters += [codec.decode(m.data, expect=DeadLetter) for m in msgs]
        reasons = {codec.decode(d.original, expect=PromptTask).prompt_id: d.reason for d in letters}
        assert "rollout.service.max_group_size" in reasons["huge-group"]
        assert "rollout.service.max_new_tokens" in reasons["huge-tokens"]
        assert "rollout.service.max_prompt_chars" in reasons["huge-prompt"]
        assert "tokens is over the limit of 100" in reasons["long-prompt"], reasons["long-prompt"]
        assert "characters is over the limit of 100 tokens" in reasons["long-text"], reasons["long-text"]
        assert all(r.startswith("rejected: ") for r in reasons.values())  # at once, not after retries
        assert rss_mib(proc.pid) < 1024  # ... that no longer grows the worker to 1.2 GB
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
