// A jetrl agent in Node.js, started by the rollout worker once per episode (workflow: agent,
// workflow_args.command: "node examples/agents/node/agent.mjs"). Nothing jetrl-specific: the official
// openai client reads OPENAI_BASE_URL and OPENAI_API_KEY from the environment; the task (the prompt
// task's payload as JSON) comes on stdin. The reward service scores the last answer; an agent that
// knows its own reward POSTs {"reward": x} to JETRL_REWARD_URL instead (see REWARD below).
import OpenAI from "openai";

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

const task = await readStdin();
const client = new OpenAI({ maxRetries: 0 });
const messages = task.messages ?? [{ role: "user", content: task.prompt }];
const reply = await client.chat.completions.create({ model: "policy", messages });
const answer = reply.choices[0].message.content ?? "";

if (process.env.REWARD === "self") {
  // The agent scores itself: 1 when its answer starts with the reference.
  const reward = answer.trim().startsWith(String(task.reference)) ? 1.0 : 0.0;
  const res = await fetch(process.env.JETRL_REWARD_URL, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${process.env.OPENAI_API_KEY}` },
    body: JSON.stringify({ reward }),
  });
  if (!res.ok) throw new Error(`reward POST: HTTP ${res.status}: ${await res.text()}`);
}
