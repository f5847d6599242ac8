"""LLM providers over httpx, the model registry and auth (issue: LLM providers)."""
