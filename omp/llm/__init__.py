"""LLM providers over httpx, the model registry and auth, the message builder, the one error
mapping."""
