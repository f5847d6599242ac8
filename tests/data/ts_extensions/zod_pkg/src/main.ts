// A package whose package.json names its entry (`omp.extensions`); the tool's schema is built with
// the injected `pi.zod`, and a command answers through `ctx.ui`.
import type { ExtensionAPI } from "@oh-my-pi/pi-coding-agent";
import { shout } from "./shout.ts";

export default function (pi: ExtensionAPI) {
	const z = pi.zod;
	pi.registerTool({
		name: "shout",
		label: "Shout",
		description: "Says a text loudly",
		parameters: z.object({ text: z.string().describe("What to say"), marks: z.number().int().optional() }),
		async execute(_id: string, params: { text: string; marks?: number }) {
			return { content: [{ type: "text", text: shout(params.text, params.marks ?? 1) }] };
		},
	});
	pi.registerCommand("where", {
		description: "Says where the session works",
		handler: async (_args, ctx) => ctx.ui.notify(`cwd: ${ctx.cwd}`, "info"),
	});
}
