// A task's tool ban, as a task runner loads it with `omp -p -e deny.ts`: the rules come from the
// environment (DENY_RULES, a JSON array), each one
//   {"tool": "bash", "match": "<regex on the command>", "reason": "<what the model reads>"}
// A rule with a `match` blocks the calls it matches with its reason; a rule without one bans the
// whole tool, which is then not even offered to the model (and blocked if called anyway).
// Written for omp's tests in the style of contraagent's deny.ts (see README.md).
import type { ExtensionAPI, ToolCallEvent } from "@oh-my-pi/pi-coding-agent";
import { isToolCallEventType } from "@oh-my-pi/pi-coding-agent";

interface Rule {
	tool: string;
	match?: string;
	reason?: string;
}

function readRules(): Rule[] {
	const text = process.env.DENY_RULES;
	if (!text) return [];
	const parsed = JSON.parse(text) as unknown;
	if (!Array.isArray(parsed)) throw new Error("DENY_RULES must be a JSON array of rules");
	return parsed as Rule[];
}

function subject(event: ToolCallEvent): string {
	if (isToolCallEventType("bash", event)) return String(event.input.command ?? "");
	return JSON.stringify(event.input);
}

export default function deny(pi: ExtensionAPI): void {
	const rules = readRules();
	const banned = new Set(rules.filter((r) => !r.match).map((r) => r.tool.toLowerCase()));

	pi.on("session_start", async () => {
		if (banned.size === 0) return;
		const kept = pi.getActiveTools().filter((name) => !banned.has(name.toLowerCase()));
		await pi.setActiveTools(kept);
	});

	pi.on("tool_call", async (event: ToolCallEvent) => {
		for (const rule of rules) {
			if (rule.tool.toLowerCase() !== event.toolName.toLowerCase()) continue;
			if (rule.match && !new RegExp(rule.match).test(subject(event))) continue;
			return { block: true, reason: rule.reason ?? `The ${rule.tool} tool is not allowed in this task` };
		}
		return undefined;
	});
}
