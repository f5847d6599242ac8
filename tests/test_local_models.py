"""Local model servers (issue 26): Ollama, llama.cpp, LM Studio and vLLM asked for their models
after ``ready``. The servers are the fake LLM on free loopback ports (``localModels.servers``
points at them), answering Ollama's ``/api/tags`` or an OpenAI-style ``/v1/models`` with
payloads recorded from real servers (``tests/data/local/``), and a server that accepts and
never answers."""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import sys
from pathlib import Path
from typing import Any

import attrs
import msgspec
import pytest
import trio
from agent_helpers import text_reply, to_frame

from omp.client import RpcClient
from omp.config import ConfigError
from omp.llm.local import (
    LocalDiscovery,
    list_url,
    parse_ollama_show,
    parse_ollama_tags,
    parse_openai_models,
)
from omp.llm.models import LocalServer, ModelRegistry, ollama_url, read_catalog
from omp.llm.stream import HttpClient
from omp.session.settings import LocalModelsSettings, load_settings
from omp.testing.fake_llm import open_fake_llm

LIMIT = 60.0
DATA = Path(__file__).resolve().parent / "data" / "local"
CATALOG = read_catalog()


def recorded(name: str) -> Any:
    return json.loads((DATA / f"{name}.json").read_text())


def dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def tags_reply(payload: Any) -> dict[str, Any]:
    return {"match": {"path": "/api/tags"}, "repeat": True, "body": payload}


NO_SHOW = {"match": {"path": "/api/show"}, "repeat": True, "status": 404,
           "body": {"error": "model not found"}}
"""Ollama's answer to ``/api/show`` for a model it does not know: the fake Ollama of a test
about something else answers so (else a show would take the reply meant for a prompt)."""


def models_reply(payload: Any) -> dict[str, Any]:
    return {"match": {"path": "/v1/models"}, "repeat": True, "body": payload}


def write_config(agent_dir: Path, servers: dict[str, str], **fields: Any) -> None:
    """``localModels`` in the global config.yml: every local provider at ``servers`` or at a
    dead port (so no real server on a default port is asked)."""
    every = {name: f"http://127.0.0.1:{dead_port()}/v1" for name in
             ("ollama", "llama.cpp", "lm-studio", "vllm")}
    # A loaded machine can take longer than the default second to start the process and ask
    # a fake server; the servers here answer (or are refused) at once, so a long bound costs
    # nothing. A test of the timeout passes its own.
    fields.setdefault("timeoutMs", 20000)
    section = {"servers": {**every, **servers}, **fields}
    (agent_dir / "config.yml").write_text(json.dumps({"localModels": section}))


@attrs.define(eq=False)
class SilentServer:
    """Accepts TCP connections, reads what comes, never answers."""

    port: int = 0
    accepted: int = 0
    requests: int = 0
    """Connections that sent something (an HTTP request)."""
    open: int = 0
    _changed: trio.Event = attrs.field(factory=trio.Event)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Any) -> None:
        while not predicate(self):
            await self._changed.wait()

    async def handle(self, stream: trio.SocketStream) -> None:
        self.accepted += 1
        self.open += 1
        self._notify()
        got = False
        try:
            while await stream.receive_some(65536):
                if not got:
                    got = True
                    self.requests += 1
                    self._notify()
        except trio.BrokenResourceError:
            pass
        finally:
            self.open -= 1
            self._notify()


async def start_silent(nursery: trio.Nursery) -> SilentServer:
    server = SilentServer()
    listeners = await nursery.start(functools.partial(trio.serve_tcp, server.handle, 0,
                                                      host="127.0.0.1"))
    server.port = listeners[0].socket.getsockname()[1]
    return server


# --- parsing what servers say -------------------------------------------------------------


def server(provider: str, url: str = "http://127.0.0.1:1/v1") -> LocalServer:
    discovery = CATALOG.providers[provider].discovery
    assert discovery is not None
    return LocalServer(provider, discovery, url)


