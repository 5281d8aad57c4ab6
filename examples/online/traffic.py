"""Outside traffic for `jetrl serve-policy`: an application asking questions of the policy and rewarding each
answer later (examples/online_smollm2.yaml).

    python -m examples.online.traffic --url URL --key-file KEY --data ROWS.jsonl [--questions N] [--per 4]

For each question (a row's `prompt`, checked against its `reference`), `--per` sessions with the question
as their group key, each asked once with the official openai client; each reward (1 if the reply's first
integer is the reference, else 0) is posted `--delay` seconds after the reply, as a user's verdict would be.
Prints one line per question and a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from pathlib import Path

import httpx
import openai


def first_int(text: str) -> str | None:
    m = re.search(r"-?\d+", text or "")
    return m.group(0) if m else None


async def ask(http: httpx.AsyncClient, key: str, row: dict, per: int, delay: float) -> tuple[list[float], str | None]:
    sessions = [(await http.post("/v1/sessions", json={"group": row["prompt"][:200]})).raise_for_status().json()
                for _ in range(per)]
    rewards = []
    for s in sessions:
        client = openai.AsyncOpenAI(base_url=s["base_url"], api_key=key, max_retries=2)
        r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
        await client.close()
        rewards.append(1.0 if first_int(r.choices[0].message.content) == str(row["reference"]) else 0.0)
    await asyncio.sleep(delay)  # the verdict comes later
    published = None
    for s, reward in zip(sessions, rewards, strict=True):
        out = (await http.post(f"/sessions/{s['id']}/reward", json={"reward": reward})).raise_for_status().json()
        published = out.get("published") or published
    return rewards, published


async def main(args) -> None:
    key = Path(args.key_file).read_text().split()[0]
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()][: args.questions]
    total, groups = 0.0, 0
    async with httpx.AsyncClient(base_url=args.url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
        for i, row in enumerate(rows):
            rewards, published = await ask(http, key, row, args.per, args.delay)
            total += sum(rewards)
            groups += published is not None
            print(f"question {i}: rewards {rewards} -> {published}", flush=True)
    print(f"{len(rows)} questions, {len(rows) * args.per} sessions, {groups} groups published, "
          f"mean reward {total / max(1, len(rows) * args.per):.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--key-file", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--questions", type=int, default=20)
    p.add_argument("--per", type=int, default=4)
    p.add_argument("--delay", type=float, default=2.0)
    asyncio.run(main(p.parse_args()))
