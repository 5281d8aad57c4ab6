"""An agent run as an external command (`python agent_command.py [exit_code]`): reads the task on stdin,
talks to OPENAI_BASE_URL with the openai client, and POSTs its own reward to JETRL_REWARD_URL."""

import json
import os
import sys

import httpx
import openai

task = json.loads(sys.stdin.readline())
if len(sys.argv) > 1:
    print("agent: cannot go on", file=sys.stderr)
    sys.exit(int(sys.argv[1]))
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
r = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=4)
answer = r.choices[0].message.content
reward = 1.0 if answer.strip().startswith(str(task["reference"])) else 0.5
httpx.post(os.environ["JETRL_REWARD_URL"], json={"reward": reward},
           headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}).raise_for_status()
