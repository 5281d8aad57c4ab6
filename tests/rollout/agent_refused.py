"""A command agent whose request the endpoint refuses (`python agent_refused.py N MAX_TOKENS`): it asks for N
choices of MAX_TOKENS tokens each with the openai client, which raises on the 400 and leaves a traceback on
stderr (its last line the client's error, as most agents' crash output ends)."""

import json
import sys

import openai

task = json.loads(sys.stdin.readline())
n, max_tokens = int(sys.argv[1]), int(sys.argv[2])
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["prompt"]}], n=n,
                               max_tokens=max_tokens)