def test_ollama_tags() -> None:
    models = parse_ollama_tags(recorded("ollama_tags"), server("ollama"),
                               CATALOG.providers["ollama"])
    assert models is not None
    assert [(x.id, x.input) for x in models] == [
        ("qwen3:8b", ["text"]), ("llava:7b", ["text", "image"]), ("gpt-oss:20b", ["text"])]
    first = models[0]
    assert (first.provider, first.api, first.baseUrl) == (
        "ollama", "openai-completions", "http://127.0.0.1:1/v1")
    assert first.contextWindow is None  # the tags do not say
    assert first.cost.input == first.cost.output == 0
    assert first.compat == CATALOG.providers["ollama"].compat


@pytest.mark.parametrize(("provider", "name", "expected"), [
    ("llama.cpp", "llamacpp_models", [("Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf", None)]),
    ("vllm", "vllm_models", [("Qwen/Qwen3-Coder-30B-A3B-Instruct", 65536)]),
    ("lm-studio", "lmstudio_models", [("qwen/qwen3-coder-30b", None)]),  # no embedding model
])
def test_openai_style_lists(provider: str, name: str,
                            expected: list[tuple[str, int | None]]) -> None:
    models = parse_openai_models(recorded(name), server(provider), CATALOG.providers[provider])
    assert models is not None
    assert [(x.id, x.contextWindow) for x in models] == expected
    assert {x.provider for x in models} == {provider}


@pytest.mark.parametrize("payload", [None, [], {"models": "x"}, {"data": {}}, "<html>", 3])
def test_anything_else_is_no_server(payload: Any) -> None:
    assert parse_ollama_tags(payload, server("ollama"), CATALOG.providers["ollama"]) is None
    assert parse_openai_models(payload, server("vllm"), CATALOG.providers["vllm"]) is None


def test_where_each_server_is_asked(tmp_path: Path) -> None:
    reg = ModelRegistry.load(tmp_path, environ={})
    urls = {s.provider: list_url(s) for s in reg.local_servers()}
    assert urls == {"ollama": "http://127.0.0.1:11434/api/tags",
                    "llama.cpp": "http://127.0.0.1:8080/v1/models",
                    "lm-studio": "http://127.0.0.1:1234/v1/models",
                    "vllm": "http://127.0.0.1:8000/v1/models"}
    # A models.yml baseUrl moves a server; the setting moves it again.
    (tmp_path / "models.yml").write_text(
        "providers:\n  ollama: {baseUrl: 'http://gpu-box:11434/v1'}\n")
    reg = ModelRegistry.load(tmp_path, environ={})
    moved = {s.provider: s.base_url for s in reg.local_servers()}
    assert moved["ollama"] == "http://gpu-box:11434/v1"
    chosen = {s.provider: s.base_url for s in reg.local_servers(
        {"ollama": "http://127.0.0.1:9/v1/"})}
    assert chosen["ollama"] == "http://127.0.0.1:9/v1"


# --- the discovery, in process ------------------------------------------------------------


async def test_discovery_finds_what_answers_and_skips_the_rest(tmp_path: Path) -> None:
    reg = ModelRegistry.load(tmp_path, environ={})
    async with open_fake_llm([tags_reply(recorded("ollama_tags"))]) as ollama, \
            open_fake_llm([models_reply(recorded("vllm_models"))]) as vllm, \
            open_fake_llm([{"match": {"path": "/v1/models"}, "repeat": True,
                            "body": "<html>not a model server</html>"}]) as other:
        servers = reg.local_servers({
            "ollama": ollama.base_url + "/v1", "vllm": vllm.base_url + "/v1",
            "lm-studio": other.base_url + "/v1",
            "llama.cpp": f"http://127.0.0.1:{dead_port()}/v1"})
        http = HttpClient()
        discovery = LocalDiscovery(reg, http, servers, timeout=10)
        with trio.fail_after(LIMIT):
            await discovery.run()
        await http.aclose()
    assert discovery.found == {"ollama": 3, "vllm": 1}
    assert discovery.finished.is_set()
    available = {(x.provider, x.id) for x in reg.available()}
    assert available == {("ollama", "qwen3:8b"), ("ollama", "llava:7b"),
                         ("ollama", "gpt-oss:20b"),
                         ("vllm", "Qwen/Qwen3-Coder-30B-A3B-Instruct")}
    assert reg.credential("ollama") == "notNeeded"
    assert [r.path for r in ollama.requests if r.path != "/api/show"] == ["/api/tags"]
    # Asked again, a server's list replaces what it listed before.
    reg.set_local_models("ollama", [])
    assert not any(x.provider == "ollama" for x in reg.models)


