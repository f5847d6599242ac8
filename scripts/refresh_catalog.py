"""Refresh ``omp/llm/catalog.json`` from each provider's own model list.

Run: ``python scripts/refresh_catalog.py [--provider NAME ...] [--write] [--add]``.

For every catalog provider with a ``modelsUrl`` whose key variable is set (Google's list is
read with ``?key=``; OpenRouter's needs no key), it fetches the list and compares it with the
catalog: a limit or price the provider reports that differs from ours is printed and, with
``--write``, written back; models the provider lists that the catalog lacks are printed (and
added with ``--add``, limits as reported, flags off, to be checked by hand); catalog models it
no longer lists are printed, never removed. What each provider's list says:

* OpenRouter: context, output limit, prices (USD per token, as strings), modalities,
  whether ``reasoning`` is a supported parameter — the richest list, and keyless;
* Groq: ``context_window``, ``max_completion_tokens``;
* Mistral: ``max_context_length``, ``capabilities.vision``;
* Together: ``context_length``, ``pricing`` (USD per million);
* Google: ``inputTokenLimit``, ``outputTokenLimit``, ``thinking``;
* the others (OpenAI-style ``{"data": [{"id": ...}]}``): ids, and a context length when they
  give one (``context_length``, ``context_window``, ``max_model_len``).

Prices are rarely in a list: for the other providers they come from their pricing pages, by
hand. The parsing is pure (``parse_models``, ``compare``) and tested on recorded payloads in
``tests/data/catalog/`` (``tests/test_refresh_catalog.py``); the fetching needs the internet,
which the machine this was written on does not have.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

CATALOG = Path(__file__).resolve().parent.parent / "omp" / "llm" / "catalog.json"
LIMIT_FIELDS = ("contextWindow", "maxTokens")
COST_FIELDS = ("input", "output", "cacheRead", "cacheWrite")


def parse_models(provider: str, payload: Any) -> dict[str, dict[str, Any]]:
    """Model id → what the provider's list says about it, in the catalog's field names
    (``contextWindow``, ``maxTokens``, ``cost`` {input, output...} per million, ``images``,
    ``reasoning``); only what the list gives. Entries without a usable id are skipped."""
    if provider == "google":
        items = payload.get("models", []) if isinstance(payload, dict) else []
    else:
        items = payload.get("data", []) if isinstance(payload, dict) else []
    out: dict[str, dict[str, Any]] = {}
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        model_id = item.get("name") if provider == "google" else item.get("id")
        if not isinstance(model_id, str) or not model_id:
            continue
        if provider == "google":
            model_id = model_id.removeprefix("models/")
        out[model_id] = _facts(provider, item)
    return out


def _facts(provider: str, item: dict[str, Any]) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    if provider == "openrouter":
        _int_into(facts, "contextWindow", item.get("context_length"))
        top = _object(item.get("top_provider"))
        _int_into(facts, "maxTokens", top.get("max_completion_tokens"))
        pricing = _object(item.get("pricing"))
        cost = {}
        for ours, theirs in (("input", "prompt"), ("output", "completion"),
                             ("cacheRead", "input_cache_read"),
                             ("cacheWrite", "input_cache_write")):
            per_token = _number(pricing.get(theirs))
            if per_token is not None:
                cost[ours] = round(per_token * 1_000_000, 6)
        if cost:
            facts["cost"] = cost
        arch = _object(item.get("architecture"))
        modalities = arch.get("input_modalities")
        if isinstance(modalities, list):
            facts["images"] = "image" in modalities
        params = item.get("supported_parameters")
        if isinstance(params, list):
            facts["reasoning"] = "reasoning" in params
    elif provider == "groq":
        _int_into(facts, "contextWindow", item.get("context_window"))
        _int_into(facts, "maxTokens", item.get("max_completion_tokens"))
    elif provider == "mistral":
        _int_into(facts, "contextWindow", item.get("max_context_length"))
        caps = item.get("capabilities")
        if isinstance(caps, dict) and isinstance(caps.get("vision"), bool):
            facts["images"] = caps["vision"]
    elif provider == "google":
        _int_into(facts, "contextWindow", item.get("inputTokenLimit"))
        _int_into(facts, "maxTokens", item.get("outputTokenLimit"))
        if isinstance(item.get("thinking"), bool):
            facts["reasoning"] = item["thinking"]
    else:
        for name in ("context_length", "context_window", "max_model_len"):
            if _int_into(facts, "contextWindow", item.get(name)):
                break
        together = _object(item.get("pricing")) if provider == "together" else {}
        if together:
            cost = {ours: float(value) for ours, theirs in (("input", "input"),
                                                            ("output", "output"))
                    if (value := _number(together.get(theirs))) is not None}
            if cost:
                facts["cost"] = cost
    return facts


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int_into(facts: dict[str, Any], field: str, value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        facts[field] = value
        return True
    return False


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value >= 0 else None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if number >= 0 else None
    return None


def compare(catalog: dict[str, Any], provider: str, listed: dict[str, dict[str, Any]], *,
            add: bool = False) -> tuple[list[str], list[str], list[str]]:
    """Update ``catalog`` (the parsed JSON) in place with what ``listed`` says for
    ``provider``. Returns (changes made, ids listed but not in the catalog, catalog ids no
    longer listed), each as lines for people. With ``add`` the unlisted ids are appended."""
    changes: list[str] = []
    ours = [m for m in catalog["models"] if m["provider"] == provider]
    known = {m["id"] for m in ours}
    for model in ours:
        facts = listed.get(model["id"])
        if facts is None:
            continue
        for field in LIMIT_FIELDS:
            if field in facts and facts[field] != model.get(field):
                changes.append(f"{provider}/{model['id']}: {field} {model.get(field)} -> "
                               f"{facts[field]}")
                model[field] = facts[field]
        for field, value in facts.get("cost", {}).items():
            if value != model["cost"].get(field):
                changes.append(f"{provider}/{model['id']}: cost.{field} "
                               f"{model['cost'].get(field)} -> {value}")
                model["cost"][field] = value
        if "images" in facts and facts["images"] != ("image" in model["input"]):
            changes.append(f"{provider}/{model['id']}: images -> {facts['images']}")
            model["input"] = ["text", "image"] if facts["images"] else ["text"]
    new = sorted(set(listed) - known)
    gone = sorted(known - set(listed))
    if add:
        for model_id in new:
            facts = listed[model_id]
            catalog["models"].append({
                "provider": provider, "id": model_id, "name": model_id,
                "reasoning": bool(facts.get("reasoning", False)),
                "input": ["text", "image"] if facts.get("images") else ["text"],
                "cost": {field: facts.get("cost", {}).get(field, 0) for field in COST_FIELDS},
                "contextWindow": facts.get("contextWindow"),
                "maxTokens": facts.get("maxTokens")})
    return changes, new, gone


def render(catalog: dict[str, Any]) -> str:
    """The catalog in its file layout: one provider, one model a line."""
    lines = ["{", f'  "_comment": {json.dumps(catalog["_comment"])},', '  "providers": {']
    providers = list(catalog["providers"].items())
    for i, (name, entry) in enumerate(providers):
        comma = "," if i < len(providers) - 1 else ""
        lines.append(f"    {json.dumps(name)}: {json.dumps(entry)}{comma}")
    lines += ["  },", '  "models": [']
    models = catalog["models"]
    # The offline models stay last, as the catalog keeps them.
    models = ([m for m in models if m["provider"] != "offline"]
              + [m for m in models if m["provider"] == "offline"])
    for i, model in enumerate(models):
        lines.append(f"    {json.dumps(model)}{',' if i < len(models) - 1 else ''}")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def fetch(provider: str, entry: dict[str, Any]) -> Any:
    """The provider's model list as parsed JSON; raises for a failure (said by the caller)."""
    import httpx

    url = entry["modelsUrl"]
    key = next((os.environ[name] for name in entry["env"] if os.environ.get(name)), None)
    headers: dict[str, str] = {}
    params: dict[str, str] = {}
    if provider == "google" and key:
        params["key"] = key
    elif entry["api"] == "anthropic-messages" and key:
        headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    elif key:
        headers = {"authorization": f"Bearer {key}"}
    response = httpx.get(url, headers=headers, params=params, timeout=30)
    response.raise_for_status()
    return response.json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", action="append", help="only these (repeatable)")
    parser.add_argument("--write", action="store_true", help="write the changes back")
    parser.add_argument("--add", action="store_true", help="add the models the catalog lacks")
    parser.add_argument("--catalog", type=Path, default=CATALOG)
    args = parser.parse_args(argv)
    catalog = json.loads(args.catalog.read_text())
    failed = 0
    for provider, entry in catalog["providers"].items():
        if args.provider and provider not in args.provider:
            continue
        if not entry.get("modelsUrl"):
            continue
        keyless = provider == "openrouter"
        if not keyless and not any(os.environ.get(name) for name in entry["env"]):
            print(f"{provider}: skipped (set {' or '.join(entry['env'])})")
            continue
        try:
            payload = fetch(provider, entry)
        except Exception as exc:  # any failure of one provider is reported, the rest go on
            print(f"{provider}: failed: {exc}", file=sys.stderr)
            failed += 1
            continue
        changes, new, gone = compare(catalog, provider, parse_models(provider, payload),
                                     add=args.add)
        for line in changes:
            print(line)
        if new:
            print(f"{provider}: listed, not in the catalog: {', '.join(new)}")
        if gone:
            print(f"{provider}: in the catalog, no longer listed: {', '.join(gone)}")
    if args.write:
        args.catalog.write_text(render(catalog))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
