// omp's JavaScript extension host: runs the original's TypeScript / JavaScript extensions of one
// omp session in a process of its own (bun, or node), giving each the original's extension API
// and forwarding what they do to the session over one channel: the socket whose file descriptor
// is argv[2], one JSON message per line each way. The protocol (its messages, ids and
// cancellation) is written down in omp/extensions/jshost.py, the session's end; this is the
// other end. Plain JavaScript, so node 20 runs it as well as bun and newer node.
//
// What runs here is the extensions' code and nothing else: the session decides when a handler,
// a tool or a command runs, with what, and what its answer does.

import { AsyncLocalStorage } from "node:async_hooks";
import { spawn } from "node:child_process";
import fs from "node:fs";
import module from "node:module";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

import { toJsonSchema } from "./schema.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const HOST = Symbol.for("omp.extension-host");
const FACTORY_TIMEOUT_MS = 30_000;
const NOT_INITIALIZED = "Extension runtime not initialized. Action methods cannot be called "
  + "during extension loading.";

// The original's package names, always served by omp's stand-ins (their real code would start a
// whole agent); and schema libraries served by omp's builder only when an extension has none.
const ALWAYS = {
  "@oh-my-pi/pi-coding-agent": "pi.mjs",
  "@mariozechner/pi-coding-agent": "pi.mjs",
  "@earendil-works/pi-coding-agent": "pi.mjs",
  "@oh-my-pi/pi-ai": "pi-ai.mjs",
  "@mariozechner/pi-ai": "pi-ai.mjs",
  "@oh-my-pi/pi-tui": "pi-tui.mjs",
  "@mariozechner/pi-tui": "pi-tui.mjs",
  "@oh-my-pi/omptype/typebox": "typebox.mjs",
  "@oh-my-pi/omptype/zod": "zod.mjs",
};
const FALLBACK = { "typebox": "typebox.mjs", "@sinclair/typebox": "typebox.mjs" };

const isBun = typeof globalThis.Bun !== "undefined";
const als = new AsyncLocalStorage();
/** Loaded extensions by the session's index. */
const extensions = new Map();
/** The session as it was when it last sent a request (the sync getters read it); the session
 * sends what changed. */
let state = { activeTools: [], allTools: [], commands: [], systemPrompt: [], isIdle: true,
              pendingMessages: 0, hasUI: false };
let config = {};
let initialized = false;
let shims = null;
/** AbortControllers of the requests running, by request id. */
const running = new Map();
/** Calls to the session waiting for their answer, by call id. */
const waiting = new Map();
let nextCall = 1;
const bus = eventBus();

// --- the channel -----------------------------------------------------------------------------

const fd = Number(process.argv[2]);
const input = fs.createReadStream(null, { fd, autoClose: false, encoding: "utf8" });
const output = fs.createWriteStream(null, { fd, autoClose: false });

function send(message) {
  output.write(`${JSON.stringify(message)}\n`);
}

let buffered = "";
input.on("data", (chunk) => {
  buffered += chunk;
  let end;
  while ((end = buffered.indexOf("\n")) >= 0) {
    const line = buffered.slice(0, end);
    buffered = buffered.slice(end + 1);
    if (line.trim()) dispatch(JSON.parse(line));
  }
});
// The session closed the channel: it is done with us.
input.on("end", () => process.exit(0));
input.on("error", () => process.exit(0));

// An extension's stray error (a timer, an unawaited promise) is reported, never fatal.
process.on("uncaughtException", (error) => report("<host>", "uncaught", error));
process.on("unhandledRejection", (error) => report("<host>", "unhandled_rejection", error));

send({ type: "hello", runtime: isBun ? "bun" : "node",
       version: isBun ? globalThis.Bun.version : process.versions.node });

