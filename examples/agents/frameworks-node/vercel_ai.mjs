// The calculator task with the Vercel AI SDK (`ai` + `@ai-sdk/openai`), as its docs write a tool loop:
//   command: node examples/agents/frameworks-node/vercel_ai.mjs            # generateText
//   command: node examples/agents/frameworks-node/vercel_ai.mjs --stream   # streamText
// `openai(id)` is the provider's Responses model (POST /v1/responses); the provider reads OPENAI_BASE_URL
// and OPENAI_API_KEY. streamText reports errors through onError instead of throwing: they fail the episode.
import { openai } from "@ai-sdk/openai";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";
import { calculate, DESCRIPTION, INSTRUCTIONS, MAX_TURNS, MODEL, readTask } from "./calc.mjs";

const tools = {
  calculator: tool({
    description: DESCRIPTION,
    inputSchema: z.object({ expression: z.string() }),
    execute: async ({ expression }) => calculate(expression),
  }),
};

const task = await readTask();
const request = { model: openai(MODEL), system: INSTRUCTIONS, prompt: task.prompt, tools,
  stopWhen: stepCountIs(MAX_TURNS), maxRetries: 0 };
if (process.argv.includes("--stream")) {
  const result = streamText({ ...request, onError: ({ error }) => { console.error(error); process.exitCode = 1; } });
  for await (const text of result.textStream) process.stdout.write(text);
  process.stdout.write("\n");
} else {
  const { text } = await generateText(request);
  console.log(text);
}
