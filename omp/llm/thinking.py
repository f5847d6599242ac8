"""Thinking levels: which a model offers, clamping, cycling, provider parameters
(docs/design/agent-loop.md#thinking-levels).

Levels rank in the order of ``THINKING_LEVELS`` (``off`` < ``minimal`` < ... < ``xhigh`` < ``max``).
A model offers ``off`` plus its efforts: those its ``thinking.efforts`` declares, else the default
ladder ``minimal``..``high`` (+ ``xhigh`` for ``anthropic-messages``); ``max`` only when declared.
Any level may be asked for; it is clamped to the highest offered level not above it (else the
lowest offered one), so ``max`` on a model that tops out at ``high`` is ``high``. Cycling walks the
offered levels in rank order and wraps to ``off``: ``high`` -> ``xhigh`` -> ``max`` -> ``off`` on a
model that offers them all.
"""

from __future__ import annotations

from typing import Any

from ..protocol.payloads import Model
from .types import THINKING_LEVELS, ThinkingLevel

_DEFAULT_EFFORTS: tuple[ThinkingLevel, ...] = ("minimal", "low", "medium", "high")
ANTHROPIC_BUDGETS: dict[ThinkingLevel, int] = {
    "minimal": 1024, "low": 4096, "medium": 8192, "high": 16384, "xhigh": 32768, "max": 32768}
GOOGLE_BUDGETS: dict[ThinkingLevel, int] = {
    "minimal": 1024, "low": 4096, "medium": 8192, "high": 16384, "xhigh": 24575, "max": 32768}
GOOGLE_LEVELS: dict[ThinkingLevel, str] = {
    "minimal": "MINIMAL", "low": "LOW", "medium": "MEDIUM", "high": "HIGH", "xhigh": "HIGH",
    "max": "HIGH"}


def efforts(model: Model) -> tuple[ThinkingLevel, ...]:
    """The levels above ``off`` the model supports, lowest first."""
    if not model.reasoning:
        return ()
    declared = getattr(model.thinking, "efforts", None) if model.thinking else None
    if declared:
        return tuple(lv for lv in THINKING_LEVELS if lv in declared and lv != "off")
    if model.api == "anthropic-messages":
        return (*_DEFAULT_EFFORTS, "xhigh")
    return _DEFAULT_EFFORTS


def available_levels(model: Model) -> list[ThinkingLevel]:
    """``off`` plus the supported efforts; only ``off`` for a model without reasoning."""
    return ["off", *efforts(model)]


def clamp(model: Model, level: ThinkingLevel) -> ThinkingLevel:
    """The highest supported level not above ``level``, else the lowest supported one."""
    supported = efforts(model)
    if level == "off" or not supported:
        return "off"
    rank = THINKING_LEVELS.index(level)
    below = [lv for lv in supported if THINKING_LEVELS.index(lv) <= rank]
    return below[-1] if below else supported[0]


def openai_effort(model: Model, level: ThinkingLevel) -> str | None:
    """``reasoning_effort`` / ``reasoning.effort``; ``None`` means: send no reasoning field."""
    level = clamp(model, level)
    if level == "off":
        return None
    mapping = getattr(model.thinking, "effortMap", None) if model.thinking else None
    if isinstance(mapping, dict) and level in mapping:
        return str(mapping[level])
    return level


def anthropic_thinking(model: Model, level: ThinkingLevel, max_tokens: int
                       ) -> tuple[dict[str, Any] | None, int]:
    """The ``thinking`` object and the ``max_tokens`` to send with it (budget mode)."""
    level = clamp(model, level)
    if level == "off":
        return None, max_tokens
    budget = ANTHROPIC_BUDGETS[level]
    ceiling = model.maxTokens or (max_tokens + budget)
    total = min(max_tokens + budget, ceiling)
    if total <= budget:
        # The model's ceiling leaves no room for both: keep 1024 tokens for the answer, and
        # leave thinking out when the rest is below the API's 1024-token minimum budget.
        budget = total - 1024
        if budget < 1024:
            return None, max_tokens
    return {"type": "enabled", "budget_tokens": budget}, total


def google_thinking_config(model: Model, level: ThinkingLevel) -> dict[str, Any] | None:
    """``generationConfig.thinkingConfig``: a level for Gemini 3, a budget for Gemini 2.x."""
    level = clamp(model, level)
    if not model.reasoning:
        return None
    if level == "off":
        # Gemini 2.5 Flash can turn thinking off with a zero budget; 3.x cannot go below
        # its lowest level, so leave the config out there.
        return None if "gemini-3" in model.id else {"thinkingBudget": 0}
    if "gemini-3" in model.id:
        return {"thinkingLevel": GOOGLE_LEVELS[level], "includeThoughts": True}
    return {"thinkingBudget": GOOGLE_BUDGETS[level], "includeThoughts": True}


def cycle(model: Model, current: ThinkingLevel) -> ThinkingLevel | None:
    """The next level after ``current`` (wrapping); ``None`` for a model without reasoning."""
    levels = available_levels(model)
    if len(levels) == 1:
        return None
    current = clamp(model, current)
    return levels[(levels.index(current) + 1) % len(levels)]