function dispatch(message) {
  switch (message.type) {
    case "load": load(message); break;
    case "state": Object.assign(state, message.state); break;
    case "event": request(message, (ext) => {
      const handler = ext.handlers[message.handler];
      return handler.fn(message.event, context(ext, message.id));
    }); break;
    case "tool": request(message, (ext, signal) => {
      const tool = ext.tools.get(message.name);
      if (tool === undefined) throw new Error(`Unknown tool: ${message.name}`);
      const onUpdate = (partial) => send({ type: "update", id: message.id, value: partial });
      return tool.execute(message.toolCallId, message.params, signal, onUpdate,
                          context(ext, message.id, signal));
    }); break;
    case "command": request(message, (ext) => {
      const command = ext.commands.get(message.name);
      if (command === undefined) throw new Error(`Unknown command: ${message.name}`);
      return command.handler(message.args, commandContext(ext, message.id));
    }); break;
    case "cancel": running.get(message.id)?.abort(); break;
    case "answer": {
      const pending = waiting.get(message.id);
      waiting.delete(message.id);
      if (pending === undefined) break;
      if (message.error !== undefined) pending.reject(new Error(message.error));
      else pending.resolve(message.value);
      break;
    }
    default: break;
  }
}

/** Run one request of the session and answer it (a cancelled one is still answered: the session
 * has forgotten it and drops the answer). */
function request(message, run) {
  const controller = new AbortController();
  running.set(message.id, controller);
  als.run({ request: message.id }, async () => {
    try {
      const ext = extensions.get(message.ext);
      if (ext === undefined) throw new Error(`Unknown extension: ${message.ext}`);
      answer(message.id, await run(ext, controller.signal));
    } catch (error) {
      send({ type: "result", id: message.id, error: messageOf(error) });
    } finally {
      running.delete(message.id);
    }
  });
}

function answer(id, value) {
  try {
    send({ type: "result", id, value: value === undefined ? null : value });
  } catch (error) {
    send({ type: "result", id, error: `its result is not JSON: ${messageOf(error)}` });
  }
}

function messageOf(error) {
  if (error instanceof Error) return error.message || error.name;
  return String(error);
}

/** Ask the session (`call` with an id: the promise resolves with its answer). `signal`: an
 * abort cancels the call and resolves it with undefined. */
function call(ext, method, params, { of, signal } = {}) {
  const id = nextCall++;
  return new Promise((resolve, reject) => {
    if (signal?.aborted) { resolve(undefined); return; }
    waiting.set(id, { resolve, reject });
    signal?.addEventListener("abort", () => {
      if (!waiting.delete(id)) return;
      send({ type: "cancel_call", id });
      resolve(undefined);
    }, { once: true });
    send({ type: "call", id, method, params, ext: ext.index, of: of ?? als.getStore()?.request });
  });
}

/** Tell the session (`call` without an id: nothing is answered). */
function tell(ext, method, params = {}, of = undefined) {
  send({ type: "call", method, params, ext: ext?.index, of: of ?? als.getStore()?.request });
}

function report(extensionPath, event, error) {
  tell(undefined, "error", { extensionPath, event, error: messageOf(error) });
}

// --- loading ---------------------------------------------------------------------------------

async function load(message) {
  config = message.config;
  globalThis[HOST] = { agentDir: config.agentDir };
  const results = [];
  try {
    await installAliases();
    for (const spec of message.extensions) results.push(await loadOne(spec));
  } catch (error) {
    send({ type: "result", id: message.id, error: messageOf(error) });
    return;
  }
  initialized = true;
  answer(message.id, { extensions: results });
}

async function loadOne(spec) {
  const ext = { index: spec.index, path: spec.path, name: spec.name, handlers: [],
                tools: new Map(), commands: new Map(), flags: new Map(), warnings: [] };
  // While a module loads and its factory runs it cannot end the process.
  const exit = process.exit;
  process.exit = (code) => {
    throw new Error(`process.exit(${code ?? ""}) called while the extension loaded`);
  };
  try {
    fallbacksFor(path.dirname(spec.path));
    const loaded = await import(pathToFileURL(spec.path).href);
    const factory = factoryOf(loaded);
    if (factory === undefined) {
      throw new Error(`Extension does not export a valid factory function: ${spec.path}`);
    }
    let timer;
    const timeout = new Promise((_resolve, reject) => {
      timer = setTimeout(() => reject(new Error(
        `its factory did not finish within ${FACTORY_TIMEOUT_MS}ms`)), FACTORY_TIMEOUT_MS);
    });
    try {
      await Promise.race([Promise.resolve().then(() => factory(api(ext))), timeout]);
    } finally {
      clearTimeout(timer);
    }
  } catch (error) {
    return { index: spec.index, error: messageOf(error) };
  } finally {
    process.exit = exit;
  }
  extensions.set(spec.index, ext);
  return { index: spec.index, events: ext.handlers.map((h) => h.event),
           tools: [...ext.tools.values()].map((t) => t.info),
           commands: [...ext.commands.values()].map((c) => c.info), warnings: ext.warnings };
}

