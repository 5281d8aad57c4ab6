// A jetrl reward service in Node.js for the `exact` task (docs/protocol.md, "Reward scoring").
//
// It answers NATS requests on jetrl.reward.exact in queue group jetrl-reward, as a NATS micro
// service named jetrl-reward (so `$SRV.PING.jetrl-reward` finds it next to the Python replicas).
// Requests and replies are msgpack maps with `schema` and `v`; every reply is a RewardResult, also
// for a request that is not one (then `error` is set and rewards are 0). Run it instead of, or next
// to, `jetrl reward serve --task exact`:
//
//   npm ci && node server.js --servers nats://127.0.0.1:4222
//
// Options: --servers URL[,URL] (or NATS_URL), --name NAME. Check it with `jetrl reward check --task exact`.

import os from "node:os";
import process from "node:process";
import { decode, encode } from "@msgpack/msgpack";
import { connect } from "nats";

const TASK = "exact";
const SUBJECT = `jetrl.reward.${TASK}`;
const QUEUE = "jetrl-reward";
const SCHEMA_VERSION = 1;
const MAX_COMPLETIONS = 4096;
// ASCII whitespace only, exactly as reward_service/scorers/exact.py strips it.
const WHITESPACE = new Set([" ", "\t", "\n", "\r", "\f", "\v"]);

class BadRequest extends Error {
  constructor(where, reason) {
    super(`${where}: ${reason}`);
  }
}

function strip(s) {
  let a = 0;
  let b = s.length;
  while (a < b && WHITESPACE.has(s[a])) a++;
  while (b > a && WHITESPACE.has(s[b - 1])) b--;
  return s.slice(a, b);
}

function isMap(x) {
  return x !== null && typeof x === "object" && !Array.isArray(x) && !(x instanceof Uint8Array);
}

function isInt(x) {
  return typeof x === "bigint" || (typeof x === "number" && Number.isInteger(x));
}

function typeName(x) {
  if (x === null || x === undefined) return "nil";
  if (Array.isArray(x)) return "list";
  if (x instanceof Uint8Array) return "bytes";
  if (typeof x === "object") return "map";
  if (typeof x === "number") return Number.isInteger(x) ? "int" : "float";
  return typeof x;
}

// Decode and check a RewardRequest like shared/contract/codec.py does; throws BadRequest naming the field.
function parseRequest(data) {
  let raw;
  try {
    raw = decode(data, { useBigInt64: true });
  } catch (e) {
    throw new BadRequest("message", `not valid msgpack (${e.message})`);
  }
  if (!isMap(raw)) throw new BadRequest("message", `expected a msgpack map, got ${typeName(raw)}`);
  if (typeof raw.schema !== "string") throw new BadRequest("message.schema", "missing or not a string");
  if (raw.schema !== "RewardRequest") {
    throw new BadRequest("message.schema", `got ${raw.schema}, expected RewardRequest on this subject`);
  }
  const v = raw.v;
  if (!isInt(v)) throw new BadRequest("RewardRequest.v", "missing or not an integer");
  if (Number(v) > SCHEMA_VERSION) {
    throw new BadRequest("RewardRequest.v", `schema version ${v} is newer than this reader's ${SCHEMA_VERSION}`);
  }
  if (Number(v) < 1) throw new BadRequest("RewardRequest.v", `schema version ${v} is invalid`);
  if (!("task" in raw)) throw new BadRequest("RewardRequest.task", "required field is missing");
  if (typeof raw.task !== "string") throw new BadRequest("RewardRequest.task", `expected str, got ${typeName(raw.task)}`);
  if (!("completions" in raw)) throw new BadRequest("RewardRequest.completions", "required field is missing");
  if (!Array.isArray(raw.completions)) {
    throw new BadRequest("RewardRequest.completions", `expected list, got ${typeName(raw.completions)}`);
  }
  raw.completions.forEach((c, i) => {
    if (typeof c !== "string") throw new BadRequest(`RewardRequest.completions[${i}]`, `expected str, got ${typeName(c)}`);
  });
  const payload = raw.payload ?? {};
  if ("payload" in raw && !isMap(raw.payload)) {
    throw new BadRequest("RewardRequest.payload", `expected map, got ${typeName(raw.payload)}`);
  }
  const requestId = raw.request_id ?? "";
  if (typeof requestId !== "string") {
    throw new BadRequest("RewardRequest.request_id", `expected str, got ${typeName(raw.request_id)}`);
  }
  const ids = raw.completion_ids ?? null;
  if (ids !== null) {
    if (!Array.isArray(ids)) throw new BadRequest("RewardRequest.completion_ids", `expected list, got ${typeName(ids)}`);
    ids.forEach((x, i) => {
      if (!(x instanceof Uint8Array) || x.length % 4) {
        throw new BadRequest(`RewardRequest.completion_ids[${i}]`, "expected packed i32 bytes");
      }
    });
  }
  const timeout = raw.timeout_s ?? null;
  if (timeout !== null && typeof timeout !== "number" && typeof timeout !== "bigint") {
    throw new BadRequest("RewardRequest.timeout_s", `expected float, got ${typeName(timeout)}`);
  }
  return { task: raw.task, completions: raw.completions, reference: raw.reference ?? null, payload, requestId, ids, timeout };
}

