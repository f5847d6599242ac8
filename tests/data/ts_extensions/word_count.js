// Plain JavaScript with a plain JSON Schema (node 20 runs it too: no types to strip), using one of
// the runtime helpers the original's package exports to extensions.
import { formatSize } from "@mariozechner/pi-coding-agent";

export default function (pi) {
	pi.registerTool({
		name: "word_count",
		label: "Word count",
		description: "Counts the words of a text.",
		parameters: {
			type: "object",
			properties: { text: { type: "string" } },
			required: ["text"],
		},
		async execute(_id, params) {
			const words = params.text.split(/\s+/).filter(Boolean).length;
			const size = formatSize(Buffer.byteLength(params.text, "utf8"));
			return { content: [{ type: "text", text: `${words} words` }], details: { words, size } };
		},
	});
	pi.registerTool({
		name: "failing",
		label: "Failing",
		description: "Always fails.",
		parameters: { type: "object", properties: {} },
		async execute() {
			throw new Error("the tool broke");
		},
	});
	pi.on("tool_result", async (event) => {
		if (event.toolName !== "word_count" || event.isError) return undefined;
		return { content: [{ type: "text", text: `${event.content[0].text} (counted by JS)` }] };
	});
}
