// The calculator task with the OpenAI Agents SDK for JavaScript (@openai/agents), as its quickstart writes
// an agent:   command: node examples/agents/frameworks-node/openai_agents.mjs
// The SDK's default model uses the Responses API (POST /v1/responses) through an `OpenAI()` client, which
// reads OPENAI_BASE_URL and OPENAI_API_KEY. Tracing is off: it would upload traces to OpenAI's platform.
import { Agent, MaxTurnsExceededError, ModelBehaviorError, run, setTracingDisabled, tool } from "@openai/agents";
import { z } from "zod";
import { calculate, DESCRIPTION, gaveUp, INSTRUCTIONS, MAX_TURNS, MODEL, readTask } from "./calc.mjs";

setTracingDisabled(true);

const calculator = tool({
  name: "calculator",
  description: DESCRIPTION,
  parameters: z.object({ expression: z.string() }),
  execute: async ({ expression }) => calculate(expression),
});

const task = await readTask();
const agent = new Agent({ name: "Calculator", instructions: INSTRUCTIONS, tools: [calculator], model: MODEL });
try {
  const result = await run(agent, task.prompt, { maxTurns: MAX_TURNS });
  console.log(result.finalOutput);
} catch (err) {
  if (!(err instanceof MaxTurnsExceededError || err instanceof ModelBehaviorError)) throw err;
  gaveUp("@openai/agents", err);
}
