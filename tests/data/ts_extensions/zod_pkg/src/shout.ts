export function shout(text: string, marks: number): string {
	return `${text.toUpperCase()}${"!".repeat(marks)}`;
}
