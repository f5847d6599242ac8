"""Harness for the login tests: a models.yml provider ``corp`` that logs in at the fake OAuth
server and answers at the fake LLM, the real ``omp --mode rpc`` read as raw frames
(``extension_helpers.open_process_host``), a "browser" that follows redirects one at a time,
and the checks that no token leaked."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import msgspec
from extension_helpers import Frame, ProcessHost

from omp.testing.fake_oauth import FakeOAuth

# No --model: until the login, corp has no credential and the offline model is the default.
ARGS = ("--mode", "rpc")
LOGIN_ID = "login-1"


def write_corp(agent_dir: Path, llm_base_url: str, oauth: dict[str, Any]) -> None:
    """models.yml with provider ``corp`` (openai-completions at the fake LLM, ``oauth`` block)."""
    config = {"providers": {"corp": {
        "baseUrl": f"{llm_base_url}/v1", "api": "openai-completions", "oauth": oauth,
        "models": [{"id": "corp-large", "contextWindow": 128000}]}}}
    # JSON is YAML.
    (agent_dir / "models.yml").write_bytes(msgspec.json.encode(config))


async def browse(url: str) -> tuple[int, str | None]:
    """One GET as a browser makes it: the status and the ``location`` it is sent on to."""
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.get(url)
    return response.status_code, response.headers.get("location")


async def start_login(host: ProcessHost, provider: str, request_id: str = LOGIN_ID) -> None:
    await host.send({"type": "login", "id": request_id, "providerId": provider})


async def login_response(host: ProcessHost, request_id: str = LOGIN_ID) -> Frame:
    frames = await host.until(lambda f: f["type"] == "response" and f.get("id") == request_id)
    return frames[-1]


async def call(host: ProcessHost, kind: str, **fields: Any) -> Frame:
    """Send a command and return its response (the frames before it are kept in ``frames``)."""
    request_id = f"{kind}-{len(host.frames)}"
    await host.send({"type": kind, "id": request_id, **fields})
    frames = await host.until(lambda f: f["type"] == "response" and f.get("id") == request_id)
    return frames[-1]


def providers_of(response: Frame) -> dict[str, Frame]:
    return {p["id"]: p for p in response["data"]["providers"]}


def auth_file(agent_dir: Path) -> dict[str, Any]:
    """auth.json, after checking that only its owner can read it."""
    path = agent_dir / "auth.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = msgspec.json.decode(path.read_bytes())
    assert isinstance(data, dict)
    return data


def leaked(fake: FakeOAuth, texts: Sequence[str]) -> list[str]:
    """The issued tokens (and codes) found in any of ``texts``."""
    return [token for token in fake.issued for text in texts if token in text]


def everything_but_auth(agent_dir: Path, host: ProcessHost) -> list[str]:
    """Every frame, the stderr and every file of the agent directory except auth.json."""
    texts = [msgspec.json.encode(host.frames).decode(), host.stderr]
    texts += [p.read_text(errors="replace") for p in agent_dir.rglob("*")
              if p.is_file() and p.name != "auth.json"]
    return texts
