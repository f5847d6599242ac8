// What an extension gets when it imports `@oh-my-pi/pi-coding-agent` or
// `@mariozechner/pi-coding-agent` at run time (and as `pi.pi`): the few helpers those packages
// export for extensions, written for omp. Type-only imports need nothing (the types are erased);
// anything else those packages export (the TUI components, the SDK that builds sessions) does
// not exist here, and an import of it fails the extension's load with the missing name.
import os from "node:os";
import path from "node:path";

import { StringEnum, Type } from "./schema.mjs";

const HOST = Symbol.for("omp.extension-host");

function host() {
  return globalThis[HOST] ?? {};
}

/** The agent directory of the session (`~/.omp/agent` unless configured otherwise). */
export function getAgentDir() {
  return host().agentDir ?? path.join(os.homedir(), ".omp", "agent");
}

/** Not the original's version: omp's host has its own numbering. */
export const VERSION = "0.0.0-omp";

/** A tool definition as it is (a typing aid in the original). */
export function defineTool(tool) {
  return tool;
}

/** Whether a `tool_call` event is for the tool `toolName`. */
export function isToolCallEventType(toolName, event) {
  return event?.toolName === toolName;
}

const resultOf = (toolName) => (event) => event?.toolName === toolName;
export const isBashToolResult = resultOf("bash");
export const isReadToolResult = resultOf("read");
export const isEditToolResult = resultOf("edit");
export const isWriteToolResult = resultOf("write");
export const isGrepToolResult = resultOf("grep");
export const isFindToolResult = resultOf("find");
export const isLsToolResult = resultOf("ls");

/** A select option's label (options are labels or `{label, description}`). */
export function getExtensionUISelectOptionLabel(option) {
  return typeof option === "string" ? option : option?.label;
}

// --- output truncation, as the built-in tools truncate ---------------------------------------

export const DEFAULT_MAX_LINES = 2000;
export const DEFAULT_MAX_BYTES = 50 * 1024;
const MAX_LINE_CHARS = 500;

const bytes = (text) => Buffer.byteLength(text, "utf8");

/** `1023B`, `4.0KB`, `2.5MB`. */
export function formatSize(size) {
  if (size < 1024) return `${size}B`;
  if (size < 1024 * 1024) return `${(size / 1024).toFixed(1)}KB`;
  return `${(size / (1024 * 1024)).toFixed(1)}MB`;
}

function truncation(content, kept, options, extra) {
  const maxLines = options?.maxLines ?? DEFAULT_MAX_LINES;
  const maxBytes = options?.maxBytes ?? DEFAULT_MAX_BYTES;
  const lines = content.split("\n");
  const text = kept.join("\n");
  const truncatedBy = kept.length < lines.length || extra.partial
    ? (kept.length >= maxLines ? "lines" : "bytes") : null;
  return {
    content: text, truncated: truncatedBy !== null, truncatedBy,
    totalLines: lines.length, totalBytes: bytes(content),
    outputLines: kept.length, outputBytes: bytes(text),
    lastLinePartial: Boolean(extra.partial), firstLineExceedsLimit: Boolean(extra.firstTooLong),
    maxLines, maxBytes,
  };
}

/** The first lines of `content` within `maxLines` / `maxBytes`; whole lines only. */
export function truncateHead(content, options) {
  const maxLines = options?.maxLines ?? DEFAULT_MAX_LINES;
  const maxBytes = options?.maxBytes ?? DEFAULT_MAX_BYTES;
  const kept = [];
  let size = 0;
  for (const line of content.split("\n")) {
    const cost = bytes(line) + (kept.length > 0 ? 1 : 0);
    if (kept.length >= maxLines || size + cost > maxBytes) {
      return truncation(content, kept, options, { firstTooLong: kept.length === 0 });
    }
    kept.push(line);
    size += cost;
  }
  return truncation(content, kept, options, {});
}

/** The last lines of `content` within `maxLines` / `maxBytes`; a last line longer than
 * `maxBytes` alone is cut to its end. */
export function truncateTail(content, options) {
  const maxLines = options?.maxLines ?? DEFAULT_MAX_LINES;
  const maxBytes = options?.maxBytes ?? DEFAULT_MAX_BYTES;
  const lines = content.split("\n");
  const kept = [];
  let size = 0;
  for (let i = lines.length - 1; i >= 0; i--) {
    const cost = bytes(lines[i]) + (kept.length > 0 ? 1 : 0);
    if (kept.length >= maxLines || size + cost > maxBytes) {
      if (kept.length === 0) {
        const tail = Buffer.from(lines[i], "utf8").subarray(-maxBytes).toString("utf8");
        return truncation(content, [tail], options, { partial: true });
      }
      break;
    }
    kept.unshift(lines[i]);
    size += cost;
  }
  return truncation(content, kept, options, {});
}

/** One line cut to `maxChars` characters, marked when it was cut. */
export function truncateLine(line, maxChars = MAX_LINE_CHARS) {
  if (line.length <= maxChars) return { text: line, wasTruncated: false };
  return { text: `${line.slice(0, maxChars)}... [truncated]`, wasTruncated: true };
}

// --- one file changed by one writer at a time -------------------------------------------------

const queues = new Map();

/** Run `fn` once every earlier call for the same file has finished. */
export function withFileMutationQueue(filePath, fn) {
  const key = path.resolve(String(filePath));
  const previous = queues.get(key) ?? Promise.resolve();
  const next = previous.catch(() => undefined).then(() => fn());
  const settled = next.catch(() => undefined);
  queues.set(key, settled);
  settled.then(() => {
    if (queues.get(key) === settled) queues.delete(key);
  });
  return next;
}

export { StringEnum, Type };