function factoryOf(loaded) {
  for (const candidate of [loaded.default, loaded.default?.default, loaded]) {
    if (typeof candidate === "function") return candidate;
  }
  return undefined;
}

async function installAliases() {
  const urls = {};
  for (const name of new Set([...Object.values(ALWAYS), ...Object.values(FALLBACK)])) {
    urls[name] = pathToFileURL(path.join(HERE, name)).href;
  }
  shims = {};
  for (const [name, url] of Object.entries(urls)) shims[name] = await import(url);
  const table = (names) => Object.fromEntries(Object.entries(names).map(([spec, file]) =>
    [spec, urls[file]]));
  if (isBun) {
    globalThis.Bun.plugin({
      name: "omp-aliases",
      setup(build) {
        for (const [spec, file] of Object.entries(ALWAYS)) {
          build.module(spec, () => ({ exports: shims[file], loader: "object" }));
        }
      },
    });
  } else if (typeof module.register === "function") {
    module.register(pathToFileURL(path.join(HERE, "node-hooks.mjs")).href, {
      data: { always: table(ALWAYS), fallback: table(FALLBACK) },
    });
  }
}

const fallbacksInstalled = new Set();

/** bun: a schema library the extension in `directory` cannot import becomes omp's builder
 * (node does this in its resolve hook). */
function fallbacksFor(directory) {
  if (!isBun) return;
  for (const [spec, file] of Object.entries(FALLBACK)) {
    if (fallbacksInstalled.has(spec)) continue;
    try {
      globalThis.Bun.resolveSync(spec, directory);
    } catch {
      fallbacksInstalled.add(spec);
      globalThis.Bun.plugin({
        name: `omp-fallback-${spec}`,
        setup(build) { build.module(spec, () => ({ exports: shims[file], loader: "object" })); },
      });
    }
  }
}

// --- the extension API (`pi`) ----------------------------------------------------------------

function api(ext) {
  const acting = () => {
    if (!initialized) throw new Error(NOT_INITIALIZED);
  };
  const warn = (text) => {
    const message = `Extension ${ext.path}: ${text}`;
    if (initialized) tell(ext, "warn", { message });
    else ext.warnings.push(message);  // said with the load's result
  };
  const logger = Object.fromEntries(["debug", "info", "warn", "error"].map((level) =>
    [level, (...args) => console.error(`[${ext.name}] ${level}:`, ...args)]));
  return {
    logger,
    typebox: shims["typebox.mjs"],
    zod: shims["zod.mjs"],
    arktype: undefined,
    pi: shims["pi.mjs"],
    events: bus,

    on(event, handler) {
      if (typeof handler !== "function") throw new Error(`on("${event}") needs a function`);
      ext.handlers.push({ event: String(event), fn: handler });
      if (initialized) warn(`pi.on("${event}") after loading is not supported; it never runs`);
    },
    registerTool(definition) {
      const tool = toolOf(definition);
      ext.tools.set(tool.info.name, tool);
      if (initialized) tell(ext, "register", { tools: [tool.info] });
    },
    registerCommand(name, options) {
      const command = commandOf(name, options);
      ext.commands.set(command.info.name, command);
      if (initialized) tell(ext, "register", { commands: [command.info] });
    },
    registerFlag(name, options) { ext.flags.set(name, options?.default); },
    getFlag(name) { return ext.flags.get(name); },
    registerProvider(name) { warn(`registerProvider("${name}") is not supported; ignored`); },
    unregisterProvider(name) { warn(`unregisterProvider("${name}") is not supported; ignored`); },
    // Terminal-UI and sandbox registrations: nothing to do without a terminal UI.
    registerShortcut() {},
    registerMessageRenderer() {},
    registerAssistantThinkingRenderer() {},
    registerComposerShape() {},
    registerFileWriteFallback() {},
    registerFileDeleteFallback() {},
    setLabel() {},

    sendMessage(message, options) {
      acting();
      tell(ext, "sendMessage", { message, triggerTurn: Boolean(options?.triggerTurn),
                                 deliverAs: options?.deliverAs });
    },
    sendUserMessage(content, options) {
      acting();
      tell(ext, "sendUserMessage", { content, deliverAs: options?.deliverAs });
    },
    appendEntry(customType, data) {
      acting();
      tell(ext, "appendEntry", { customType, data });
    },
    exec(command, args, options) { return execute(command, args ?? [], options ?? {}); },
    getActiveTools() { acting(); return [...state.activeTools]; },
    getAllTools() { acting(); return state.allTools.map((t) => ({ ...t })); },
    setActiveTools(names) {
      acting();
      state.activeTools = [...names];
      return call(ext, "setActiveTools", { names: [...names] });
    },
    getCommands() { acting(); return state.commands.map((c) => ({ ...c })); },
    setModel(model) {
      acting();
      return call(ext, "setModel", { provider: model?.provider, id: model?.id });
    },
    getThinkingLevel() { acting(); return state.thinkingLevel ?? undefined; },
    setThinkingLevel(level) { acting(); tell(ext, "setThinkingLevel", { level }); },
    getServiceTiers() { acting(); return {}; },
    setServiceTier() { acting(); },
    getSessionName() { acting(); return state.sessionName ?? undefined; },
    setSessionName(name) { acting(); return call(ext, "setSessionName", { name }); },
  };
}

