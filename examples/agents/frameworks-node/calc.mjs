// What the Node.js framework examples share: the episode's task and the calculator tool, in plain JS.
// The task is the calculator example's ("What is A * B?"), given by the rollout worker as one line of JSON
// on stdin; the agent prints its answer and exits, and the reward service (reward.task: addition) scores the
// content of the episode's last completion. Each example reaches the endpoint only through OPENAI_BASE_URL
// and OPENAI_API_KEY, which the official clients read from the environment.
export const INSTRUCTIONS =
  "You are a helpful assistant with a calculator. Call the calculator tool to work out the product, " +
  "then answer with the number only.";
export const MODEL = "policy"; // any name: the endpoint serves the policy under training
export const MAX_TURNS = 3; // model calls an episode may take before the agent gives up
export const DESCRIPTION = "Evaluate an arithmetic expression, e.g. (3 + 4) * 2.";

export async function readTask() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

// + - * / and parentheses over numbers, by recursive descent (no eval).
function evaluate(text) {
  const tokens = String(text).match(/\d+(?:\.\d+)?|[-+*/()]|\S/g) ?? [];
  let i = 0;
  const peek = () => tokens[i];
  const next = () => tokens[i++];
  function atom() {
    const t = next();
    if (t === "(") {
      const v = sum();
      if (next() !== ")") throw new Error("missing )");
      return v;
    }
    if (t === "-") return -atom();
    if (t !== undefined && /^\d/.test(t)) return Number(t);
    throw new Error(`unexpected ${t ?? "end of expression"}`);
  }
  function product() {
    let v = atom();
    while (peek() === "*" || peek() === "/") v = next() === "*" ? v * atom() : v / atom();
    return v;
  }
  function sum() {
    let v = product();
    while (peek() === "+" || peek() === "-") v = next() === "+" ? v + product() : v - product();
    return v;
  }
  const v = sum();
  if (i !== tokens.length) throw new Error(`unexpected ${tokens[i]}`);
  return v;
}

export function calculate(expression) {
  try {
    return String(evaluate(expression));
  } catch (err) {
    return `error: ${err.message}`;
  }
}

// The model did not finish within the framework's limits (too many turns): a wrong answer, not a broken
// agent. Errors of the endpoint (HTTP 4xx/5xx) are never caught: they fail the episode.
export function gaveUp(framework, err) {
  console.error(`${framework}: the model gave no answer: ${err.name}: ${err.message}`.slice(0, 500));
}
