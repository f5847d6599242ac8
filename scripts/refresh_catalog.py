"""Generate and refresh ``omp/llm/catalog.json``, the built-in providers and models.

Two sources, two commands:

``python scripts/refresh_catalog.py --from-original DIR [--write]`` rebuilds the catalog from the
original's published catalog: ``DIR`` is an installed ``@oh-my-pi/pi-catalog`` package (it comes
with ``npm install @oh-my-pi/pi-coding-agent`` in a scratch folder; never in this repository).
Its ``src/models.json`` gives every model's id, name, API, base URL, context window, output limit,
reasoning and thinking levels, input kinds, costs and wire quirks; ``src/compat/rules.json`` gives
each provider's key variables. Facts only: the numbers and names are taken, no code. Every
provider that is reached with an API key over an API this runtime speaks is taken with all its
models (``EXCLUDED`` says why the others are not); the catalog's own providers and models that
the original lacks are kept, and so are its hand-kept fields (``keyUrl``, ``modelsUrl``, local
servers). This is the refresh to run for each release of the original the port follows (it
publishes a new catalog with most releases, several a month): the package version is written
into the catalog (``source``), so a diff of ``catalog.json`` shows what changed since.

``python scripts/refresh_catalog.py [--provider NAME ...] [--write] [--add]`` compares the
catalog with each provider's own ``/models`` list, between two releases of the original.
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

The parsing is pure (``parse_models``, ``compare``, ``from_original``) and tested on recorded
payloads in ``tests/data/catalog/`` (``tests/test_refresh_catalog.py``); the fetching needs the
internet, which the machine this was written on does not have.

The file keeps one provider a line and one model a line, grouped by provider
(``"models": {"<provider>": [...]}``), so the runtime decodes only the providers it needs
(``omp.llm.models``).
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
    ours = catalog["models"].setdefault(provider, [])
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
            ours.append({
                "id": model_id, "name": model_id,
                "reasoning": bool(facts.get("reasoning", False)),
                "input": ["text", "image"] if facts.get("images") else ["text"],
                "cost": {field: facts.get("cost", {}).get(field, 0) for field in COST_FIELDS},
                "contextWindow": facts.get("contextWindow"),
                "maxTokens": facts.get("maxTokens")})
    return changes, new, gone


def grouped(catalog: dict[str, Any]) -> dict[str, Any]:
    """``catalog`` with its models grouped by provider (the layout before was one list, each
    model naming its provider)."""
    if isinstance(catalog["models"], list):
        groups: dict[str, list[dict[str, Any]]] = {}
        for model in catalog["models"]:
            model = dict(model)
            groups.setdefault(model.pop("provider"), []).append(model)
        catalog = {**catalog, "models": groups}
    return catalog


def render(catalog: dict[str, Any]) -> str:
    """The catalog in its file layout: one provider a line, one model a line, grouped by
    provider, the offline models first (a start without a key reads no further,
    ``omp.llm.models.catalog_models_of``)."""
    lines = ["{"]
    for key in ("_comment", "source"):
        if key in catalog:
            lines.append(f"  {json.dumps(key)}: {_compact(catalog[key])},")
    lines.append('  "providers": {')
    providers = list(catalog["providers"].items())
    for i, (name, entry) in enumerate(providers):
        comma = "," if i < len(providers) - 1 else ""
        lines.append(f"    {json.dumps(name)}: {_compact(entry)}{comma}")
    lines += ["  },", '  "models": {']
    groups = [(name, catalog["models"][name]) for name in catalog["providers"]
              if catalog["models"].get(name) and name != "offline"]
    if catalog["models"].get("offline"):
        groups.insert(0, ("offline", catalog["models"]["offline"]))
    for g, (name, models) in enumerate(groups):
        lines.append(f"    {json.dumps(name)}: [")
        for i, model in enumerate(models):
            lines.append(f"      {_compact(model)}{',' if i < len(models) - 1 else ''}")
        lines.append("    ]" + ("," if g < len(groups) - 1 else ""))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --- the original's published catalog ---------------------------------------------------------

APIS = {"openai-completions": "openai-completions", "openai-responses": "openai-responses",
        "anthropic-messages": "anthropic-messages", "google-generative-ai": "google-generative-ai",
        # The original's own name for OpenRouter's chat completions with its extras.
        "openrouter": "openai-completions"}
"""The original's API names this runtime speaks, and which of ours each is."""