function toolOf(definition) {
  const name = definition?.name;
  if (typeof name !== "string" || !name) throw new Error("registerTool needs a name");
  if (typeof definition.execute !== "function") {
    throw new Error(`Tool "${name}" needs an execute function`);
  }
  const approval = definition.approval ?? "exec";
  if (!["read", "write", "exec"].includes(approval)) {
    throw new Error(`Tool "${name}" approval must be "read", "write" or "exec"`);
  }
  return {
    execute: (...args) => definition.execute(...args),
    info: { name, label: String(definition.label ?? name),
            description: String(definition.description ?? ""),
            parameters: toJsonSchema(definition.parameters, name), approval },
  };
}

function commandOf(name, options) {
  const clean = String(name ?? "").replace(/^\//, "");
  if (!clean || /\s/.test(clean)) throw new Error(`Invalid command name: ${JSON.stringify(name)}`);
  if (typeof options?.handler !== "function") {
    throw new Error(`Command "${clean}" needs a handler function`);
  }
  return { handler: options.handler,
           info: { name: clean, description: String(options.description ?? "") } };
}

function eventBus() {
  const listeners = new Map();
  return {
    on(name, listener) {
      const set = listeners.get(name) ?? new Set();
      set.add(listener);
      listeners.set(name, set);
      return () => set.delete(listener);
    },
    emit(name, data) {
      for (const listener of listeners.get(name) ?? []) {
        try { listener(data); } catch (error) { report("<event-bus>", name, error); }
      }
    },
  };
}

/** `pi.exec`: run a program (no shell) in the session's cwd; resolves with what it wrote. It
 * runs in the host's process group, so it ends with the session at the latest. */
function execute(command, args, options) {
  return new Promise((resolve) => {
    let stdout = "";
    let stderr = "";
    let killed = false;
    let timer;
    const child = spawn(command, args, { cwd: options.cwd ?? state.cwd,
                                         stdio: ["ignore", "pipe", "pipe"] });
    const kill = () => {
      if (killed) return;
      killed = true;
      child.kill("SIGTERM");
    };
    child.stdout.setEncoding("utf8").on("data", (text) => { stdout += text; });
    child.stderr.setEncoding("utf8").on("data", (text) => { stderr += text; });
    if (options.timeout > 0) timer = setTimeout(kill, options.timeout);
    if (options.signal?.aborted) kill();
    options.signal?.addEventListener("abort", kill, { once: true });
    child.on("error", (error) => {
      clearTimeout(timer);
      resolve({ stdout, stderr: stderr + messageOf(error), code: 127, killed });
    });
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ stdout, stderr, code: code ?? 1, killed });
    });
  });
}

// --- ctx -------------------------------------------------------------------------------------

