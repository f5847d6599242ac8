"""Helpers for testing hosts and omp itself; the fake LLM server joins with the LLM providers."""
