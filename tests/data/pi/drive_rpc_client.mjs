// Drives this runtime with pi's own RpcClient (from the npm package, imported from
// $PI_RPC_CLIENT), the way a pi host drives pi; prints what it saw as one JSON object.
// Used by tests/test_pi_clients.py, which scripts the fake model and checks the report.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const { RpcClient } = await import(pathToFileURL(process.env.PI_RPC_CLIENT).href);
const cwd = process.env.PI_CWD;
const client = new RpcClient({
  cliPath: process.env.OMP_CLI,
  cwd,
  args: ["--model", "fake/fake-model"],
});
const report = {};
const events = [];
client.onEvent((event) => events.push(event));

function nextEvent(type, predicate = () => true) {
  return new Promise((resolve) => {
    const off = client.onEvent((event) => {
      if (event.type === type && predicate(event)) {
        off();
        resolve(event);
      }
    });
  });
}

await client.start();
try {
  report.state = await client.getState();
  report.models = (await client.getAvailableModels()).map((m) => `${m.provider}/${m.id}`);
  report.setModel = (await client.setModel("fake", "fake-model")).id;
  report.thinkingLevels = await client.getAvailableThinkingLevels();

  // A prompt, waited for the way pi's hosts wait: promptAndWait resolves on agent_settled.
  const first = await client.promptAndWait("hello");
  report.first = first.map((e) => e.type);
  report.lastText = await client.getLastAssistantText();

  // Steer and follow-up while a tool runs (the fake model's bash waits for the file `go`).
  // Steering waits for the running call as pi's does (interrupt mode "wait").
  await client.send({ type: "set_interrupt_mode", mode: "wait" });
  const started = nextEvent("tool_execution_start");
  const settled = client.waitForIdle(60000);
  report.busyPrompt = await client.prompt("wait for go");
  await started;
  report.steer = await client.steer("steer message");
  report.followUp = await client.followUp("follow-up message");
  report.queuedPrompt = await client.prompt("queued prompt", undefined, "followUp");
  writeFileSync(join(cwd, "go"), "");
  await settled;
  report.afterQueue = (await client.getMessages())
    .filter((m) => m.role === "user")
    .map((m) => (typeof m.content === "string" ? m.content : m.content[0].text));

  // Abort while a tool runs: the prompt still settles, aborted.
  const hanging = nextEvent("tool_execution_start");
  const abortedSettle = nextEvent("agent_settled");
  await client.prompt("hang");
  await hanging;
  await client.abort();
  report.abortSettled = await abortedSettle;

  report.bash = await client.bash("echo from-bash");
  report.stats = (await client.getSessionStats()).userMessages;
  report.commands = (await client.getCommands()).map((c) => c.name);
  report.compact = await client.compact();
  report.forkMessages = await client.getForkMessages();
  const firstFile = (await client.getState()).sessionFile;
  report.fork = await client.fork(report.forkMessages[0].entryId);
  const forkedState = await client.getState();
  report.forked = { file: forkedState.sessionFile, messageCount: forkedState.messageCount };
  report.clone = await client.clone();
  report.newSession = await client.newSession();
  report.switchSession = await client.switchSession(firstFile);
  report.switched = (await client.getState()).sessionFile === firstFile;
  report.clearQueue = await client.clearQueue();
  report.tree = (await client.getTree()).tree.length;
  report.entries = (await client.getEntries()).entries.length;
  report.eventTypes = [...new Set(events.map((e) => e.type))].sort();
} catch (error) {
  report.error = String(error && error.stack ? error.stack : error);
} finally {
  await client.stop();
}
process.stdout.write(JSON.stringify(report) + "\n");