// Why a decoded request cannot be scored (reward_service/engine.py, ScoringEngine.check), or null.
function problemWith(req) {
  if (req.task !== TASK) return `request is for task '${req.task}' but this service scores '${TASK}'`;
  if (req.completions.length > MAX_COMPLETIONS) {
    return `${req.completions.length} completions is over this service's limit of ${MAX_COMPLETIONS}`;
  }
  if (req.ids !== null && req.ids.length !== req.completions.length) {
    return `completion_ids has ${req.ids.length} entries, completions has ${req.completions.length}`;
  }
  if (req.timeout !== null && !(Number(req.timeout) > 0)) return `timeout_s must be > 0, got ${req.timeout}`;
  return null;
}

// The exact scorer: 1.0 when the stripped completion equals a stripped reference.
function scoreExact(completion, reference) {
  let refs;
  if (typeof reference === "string") refs = [reference];
  else if (Array.isArray(reference) && reference.length && reference.every((r) => typeof r === "string")) refs = reference;
  else {
    return { reward: 0.0, error: `ValueError: reference must be a string or a non-empty list of strings, got ${typeName(reference)}` };
  }
  const text = strip(completion);
  return { reward: refs.some((r) => strip(r) === text) ? 1.0 : 0.0, error: null };
}

// Best effort (task, request id, completion count) from a request that did not parse.
function salvage(data) {
  try {
    const raw = decode(data, { useBigInt64: true });
    if (!isMap(raw)) return ["", "", 0];
    return [
      typeof raw.task === "string" ? raw.task : "",
      typeof raw.request_id === "string" ? raw.request_id : "",
      Array.isArray(raw.completions) ? raw.completions.length : 0,
    ];
  } catch {
    return ["", "", 0];
  }
}

function result(task, requestId, rewards, errors, error, t0, instance) {
  return encode({
    schema: "RewardResult",
    v: SCHEMA_VERSION,
    task,
    rewards,
    request_id: requestId,
    metrics: rewards.map(() => ({})),
    errors,
    error,
    elapsed_s: Number(process.hrtime.bigint() - t0) / 1e9,
    instance,
  });
}

export function handle(data, instance) {
  const t0 = process.hrtime.bigint();
  let req;
  try {
    req = parseRequest(data);
  } catch (e) {
    if (!(e instanceof BadRequest)) throw e;
    const [task, rid, n] = salvage(data);
    const error = `bad request: ${e.message}`;
    return result(task || TASK, rid, new Array(n).fill(0.0), new Array(n).fill(error), error, t0, instance);
  }
  const problem = problemWith(req);
  const n = req.completions.length;
  if (problem) return result(req.task, req.requestId, new Array(n).fill(0.0), new Array(n).fill(problem), problem, t0, instance);
  const scores = req.completions.map((c) => scoreExact(c, req.reference));
  return result(req.task, req.requestId, scores.map((s) => s.reward), scores.map((s) => s.error), null, t0, instance);
}

function parseArgs(argv) {
  const opts = { servers: process.env.NATS_URL || "nats://127.0.0.1:4222", name: `node-${os.hostname()}-${process.pid}` };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--servers") opts.servers = argv[++i];
    else if (argv[i] === "--name") opts.name = argv[++i];
    else throw new Error(`unknown option ${argv[i]} (use --servers URL[,URL] --name NAME)`);
  }
  return opts;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const nc = await connect({ servers: opts.servers.split(","), name: opts.name, maxReconnectAttempts: -1 });
  const instance = `${opts.name}-${TASK}`;
  const srv = await nc.services.add({
    name: "jetrl-reward",
    version: "0.1.0",
    description: "jetrl reward scoring (Node.js example)",
    queue: QUEUE,
    metadata: { task: TASK, instance },
  });
  srv.addEndpoint(TASK, {
    subject: SUBJECT,
    queue: QUEUE,
    metadata: { task: TASK },
    handler: (err, msg) => {
      if (err) {
        console.error(`endpoint error: ${err.message}`);
        return;
      }
      try {
        msg.respond(handle(msg.data, instance));
      } catch (e) {
        console.error(`request failed: ${e.stack}`);
      }
    },
  });
  await nc.flush();
  console.log(`ready: ${instance} answering ${SUBJECT} (queue ${QUEUE}) on ${opts.servers}`);
  const stop = async () => {
    await srv.stop();
    await nc.drain();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((e) => {
    console.error(e.message);
    process.exit(1);
  });
}