function context(ext, requestId, signal) {
  const timers = new Set();
  const managed = (kind, schedule) => (callback, ms, ...args) => {
    const timer = schedule(() => {
      try {
        const result = callback(...args);
        if (result && typeof result.catch === "function") {
          result.catch((error) => report("<timer>", `${kind}_callback`, error));
        }
      } catch (error) {
        report("<timer>", `${kind}_callback`, error);
      }
    }, ms);
    timer.unref?.();
    timers.add(timer);
    return timer;
  };
  return {
    ui: ui(ext, requestId),
    signal,
    get mode() { return config.mode; },
    get hasUI() { return Boolean(state.hasUI); },
    get cwd() { return state.cwd; },
    get model() { return state.model ?? undefined; },
    models: {
      list: () => (state.model ? [state.model] : []),
      current: () => state.model ?? undefined,
      resolve: () => undefined,
      family: (model) => `${model?.provider ?? ""}`,
    },
    sessionManager: sessionManager(),
    modelRegistry: undefined,
    isIdle: () => Boolean(state.isIdle),
    abort: () => tell(ext, "abort", {}, requestId),
    hasPendingMessages: () => state.pendingMessages > 0,
    shutdown: () => tell(ext, "shutdown", {}, requestId),
    getContextUsage: () => undefined,
    getAsyncJobSnapshot: () => null,
    compact: () => Promise.reject(new Error("ctx.compact() is not supported by omp (trio)")),
    isProjectTrusted: () => Boolean(config.trusted),
    getSystemPrompt: () => [...(state.systemPrompt ?? [])],
    setInterval: managed("interval", setInterval),
    setTimeout: managed("timeout", setTimeout),
    clearTimer: (timer) => {
      clearTimeout(timer);
      clearInterval(timer);
      timers.delete(timer);
    },
  };
}

function commandContext(ext, requestId) {
  const unsupported = (what) => () =>
    Promise.reject(new Error(`ctx.${what}() is not supported by omp (trio)`));
  return {
    ...context(ext, requestId),
    waitForIdle: () => call(ext, "waitForIdle", {}, { of: requestId }),
    newSession: unsupported("newSession"),
    branch: unsupported("branch"),
    navigateTree: unsupported("navigateTree"),
    switchSession: unsupported("switchSession"),
    reload: unsupported("reload"),
  };
}

function sessionManager() {
  const entries = () => {
    if (!state.sessionFile) return [];
    try {
      return fs.readFileSync(state.sessionFile, "utf8").split("\n").filter((l) => l.trim())
        .map((l) => { try { return JSON.parse(l); } catch { return null; } })
        .filter((e) => e !== null && e.type !== "session");
    } catch {
      return [];
    }
  };
  return {
    getCwd: () => state.cwd,
    getSessionId: () => state.sessionId,
    getSessionFile: () => state.sessionFile ?? undefined,
    getSessionName: () => state.sessionName ?? undefined,
    getEntries: entries,
    getBranch: entries,
  };
}

// `ctx.ui`: dialogs ask the session (which asks the host of the session, or answers the default
// at once without one); presentation calls are told and return at once.
function ui(ext, requestId) {
  const dialog = (method, params, options) => call(ext, method,
    { ...params, timeout: options?.timeout }, { of: requestId, signal: options?.signal });
  const show = (method, params) => tell(ext, method, params, requestId);
  return {
    select: async (title, options, o) => (await dialog("ui.select", { title, options }, o))
      ?? undefined,
    confirm: async (title, message, o) => Boolean(await dialog("ui.confirm", { title, message },
                                                               o)),
    input: async (title, placeholder, o) => (await dialog("ui.input", { title, placeholder }, o))
      ?? undefined,
    editor: async (title, prefill) => (await dialog("ui.editor", { title, prefill })) ?? undefined,
    notify: (message, type) => show("ui.notify", { message, notifyType: type }),
    setStatus: (key, text) => show("ui.setStatus", { key, text }),
    setWidget: (key, content, options) => {
      if (content === undefined || Array.isArray(content)) {
        show("ui.setWidget", { key, lines: content, placement: options?.placement });
      }
    },
    setTitle: (title) => show("ui.setTitle", { title }),
    setEditorText: (text) => show("ui.setEditorText", { text }),
    pasteToEditor: (text) => show("ui.setEditorText", { text }),
    getEditorText: () => "",
    custom: async () => undefined,
    setWorkingMessage() {},
    setFooter() {},
    setHeader() {},
    onTerminalInput: () => () => {},
    addAutocompleteProvider() {},
    setEditorComponent() {},
    setToolsExpanded() {},
    getToolsExpanded: () => false,
    theme: {},
    getAllThemes: async () => [],
    getTheme: async () => undefined,
    setTheme: async () => ({ success: false, error: "Theme switching not supported in RPC mode" }),
  };
}
