// Drives a real acpserver with the official TypeScript ACP SDK over its
// (experimental) WebSocket client. Started by integration/ts_test.go, which
// passes the server and upstream MCP URLs in the environment:
//   ACPSERVER_URL      ws://HOST:PORT/acp
//   ACPSERVER_HTTP     http://HOST:PORT (for /debug/sessions)
//   MCP_UPSTREAM_URL   a streamable-HTTP MCP server with a "whoami" tool
//                      answering "http:A" (optional: the /call test skips)
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { client } from "@agentclientprotocol/sdk";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import { WebSocket } from "ws";

const URL_ = process.env.ACPSERVER_URL;
const HTTP = process.env.ACPSERVER_HTTP;
const MCP = process.env.MCP_UPSTREAM_URL;
if (!URL_ || !HTTP) {
  throw new Error("ACPSERVER_URL and ACPSERVER_HTTP must be set (run through go test ./integration -run TestTypeScriptSDK)");
}

// The SDK reports invalid messages (a session/update failing its schema,
// say) on the console and drops them: any such line fails the run.
const complaints = [];
for (const level of ["error", "warn"]) {
  const orig = console[level];
  console[level] = (...args) => {
    complaints.push(`${level}: ${args.map((a) => (typeof a === "string" ? a : JSON.stringify(a))).join(" ")}`);
    orig.apply(console, args);
  };
}
after(() => assert.deepEqual(complaints, [], "the SDK complained about messages from the server"));

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function snapshot() {
  const r = await fetch(`${HTTP}/debug/sessions`);
  return r.json();
}

async function waitFor(what, cond, ms = 10000) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    last = await snapshot();
    if (cond(last)) return last;
    await sleep(20);
  }
  assert.fail(`${what} never held; last /debug/sessions: ${JSON.stringify(last)}`);
}

// connect opens one SDK client connection with a tap on both directions,
// so tests see the exact wire order; typed collects the session/update
// notifications the SDK validated and delivered.
function connect() {
  const wire = createWebSocketStream(URL_, { WebSocket });
  const raw = [];
  const sent = [];
  const typed = [];
  const inbound = wire.readable.pipeThrough(
    new TransformStream({ transform(m, c) { raw.push(m); c.enqueue(m); } }),
  );
  const outbound = new TransformStream({ transform(m, c) { sent.push(m); c.enqueue(m); } });
  outbound.readable.pipeTo(wire.writable).catch(() => {});
  const app = client({ name: "acpserver-sdk-test" }).onNotification("session/update", ({ params }) => {
    typed.push(params);
  });
  const conn = app.connect({ readable: inbound, writable: outbound.writable });
  return { conn, ctx: conn.agent, raw, sent, typed };
}

// turn returns the wire messages between request #idx and its response,
// and the index of the response in raw.
function framesOf(c, method, fromRaw) {
  const req = [...c.sent].reverse().find((m) => m.method === method && "id" in m);
  assert.ok(req, `no ${method} request sent`);
  const at = c.raw.findIndex((m, i) => i >= fromRaw && !("method" in m) && m.id === req.id);
  assert.ok(at >= 0, `no response to ${method}`);
  return { before: c.raw.slice(fromRaw, at).filter((m) => m.method === "session/update"), at };
}

const text = (updates) =>
  updates
    .filter((m) => m.params.update.sessionUpdate === "agent_message_chunk")
    .map((m) => m.params.update.content.text)
    .join("");

async function initialize(ctx) {
  const init = await ctx.request("initialize", {
    protocolVersion: 1,
    clientCapabilities: {},
    clientInfo: { name: "sdk-test", version: "0" },
  });
  assert.equal(init.protocolVersion, 1);
  assert.equal(init.agentCapabilities.loadSession, true);
  for (const k of ["list", "delete", "resume", "close"]) {
    assert.ok(init.agentCapabilities.sessionCapabilities?.[k], `sessionCapabilities.${k}`);
  }
  return init;
}

