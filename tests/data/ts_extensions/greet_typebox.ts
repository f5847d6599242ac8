// A tool with a TypeBox schema and a type-only import of the original's package: the schema
// library comes from `typebox` (omp's stand-in when the extension has none installed).
import type { ExtensionAPI, ExtensionContext } from "@mariozechner/pi-coding-agent";
import { Type, type Static } from "typebox";

const Params = Type.Object({
	name: Type.String({ description: "Who to greet" }),
	times: Type.Optional(Type.Integer({ minimum: 1 })),
});
type Params = Static<typeof Params>;

export default function (pi: ExtensionAPI) {
	pi.registerTool({
		name: "greet",
		label: "Greet",
		description: "Greets someone",
		parameters: Params,
		async execute(toolCallId: string, params: Params, signal: AbortSignal | undefined, onUpdate, ctx: ExtensionContext) {
			const times = params.times ?? 1;
			onUpdate?.({ content: [{ type: "text", text: "greeting..." }], details: {} });
			return {
				content: [{ type: "text", text: Array(times).fill(`Hello, ${params.name}!`).join(" ") }],
				details: { cwd: ctx.cwd, toolCallId, aborted: signal?.aborted ?? false },
			};
		},
	});
}