EXCLUDED = {
    "amazon-bedrock": "AWS request signing (Bedrock Converse), not an API key",
    "bedrock-mantle": "AWS credentials and a region in the URL",
    "azure": "each user's own resource URL and deployments (a models.yml provider)",
    "cloudflare-ai-gateway": "each user's account and gateway in the URL (a models.yml provider)",
    "cursor": "Cursor's own agent protocol", "devin": "Devin's own agent protocol",
    "gitlab-duo": "a GitLab token exchanged through GitLab's proxy",
    "gitlab-duo-agent": "GitLab's own agent protocol",
    "github-copilot": "a subscription login that poses as the vendor's client",
    "openai-codex": "a subscription login that poses as the vendor's client",
    "google-gemini-cli": "a subscription login that poses as the vendor's client",
    "google-antigravity": "a subscription login that poses as the vendor's client",
    "kimi-code": "needs the vendor CLI's own identifying headers",
    "xai-oauth": "a subscription login (OAuth)", "qwen-portal": "a subscription login (OAuth)",
    "muse-code": "a subscription login (OAuth)",
    "google-vertex": "Google Cloud credentials and a project in the URL",
}
"""The original's providers not taken, and why (docs/guides/models.md says the same)."""

API_REPLACEMENTS = {"ollama-cloud": ("openai-completions", "https://ollama.com/v1")}
"""Providers the original calls over an API of its own that also serve an OpenAI-compatible
one: Ollama's cloud answers its chat completions at ``/v1`` with the same key."""


COMMENT = ("Built-in providers and models (data, not code; see docs/guides/models.md: The "
           "provider catalog). Generated by scripts/refresh_catalog.py --from-original from the "
           "original's published catalog (source); facts only. cost is USD per million tokens; "
           "contextWindow and maxTokens are tokens, null where unknown. A model's api and "
           "baseUrl are its provider's unless it says its own. Providers with discovery have no "
           "models here: they are found on the local server.")


def from_original(models: dict[str, Any], rules: dict[str, Any],
                  catalog: dict[str, Any], version: str) -> dict[str, Any]:
    """A new catalog: ``catalog`` (the current one, parsed) with every provider of the
    original's ``models`` (``models.json``: provider -> id -> model) that is reached with an
    API key over an API of ``APIS`` (not ``EXCLUDED``), all its models, the key variables of
    ``rules`` (``rules.json``). Pure: nothing is read or written here."""
    entries = rules.get("providers", {})
    providers = dict(catalog["providers"])
    grouped: dict[str, list[dict[str, Any]]] = {
        name: list(catalog["models"].get(name, [])) for name in providers}
    for name, listed in models.items():
        if name in EXCLUDED or not listed:
            continue
        rule = entries.get(name, {})
        env = list(dict.fromkeys([*rule.get("envVars", []),
                                  *rule.get("discovery", {}).get("envVars", [])]))
        if not env:
            continue  # no key variable: a login only
        converted = [(_api_of(name, m), m) for m in listed.values()]
        converted = [(where, m) for where, m in converted if where is not None]
        if not converted:
            continue
        # The provider's API and URL: those most of its models use; a model says its own
        # where it differs.
        counts: dict[tuple[str, str], int] = {}
        for where, _ in converted:
            assert where is not None
            counts[where] = counts.get(where, 0) + 1
        api, base_url = max(counts, key=lambda k: counts[k])
        old = providers.get(name, {})
        entry = {"name": old.get("name") or rule.get("discovery", {}).get("label") or name,
                 "api": api, "baseUrl": base_url,
                 "env": list(dict.fromkeys([*env, *old.get("env", [])]))}
        for key in ("auth", "discovery", "modelsUrl", "keyUrl"):
            if key in old:
                entry[key] = old[key]
        if rule.get("defaultModel") in listed:
            entry["defaultModel"] = rule["defaultModel"]
        new_models = [_model_of(m, where, (api, base_url)) for where, m in converted]
        compat = _shared_compat(new_models)
        if api == "openai-completions" and name == "openrouter":
            # OpenRouter routes a request to one of several upstreams, each with its own
            # output limit: the catalog's is not sent unless asked for, as the original does.
            compat["sendMaxTokens"] = False
        if compat:
            entry["compat"] = compat
        for model in new_models:
            own = {k: v for k, v in model.get("compat", {}).items() if compat.get(k) != v}
            if own:
                model["compat"] = own
            else:
                model.pop("compat", None)
        ids = {m["id"] for m in new_models}
        # A model of ours the original does not list keeps the API, URL and quirks it was
        # written and tested with.
        kept = [_kept(m, old, entry) for m in grouped.get(name, []) if m["id"] not in ids]
        providers[name] = entry
        grouped[name] = new_models + kept
    # The original's providers after ours, the local servers and offline last.
    local = [n for n, e in providers.items() if e.get("discovery") or n == "offline"]
    order = [n for n in providers if n not in local] + local
    out = {"_comment": COMMENT,
           "source": {"package": "@oh-my-pi/pi-catalog", "version": version},
           "providers": {n: providers[n] for n in order},
           "models": {n: grouped[n] for n in order if grouped.get(n)}}
    return out


