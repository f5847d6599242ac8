// An extension whose factory fails: a load error, never a silent one.
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";

export default function broken(pi: ExtensionAPI): void {
	pi.registerCommand("never", { description: "registered before the failure", handler: async () => {} });
	throw new Error("deny rules could not be read");
}