async def test_strange_answers_count_as_no_server(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    reg = ModelRegistry.load(tmp_path, environ={})
    huge = {"models": [{"name": f"model-{i:07d}"} for i in range(60_000)]}  # > 1 MiB
    nested = "[" * 100_000 + "]" * 100_000
    async with open_fake_llm([tags_reply(huge)]) as ollama, \
            open_fake_llm([{"match": {"path": "/v1/models"}, "repeat": True,
                            "body": nested}]) as vllm, \
            open_fake_llm([{"match": {"path": "/v1/models"}, "repeat": True, "status": 500,
                            "body": {"data": [{"id": "x"}]}}]) as lmstudio, \
            open_fake_llm([models_reply({"data": [{"id": "x" * 300}, {"id": 5}]})]) as llama:
        servers = reg.local_servers({"ollama": ollama.base_url + "/v1",
                                     "vllm": vllm.base_url + "/v1",
                                     "lm-studio": lmstudio.base_url + "/v1",
                                     "llama.cpp": llama.base_url + "/v1"})
        http = HttpClient()
        discovery = LocalDiscovery(reg, http, servers, timeout=20)
        with trio.fail_after(LIMIT):
            await discovery.run()
        await http.aclose()
    assert discovery.found == {"llama.cpp": 0}  # a list, but of nothing usable
    assert capsys.readouterr().err == ""  # each one an expected answer, none a failure
    assert ollama.requests[0].headers["accept-encoding"] == "identity"
    assert not any(x.provider in ("ollama", "vllm", "lm-studio", "llama.cpp")
                   for x in reg.models)


async def test_a_key_is_sent_when_its_variable_is_set(tmp_path: Path) -> None:
    reg = ModelRegistry.load(tmp_path, environ={"VLLM_API_KEY": "vllm-secret"})
    async with open_fake_llm([models_reply(recorded("vllm_models"))]) as vllm:
        http = HttpClient()
        servers = [s for s in reg.local_servers({"vllm": vllm.base_url + "/v1"})
                   if s.provider == "vllm"]
        with trio.fail_after(LIMIT):
            await LocalDiscovery(reg, http, servers, timeout=10).run()
        await http.aclose()
    assert vllm.requests[0].headers["authorization"] == "Bearer vllm-secret"
    assert reg.credential("vllm") == "env"


async def test_a_server_that_never_answers_is_given_up(tmp_path: Path,
                                                       autojump_clock: trio.abc.Clock) -> None:
    reg = ModelRegistry.load(tmp_path, environ={})
    async with trio.open_nursery() as nursery:
        silent = await start_silent(nursery)
        servers = [s for s in reg.local_servers({"ollama": f"http://127.0.0.1:{silent.port}/v1"})
                   if s.provider == "ollama"]
        http = HttpClient()
        discovery = LocalDiscovery(reg, http, servers, timeout=2.0)
        start = trio.current_time()
        await discovery.run()
        assert trio.current_time() - start == pytest.approx(2.0)
        await http.aclose()
        await silent.wait_until(lambda s: s.open == 0)
        nursery.cancel_scope.cancel()
    assert silent.requests == 1
    assert discovery.found == {}
    assert not any(x.provider == "ollama" for x in reg.models)


# --- through the process ------------------------------------------------------------------


def process_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OMP_LOCAL_MODELS", None)  # conftest turns the discovery off; these want it
    return env


async def call(client: RpcClient, type: str, **fields: Any) -> dict[str, Any]:
    response = to_frame(await client.request({"type": type, **fields}))
    assert response["success"] is True, response
    return response


async def prompt(client: RpcClient, text: str) -> list[dict[str, Any]]:
    frames = [await call(client, "prompt", message=text)]
    while frames[-1]["type"] != "session_settled":
        frames.append(to_frame(await client.events.receive()))
    return frames


def reply_text(frames: list[dict[str, Any]]) -> str:
    end = [f for f in frames if f["type"] == "message_end"
           and f["message"]["role"] == "assistant"][-1]
    return "".join(b.get("text", "") for b in end["message"]["content"])


async def test_fake_ollama_and_llamacpp_discovered_and_used_for_a_prompt(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_fake_llm([tags_reply(recorded("ollama_tags")), NO_SHOW,
                                  text_reply("Hi from Ollama")]) as ollama, \
                open_fake_llm([models_reply(recorded("llamacpp_models")),
                               text_reply("Hi from llama.cpp")]) as llamacpp:
            write_config(isolated_agent_dir, {"ollama": ollama.base_url + "/v1",
                                              "llama.cpp": llamacpp.base_url + "/v1"},
                         timeoutMs=20000)
            async with RpcClient.spawn(args=["--mode", "rpc", "--no-session"], cwd=tmp_path,
                                       env=process_env(),
                                       max_buffered_events=math.inf) as client:
                # Asked right after ready: the answer waits for the servers to be asked.
                listed = (await call(client, "get_available_models"))["data"]["models"]
                await call(client, "set_model", provider="ollama", modelId="qwen3:8b")
                from_ollama = await prompt(client, "hello ollama")
                await call(client, "set_model", provider="llama.cpp",
                           modelId="Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf")
                from_llamacpp = await prompt(client, "hello llama")
    selectors = {(x["provider"], x["id"]) for x in listed}
    assert selectors == {("ollama", "qwen3:8b"), ("ollama", "llava:7b"),
                         ("ollama", "gpt-oss:20b"),
                         ("llama.cpp", "Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf")}
    assert {x["credential"] for x in listed} == {"notNeeded"}
    assert reply_text(from_ollama) == "Hi from Ollama"
    assert reply_text(from_llamacpp) == "Hi from llama.cpp"
    chat = [r for r in ollama.requests if r.path != "/api/show" and r.method == "POST"]
    assert [r.path for r in chat] == ["/v1/chat/completions"]
    body = chat[0].json()
    assert body["model"] == "qwen3:8b"
    assert "stream_options" not in body
    assert "authorization" not in chat[0].headers  # no key needed, none sent
    assert [r.path for r in llamacpp.requests] == ["/v1/models", "/v1/chat/completions"]


@pytest.mark.parametrize("how", ["setting", "environment"])
async def test_discovery_off(tmp_path: Path, isolated_agent_dir: Path, how: str) -> None:
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            silent = await start_silent(nursery)
            url = f"http://127.0.0.1:{silent.port}/v1"
            env = process_env()
            if how == "setting":
                write_config(isolated_agent_dir, {"ollama": url, "vllm": url}, enabled=False)
            else:
                write_config(isolated_agent_dir, {"ollama": url, "vllm": url})
                env["OMP_LOCAL_MODELS"] = "off"
            async with RpcClient.spawn(args=["--mode", "rpc", "--no-session"], cwd=tmp_path,
                                       env=env) as client:
                listed = (await call(client, "get_available_models"))["data"]["models"]
                missing = to_frame(await client.request(
                    {"type": "set_model", "provider": "ollama", "modelId": "qwen3:8b"}))
            nursery.cancel_scope.cancel()
    assert silent.accepted == 0  # not even a connect
    assert {x["provider"] for x in listed} == {"offline"}
    assert missing["error"] == "Model not found: ollama/qwen3:8b"


async def test_a_server_that_never_answers_does_not_delay_ready(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """The probe may wait 30 s on this server; ``ready`` must come within 20 s (the client's
    ready timeout), and commands must be answered while the probe's request hangs."""
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            silent = await start_silent(nursery)
            write_config(isolated_agent_dir,
                         {"ollama": f"http://127.0.0.1:{silent.port}/v1"}, timeoutMs=30000)
            async with RpcClient.spawn(args=["--mode", "rpc", "--no-session"], cwd=tmp_path,
                                       env=process_env(), ready_timeout=20) as client:
                await silent.wait_until(lambda s: s.requests == 1)
                state = await call(client, "get_state")
                assert silent.open >= 1  # the probe's request is still unanswered
                pid = client.pid
                assert pid is not None
            # The input closed while the probe waited: the process exited at once (the
            # client's close timeout), and the held connection went with it.
            await silent.wait_until(lambda s: s.open == 0)
            nursery.cancel_scope.cancel()
    assert state["data"]["model"]["provider"] == "offline"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_omp_models_lists_local_and_catalog_models(tmp_path: Path,
                                                         isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_fake_llm([tags_reply(recorded("ollama_tags"))]) as ollama:
            write_config(isolated_agent_dir, {"ollama": ollama.base_url + "/v1"})
            env = {**process_env(), "DEEPSEEK_API_KEY": "sk-deep-SECRET"}
            listed = await run_omp(["models", "--json"], tmp_path, env)
            everything = await run_omp(["models", "--all", "--json"], tmp_path, env)
            table = await run_omp(["models", "--all"], tmp_path, env)
    entries = msgspec.json.decode(listed)["models"]
    deepseek = sorted((f"deepseek/{x.id}" for x in CATALOG.models["deepseek"]), key=str.lower)
    assert [(x["selector"], x["credential"]) for x in entries] == [
        *((selector, "env") for selector in deepseek),
        ("ollama/gpt-oss:20b", "notNeeded"), ("ollama/llava:7b", "notNeeded"),
        ("ollama/qwen3:8b", "notNeeded")]
    every = msgspec.json.decode(everything)["models"]
    groq = [x for x in every if x["provider"] == "groq"]
    assert groq
    assert {x["credential"] for x in groq} == {"missing"}
    assert b"sk-deep-SECRET" not in listed + everything + table
    assert (f"groq ({len(CATALOG.models['groq'])}) - no key: set GROQ_API_KEY (get one at "
            "https://console.groq.com/keys)").encode() in table
    assert b"ollama (3)\n" in table


async def run_omp(args: list[str], cwd: Path, env: dict[str, str]) -> bytes:
    result = await trio.run_process([sys.executable, "-P", "-m", "omp", *args], cwd=cwd,
                                    env=env, capture_stdout=True, capture_stderr=True,
                                    check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


# --- settings -----------------------------------------------------------------------------


def test_local_models_settings(tmp_path: Path, isolated_agent_dir: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    agent, project = isolated_agent_dir, tmp_path / "project"
    (project / ".omp").mkdir(parents=True)
    assert load_settings(agent, project).local_models == LocalModelsSettings()
    (agent / "config.yml").write_text(
        "localModels:\n  timeoutMs: 250\n  servers: {ollama: 'http://gpu-box:11434/v1'}\n")
    # A project may turn the discovery off, never point a server elsewhere.
    (project / ".omp" / "config.yml").write_text(
        "localModels:\n  enabled: false\n  servers: {ollama: 'http://evil.example/v1'}\n")
    chosen = load_settings(agent, project).local_models
    assert chosen == LocalModelsSettings(enabled=False, timeoutMs=250,
                                         servers={"ollama": "http://gpu-box:11434/v1"})
    assert "$.localModels.servers: ignored; only the global" in capsys.readouterr().err
    (agent / "config.yml").write_text("localModels:\n  servers: {ollama: 'gpu-box:11434'}\n")
    with pytest.raises(ConfigError) as bad:
        load_settings(agent)
    assert "$.localModels.servers.ollama: must be an http(s) URL" in str(bad.value)
    (agent / "config.yml").write_text("localModels:\n  timeoutMs: -5\n")
    with pytest.raises(ConfigError) as negative:
        load_settings(agent)
    assert "$.localModels.timeoutMs: must not be negative" in str(negative.value)


async def test_a_local_model_named_before_its_server_was_asked(tmp_path: Path,
                                                               isolated_agent_dir: Path) -> None:
    """``omp -p --model ollama/<tag>``: one-shot modes ask no server; the model is taken on
    trust, at the server ``localModels.servers`` names, with ``--api-key`` sent as given."""
    with trio.fail_after(LIMIT):
        async with open_fake_llm([text_reply("Hi from the tag"),
                                  text_reply("Hi with a key")]) as ollama:
            write_config(isolated_agent_dir, {"ollama": ollama.base_url + "/v1"})
            plain = await run_omp(["-p", "--no-session", "--model", "ollama/qwen3:8b", "hello"],
                                  tmp_path, process_env())
            keyed = await run_omp(["-p", "--no-session", "--model", "ollama/qwen3:8b",
                                   "--api-key", "ollama-key", "hello"], tmp_path, process_env())
    assert plain.strip() == b"Hi from the tag"
    assert keyed.strip() == b"Hi with a key"
    assert [r.json()["model"] for r in ollama.requests] == ["qwen3:8b", "qwen3:8b"]
    assert "authorization" not in ollama.requests[0].headers
    assert ollama.requests[1].headers["authorization"] == "Bearer ollama-key"


async def test_a_session_continued_on_a_local_model_keeps_it(tmp_path: Path,
                                                              isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_fake_llm([tags_reply(recorded("ollama_tags")), NO_SHOW,
                                  text_reply("first"), text_reply("second")]) as ollama:
            write_config(isolated_agent_dir, {"ollama": ollama.base_url + "/v1"})
            async with RpcClient.spawn(args=["--mode", "rpc"], cwd=tmp_path, env=process_env(),
                                       max_buffered_events=math.inf) as client:
                await call(client, "set_model", provider="ollama", modelId="llava:7b")
                await prompt(client, "one")
            # Continued before the server is asked (here: never): the model is kept.
            env = {**process_env(), "OMP_LOCAL_MODELS": "0"}
            async with RpcClient.spawn(args=["--mode", "rpc", "-c"], cwd=tmp_path, env=env,
                                       max_buffered_events=math.inf) as client:
                state = await call(client, "get_state")
                second = await prompt(client, "two")
    assert (state["data"]["model"]["provider"], state["data"]["model"]["id"]) == (
        "ollama", "llava:7b")
    assert reply_text(second) == "second"
    assert [r.json()["model"] for r in ollama.requests
            if r.method == "POST" and r.path != "/api/show"] == ["llava:7b", "llava:7b"]


# --- Ollama where its variables say, and what /api/show says (issue 36) --------------------


@pytest.mark.parametrize(("environ", "url"), [
    ({"OLLAMA_HOST": "0.0.0.0"}, "http://127.0.0.1:11434/v1"),
    ({"OLLAMA_HOST": "127.0.0.1:5555"}, "http://127.0.0.1:5555/v1"),
    ({"OLLAMA_HOST": "0.0.0.0:5555"}, "http://127.0.0.1:5555/v1"),
    ({"OLLAMA_HOST": ":9"}, "http://127.0.0.1:9/v1"),
    ({"OLLAMA_HOST": "http://gpu-box:8000/"}, "http://gpu-box:8000/v1"),
    ({"OLLAMA_HOST": "https://ollama.example"}, "https://ollama.example/v1"),
    ({"OLLAMA_HOST": "[::]:7"}, "http://[::1]:7/v1"),
    ({"OLLAMA_BASE_URL": "http://gpu-box:11434", "OLLAMA_HOST": "elsewhere"},
     "http://gpu-box:11434/v1"),
    ({"OLLAMA_BASE_URL": "http://gpu-box:11434/v1/"}, "http://gpu-box:11434/v1"),
    ({"OLLAMA_HOST": "ftp://nope"}, None),
    ({}, None),
])
def test_ollama_url_from_its_variables(environ: dict[str, str], url: str | None) -> None:
    assert ollama_url(environ) == url
    registry = ModelRegistry.load(Path("/nonexistent"), environ=environ)
    (ollama,) = [s for s in registry.local_servers() if s.provider == "ollama"]
    assert ollama.base_url == (url or CATALOG.providers["ollama"].baseUrl)
    # The settings' address still wins.
    moved = registry.local_servers({"ollama": "http://127.0.0.1:1/v1"})
    assert [s.base_url for s in moved if s.provider == "ollama"] == ["http://127.0.0.1:1/v1"]


def test_ollama_show() -> None:
    assert parse_ollama_show(recorded("ollama_show_qwen3")) == (40960, False, True)
    # The window it is run with (num_ctx) before the one it was trained for.
    assert parse_ollama_show(recorded("ollama_show_llava")) == (8192, True, False)
    assert parse_ollama_show({"model_info": {"x.context_length": True}}) == (None, False, False)
    assert parse_ollama_show([1]) is None


def test_openai_models_context_lengths() -> None:
    payload = {"data": [{"id": "a", "context_length": 32768},
                        {"id": "b", "meta": {"n_ctx": 16384, "n_ctx_train": 131072}},
                        {"id": "e", "meta": {"n_ctx_train": 131072}},
                        {"id": "c", "max_model_len": 4096, "context_length": 9},
                        {"id": "d", "context_length": -1}]}
    models = parse_openai_models(payload, server("lm-studio"), CATALOG.providers["lm-studio"])
    assert models is not None
    assert [(m.id, m.contextWindow) for m in models] == [
        ("a", 32768), ("b", 16384), ("e", None), ("c", 4096), ("d", None)]


def show_reply(name: str, payload: Any) -> dict[str, Any]:
    return {"match": {"path": "/api/show", "bodyContains": f'"{name}"'}, "repeat": True,
            "body": payload}


@pytest.mark.parametrize("context_length", [None, "8192"])
async def test_ollama_host_finds_ollama_and_its_windows(
        context_length: str | None, tmp_path: Path, isolated_agent_dir: Path) -> None:
    """``OLLAMA_HOST=127.0.0.1:PORT`` (no ``localModels`` address for Ollama): ``omp models``
    finds the fake Ollama there, and each model's window from ``/api/show`` (or, with
    ``OLLAMA_CONTEXT_LENGTH``, that)."""
    script = [tags_reply(recorded("ollama_tags")),
              show_reply("qwen3:8b", recorded("ollama_show_qwen3")),
              show_reply("llava:7b", recorded("ollama_show_llava"))]
    with trio.fail_after(LIMIT):
        async with open_fake_llm(script) as ollama:
            others = {name: f"http://127.0.0.1:{dead_port()}/v1"
                      for name in ("llama.cpp", "lm-studio", "vllm")}
            (isolated_agent_dir / "config.yml").write_text(json.dumps(
                {"localModels": {"servers": others, "timeoutMs": 20000}}))
            env = {**process_env(), "OLLAMA_HOST": ollama.base_url.removeprefix("http://")}
            if context_length is not None:
                env["OLLAMA_CONTEXT_LENGTH"] = context_length
            listed = await run_omp(["models", "--json"], tmp_path, env)
    entries = {x["id"]: x for x in msgspec.json.decode(listed)["models"]
               if x["provider"] == "ollama"}
    assert set(entries) == {"qwen3:8b", "llava:7b", "gpt-oss:20b"}
    windows = {name: entry["contextWindow"] for name, entry in entries.items()}
    if context_length is None:
        # gpt-oss has no /api/show answer here: its window stays unknown.
        assert windows == {"qwen3:8b": 40960, "llava:7b": 8192, "gpt-oss:20b": None}
        assert entries["qwen3:8b"]["reasoning"] is True
    else:
        assert windows == dict.fromkeys(entries, 8192)
    assert entries["llava:7b"]["input"] == ["text", "image"]
    shown = [r for r in ollama.requests if r.path == "/api/show"]
    assert sorted(r.json()["model"] for r in shown) == ["gpt-oss:20b", "llava:7b", "qwen3:8b"]
    assert {r.method for r in shown} == {"POST"}
