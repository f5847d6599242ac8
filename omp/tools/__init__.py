"""Built-in coding tools, truncation and the Tool protocol (issue: coding tools)."""