def _kept(model: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    model = dict(model)
    api, base_url = model.get("api", old.get("api")), model.get("baseUrl", old.get("baseUrl"))
    model.pop("api", None)
    model.pop("baseUrl", None)
    if (api, base_url) != (new["api"], new["baseUrl"]):
        model["api"], model["baseUrl"] = api, base_url
    compat = {**old.get("compat", {}), **model.get("compat", {})}
    compat = {k: v for k, v in compat.items() if new.get("compat", {}).get(k) != v}
    model.pop("compat", None)
    if compat:
        model["compat"] = compat
    return model


def _api_of(provider: str, model: dict[str, Any]) -> tuple[str, str] | None:
    if provider in API_REPLACEMENTS:
        return API_REPLACEMENTS[provider]
    api = APIS.get(model.get("api", ""))
    base_url = model.get("baseUrl") or ""
    if api is None or not base_url.startswith("https://") or "{" in base_url or "<" in base_url:
        return None
    return api, base_url.rstrip("/")


_THINKING_MODES = {"effort", "budget", "google-level", "anthropic-adaptive",
                   "anthropic-budget-effort"}


def _model_of(model: dict[str, Any], where: tuple[str, str] | None,
              default: tuple[str, str]) -> dict[str, Any]:
    """One model in the catalog's fields (``CatalogModel``)."""
    cost = model.get("cost") or {}
    out: dict[str, Any] = {
        "id": model["id"], "name": model.get("name") or model["id"],
        "reasoning": bool(model.get("reasoning")),
        "input": ["text", "image"] if "image" in model.get("input", []) else ["text"],
        "cost": {field: _price(cost.get(field)) for field in COST_FIELDS},
        "contextWindow": _positive(model.get("contextWindow")),
        "maxTokens": _positive(model.get("maxTokens")),
    }
    thinking = model.get("thinking")
    if out["reasoning"] and isinstance(thinking, dict) and thinking.get("mode") in _THINKING_MODES:
        kept = {"mode": thinking["mode"], "efforts": list(thinking.get("efforts", []))}
        for key in ("defaultLevel", "effortMap"):
            if thinking.get(key):
                kept[key] = thinking[key]
        out["thinking"] = kept
    if where is not None and where != default:
        out["api"], out["baseUrl"] = where
    compat = _compat_of(model, (where or default)[0])
    if compat:
        out["compat"] = compat
    return out


def _compat_of(model: dict[str, Any], api: str) -> dict[str, Any]:
    """The original's wire quirks this runtime reads (``omp.llm.providers``)."""
    theirs = model.get("compat") or {}
    out: dict[str, Any] = {}
    if model.get("omitMaxOutputTokens"):
        out["sendMaxTokens"] = False
    if api == "openai-responses" and theirs.get("supportsReasoningEffort") is False:
        out["supportsReasoningEffort"] = False
    if api != "openai-completions":
        return out
    if theirs.get("maxTokensField") == "max_tokens":
        out["maxTokensField"] = "max_tokens"
    if theirs.get("thinkingFormat") in ("openrouter", "zai"):
        out["thinkingFormat"] = theirs["thinkingFormat"]
    for flag in ("supportsUsageInStreaming", "supportsReasoningEffort"):
        if theirs.get(flag) is False:
            out[flag] = False
    if theirs.get("supportsDeveloperRole") is True:
        out["supportsDeveloperRole"] = True
    if theirs.get("requiresToolResultName") is True:
        out["requiresToolResultName"] = True
    if theirs.get("requiresMistralToolIds") is True:
        out["toolCallIdFormat"] = "alnum9"
    return out


def _shared_compat(models: list[dict[str, Any]]) -> dict[str, Any]:
    """The quirks every model of a provider has (said once, on the provider)."""
    if not models:
        return {}
    shared = dict(models[0].get("compat", {}))
    for model in models[1:]:
        own = model.get("compat", {})
        shared = {k: v for k, v in shared.items() if own.get(k) == v}
    return shared


def _price(value: Any) -> float | int:
    number = _number(value)
    if number is None:
        return 0
    return int(number) if number == int(number) else round(number, 6)


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read_original(directory: Path) -> tuple[dict[str, Any], dict[str, Any], str]:
    """``models.json``, ``rules.json`` and the version of an installed pi-catalog package."""
    models = json.loads((directory / "src" / "models.json").read_text())
    rules = json.loads((directory / "src" / "compat" / "rules.json").read_text())
    version = json.loads((directory / "package.json").read_text()).get("version", "?")
    return models, rules, str(version)


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
    parser.add_argument("--from-original", type=Path, metavar="DIR",
                        help="rebuild from an installed @oh-my-pi/pi-catalog package")
    args = parser.parse_args(argv)
    catalog = grouped(json.loads(args.catalog.read_text()))
    if args.from_original is not None:
        models, rules, version = read_original(args.from_original)
        new = from_original(models, rules, catalog, version)
        for name, listed in new["models"].items():
            before = len(catalog["models"].get(name, []))
            if len(listed) != before:
                print(f"{name}: {before} -> {len(listed)} models")
        if args.write:
            args.catalog.write_text(render(new))
        return 0
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
