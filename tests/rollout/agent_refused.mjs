// A Node.js command agent whose request the endpoint refuses: `node agent_refused.mjs OPENAI_MODULE_URL N
// MAX_TOKENS` asks for N choices of MAX_TOKENS tokens each with the official openai package (imported from
// OPENAI_MODULE_URL, the examples/agents/node project's copy); the rejection is left unhandled, so Node prints
// the stack and exits 1, its stderr ending in `Node.js v20...` as a crashed Node agent's does.
const [moduleUrl, n, maxTokens] = process.argv.slice(2);
const { default: OpenAI } = await import(moduleUrl);

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const task = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const client = new OpenAI({ maxRetries: 0 });
await client.chat.completions.create({
  model: "policy", messages: [{ role: "user", content: task.prompt }], n: Number(n), max_tokens: Number(maxTokens),
});