test("lifecycle through the SDK: new, prompt, cancel, load, resume, list, close, delete, disconnect", async () => {
  const base = await waitFor("idle server", (s) => s.connections === 0);
  const c = connect();
  await initialize(c.ctx);
  const { sessionId } = await c.ctx.request("session/new", { cwd: "/tmp/sdk-project", mcpServers: [] });
  assert.ok(sessionId);

  // Prompt: updates in order before the response.
  let from = c.raw.length;
  let r = await c.ctx.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "hello sdk" }] });
  assert.equal(r.stopReason, "end_turn");
  let f = framesOf(c, "session/prompt", from);
  assert.equal(text(f.before), "hello sdk");

  // Cancel: the response says cancelled and comes after all the turn's updates.
  from = c.raw.length;
  const running = c.ctx.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "/sleep 30s" }] });
  while (!c.raw.slice(from).some((m) => m.method === "session/update")) await sleep(10);
  await c.ctx.notify("session/cancel", { sessionId });
  r = await running;
  assert.equal(r.stopReason, "cancelled");
  f = framesOf(c, "session/prompt", from);
  assert.ok(f.before.length >= 1);
  await sleep(200);
  assert.equal(c.raw.slice(f.at + 1).filter((m) => m.method === "session/update").length, 0, "updates after the cancelled response");

  // List, with and without a cwd filter.
  let list = await c.ctx.request("session/list", {});
  assert.ok(list.sessions.some((s) => s.sessionId === sessionId && s.cwd === "/tmp/sdk-project"));
  list = await c.ctx.request("session/list", { cwd: "/elsewhere" });
  assert.equal(list.sessions.length, 0);

  // Load replays the history (user and agent chunks) before its response.
  from = c.raw.length;
  await c.ctx.request("session/load", { sessionId, cwd: "/tmp/sdk-project", mcpServers: [] });
  f = framesOf(c, "session/load", from);
  const kinds = f.before.map((m) => m.params.update.sessionUpdate);
  assert.ok(kinds.includes("user_message_chunk") && kinds.includes("agent_message_chunk"), `replayed: ${kinds}`);
  assert.ok(text(f.before).includes("hello sdk"));

  // Resume: no replay, and the session works afterwards.
  from = c.raw.length;
  await c.ctx.request("session/resume", { sessionId, cwd: "/tmp/sdk-project", mcpServers: [] });
  f = framesOf(c, "session/resume", from);
  assert.equal(f.before.length, 0, "resume replayed history");
  from = c.raw.length;
  r = await c.ctx.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "after resume" }] });
  assert.equal(text(framesOf(c, "session/prompt", from).before), "after resume");

  // Close ends the runtime, keeps the record.
  await c.ctx.request("session/close", { sessionId });
  await waitFor("runtime closed", (s) => s.sessions === 0 && s.ended.closed > base.ended.closed);
  list = await c.ctx.request("session/list", {});
  assert.ok(list.sessions.some((s) => s.sessionId === sessionId));

  // Delete removes the record.
  await c.ctx.request("session/delete", { sessionId });
  list = await c.ctx.request("session/list", {});
  assert.ok(!list.sessions.some((s) => s.sessionId === sessionId));

  // A second session left open: disconnecting ends its runtime.
  const second = await c.ctx.request("session/new", { cwd: "/tmp/sdk-project", mcpServers: [] });
  await c.ctx.request("session/prompt", { sessionId: second.sessionId, prompt: [{ type: "text", text: "x" }] });
  await waitFor("one live runtime", (s) => s.sessions === 1 && s.connections === 1);
  c.conn.close();
  await c.conn.closed;
  await waitFor("disconnect ended the runtime", (s) =>
    s.connections === 0 && s.sessions === 0 && s.inflight_prompts === 0 && s.ended.disconnected === base.ended.disconnected + 1);

  const updates = c.raw.filter((m) => m.method === "session/update");
  assert.equal(c.typed.length, updates.length, "the SDK dropped updates it found invalid");
});

test("/call of a tool on a real MCP upstream", { skip: !MCP && "MCP_UPSTREAM_URL not set" }, async () => {
  const c = connect();
  await initialize(c.ctx);
  const { sessionId } = await c.ctx.request("session/new", {
    cwd: "/tmp/sdk-project",
    mcpServers: [{ type: "http", name: "up", url: MCP, headers: [] }],
  });
  const from = c.raw.length;
  const r = await c.ctx.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "/call up/whoami {}" }] });
  assert.equal(r.stopReason, "end_turn");
  const f = framesOf(c, "session/prompt", from);
  const kinds = f.before.map((m) => m.params.update.sessionUpdate);
  assert.ok(kinds.includes("tool_call"), `updates: ${kinds}`);
  const done = f.before.map((m) => m.params.update).filter((u) => u.sessionUpdate === "tool_call_update" && u.status === "completed");
  assert.equal(done.length, 1, `updates: ${JSON.stringify(f.before)}`);
  assert.match(JSON.stringify(done[0].content), /http:A/);
  assert.equal(c.typed.length, c.raw.filter((m) => m.method === "session/update").length, "the SDK dropped updates");
  c.conn.close();
  await c.conn.closed;
  await waitFor("idle after disconnect", (s) => s.connections === 0 && s.sessions === 0 && s.mcp_clients === 0);
});
