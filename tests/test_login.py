"""Login over RPC (issue 14): OAuth device code and PKCE with a loopback redirect against the
fake OAuth server, API-key login, refresh, and what a host sees of it, through the real
``omp --mode rpc``; the device flow's timing and hostile servers (issue 28) also in this program
on virtual time; plus auth.json and the models.yml ``oauth`` block on their own."""

from __future__ import annotations

import stat
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import msgspec
import procfs
import pytest
import trio
import trio.testing
from agent_helpers import text_reply
from extension_helpers import ProcessHost, open_process_host, ui_requests
from login_helpers import (
    ARGS,
    auth_file,
    browse,
    call,
    everything_but_auth,
    leaked,
    login_response,
    providers_of,
    start_login,
    write_corp,
)

from omp.config import ConfigError
from omp.llm.errors import ProviderError
from omp.llm.models import ModelRegistry, load_auth_file
from omp.llm.models_file import load_models_file
from omp.login.config import OAuthConfig
from omp.login.flows import STATE_MISMATCH, LoginTarget, device_login, parse_pasted
from omp.login.oauth import MAX_TOKEN_SECONDS, LoginError, post_form, tokens_from
from omp.login.store import ApiKey, Credentials, OAuthTokens, read_auth_file
from omp.rpc.bridges import UI_DISCONNECTED
from omp.testing.fake_llm import open_fake_llm
from omp.testing.fake_oauth import FakeOAuth, open_fake_oauth

LIMIT = 60.0
"""Seconds (real time) a process test may take at most; each takes about one."""
PASTE = "Paste the authorization code (or full redirect URL):"


def work(tmp_path: Path) -> Path:
    cwd = tmp_path / "work"
    cwd.mkdir(exist_ok=True)
    return cwd


async def prompt_reply(host: ProcessHost) -> None:
    await call(host, "set_model", provider="corp", modelId="corp-large")
    await call(host, "prompt", message="hello")
    await host.until_type("agent_end")


# --- device code ---------------------------------------------------------------------------------


async def test_device_login_then_the_model_request_carries_the_bearer_token(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_fake_oauth(device_polls=["ok"]) as oauth, \
                open_fake_llm([text_reply("hi there")]) as llm:
            write_corp(isolated_agent_dir, llm.base_url, oauth.oauth_block("device"))
            async with open_process_host(work(tmp_path), args=ARGS) as host:
                before = providers_of(await call(host, "get_login_providers"))
                await start_login(host, "corp")
                response = await login_response(host)
                after = providers_of(await call(host, "get_login_providers"))
                await prompt_reply(host)
            texts = everything_but_auth(isolated_agent_dir, host)
    assert response["success"] is True, response
    assert response["data"] == {"providerId": "corp"}
    # Listed before (not authenticated) and after (authenticated), with the API-key providers.
    assert before["corp"] == {"id": "corp", "name": "corp", "available": True,
                              "authenticated": False}
    assert after["corp"]["authenticated"] is True
    assert {"anthropic", "openai", "google"} <= set(before)
    assert "offline" not in before
    # The original's frame order: notify, open_url with the code, notify, then the response.
    requests = ui_requests(host.frames)
    assert [r["method"] for r in requests] == ["notify", "open_url", "notify"]
    assert requests[0]["message"] == "Requesting device authorization..."
    assert requests[1]["url"] == f"{oauth.base_url}/device?user_code={oauth.user_code}"
    assert oauth.user_code in requests[1]["instructions"]
    assert "launchUrl" not in requests[1]
    assert requests[2]["message"] == "Waiting for device authorization..."
    # One poll, 5 s after the code (RFC 8628's least interval; the fake asks for 0.05 s): the
    # polling itself is timed in virtual time below (test_device_polling_*).
    assert oauth.polls == 1
    assert oauth.early_polls == 0
    # Stored 0600; the model request carried the access token as a Bearer header.
    stored = auth_file(isolated_agent_dir)["corp"]
    assert stored["type"] == "oauth"
    assert stored["access"] in oauth.access_tokens
    assert llm.requests[0].headers["authorization"] == f"Bearer {stored['access']}"
    # No token in any frame, in stderr, or any file but auth.json (the session file included).
    assert any(text.startswith('{"type":"session"') for text in texts)
    assert leaked(oauth, texts) == []


@pytest.mark.parametrize(("script", "error"), [
    ({"device_polls": ["denied"]}, "corp device authorization was denied"),
    # The code expires before the first poll (5 s): the client stops polling at expires_in.
    ({"device_polls": [], "device_expires_in": 0.3},
     "corp device code expired; restart the login"),
])
async def test_device_login_fails_clearly(tmp_path: Path, isolated_agent_dir: Path,
                                         script: dict[str, Any], error: str) -> None:
    with trio.fail_after(LIMIT):
        async with open_fake_oauth(**script) as oauth:
            write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("device"))
            async with open_process_host(work(tmp_path), args=ARGS) as host:
                await start_login(host, "corp")
                response = await login_response(host)
                providers = providers_of(await call(host, "get_login_providers"))
    assert response["success"] is False
    assert response["error"] == error
    assert providers["corp"]["authenticated"] is False
    assert not (isolated_agent_dir / "auth.json").exists()
    assert oauth.early_polls == 0


# --- PKCE with a loopback redirect ---------------------------------------------------------------


async def open_pkce(host: ProcessHost) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start the login; its ``open_url`` request and the paste ``input`` request."""
    await start_login(host, "corp")
    opened = await host.ui_request("open_url")
    paste = await host.ui_request("input")
    return opened, paste


async def test_pkce_login_answered_by_the_loopback_redirect(tmp_path: Path,
                                                            isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_fake_oauth() as oauth:
            write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("pkce"))
            async with open_process_host(work(tmp_path), args=ARGS) as host:
                opened, paste = await open_pkce(host)
                # The browser: launchUrl → the authorization URL → the loopback redirect.
                status, auth_url = await browse(opened["launchUrl"])
                assert (status, auth_url) == (302, opened["url"])
                status, redirect = await browse(opened["url"])
                assert status == 302
                assert redirect is not None
                status, _ = await browse(redirect)
                response = await login_response(host)
            texts = everything_but_auth(isolated_agent_dir, host)
    assert status == 200
    assert response["success"] is True, response
    assert opened["url"].startswith(oauth.authorize_url + "?")
    assert opened["launchUrl"].startswith("http://127.0.0.1:")
    assert opened["launchUrl"].endswith("/launch")
    assert "paste" in opened["instructions"]
    assert paste["title"] == PASTE
    assert paste["timeout"] == 600000
    # The paste prompt the browser made moot is closed for the host, before the response.
    (cancel,) = ui_requests(host.frames, "cancel")
    assert cancel["targetId"] == paste["id"]
    assert host.frames.index(cancel) < host.frames.index(response)
    notices = [r["message"] for r in ui_requests(host.frames, "notify")]
    assert notices == ["Waiting for browser authentication...",
                       "Exchanging authorization code for tokens..."]
    assert auth_file(isolated_agent_dir)["corp"]["access"] in oauth.access_tokens
    assert leaked(oauth, texts) == []


async def test_pkce_login_answered_by_the_pasted_url(tmp_path: Path,
                                                     isolated_agent_dir: Path) -> None:
    """A browser that cannot reach this machine: the user pastes the URL it ended on. An
    answer without a code (cancelled, empty) asks again."""
    with trio.fail_after(LIMIT):
        async with open_fake_oauth() as oauth:
            write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("pkce"))
            async with open_process_host(work(tmp_path), args=ARGS) as host:
                opened, paste = await open_pkce(host)
                _, redirect = await browse(opened["url"])  # not followed: unreachable
                await host.answer(paste, cancelled=True)
                again = await host.ui_request("input")
                await host.answer(again, value="   ")
                third = await host.ui_request("input")
                await host.answer(third, value=f"  {redirect}  ")
                response = await login_response(host)
    assert response["success"] is True, response
    assert again["id"] != paste["id"]
    assert third["title"] == PASTE
    assert auth_file(isolated_agent_dir)["corp"]["access"] in oauth.access_tokens


async def test_pkce_state_mismatch_ends_the_login(tmp_path: Path,
                                                  isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_fake_oauth() as oauth:
            write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("pkce"))
            async with open_process_host(work(tmp_path), args=ARGS) as host:
                opened, paste = await open_pkce(host)
                _, redirect = await browse(opened["url"])
                assert redirect is not None
                forged = redirect.replace("state=", "state=0")
                await host.answer(paste, value=forged)
                response = await login_response(host)
    assert response["success"] is False
    assert response["error"] == STATE_MISMATCH
    assert not (isolated_agent_dir / "auth.json").exists()


async def test_pkce_redirect_with_an_error_fails_the_login(tmp_path: Path,
                                                           isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_fake_oauth(authorize_error="access_denied") as oauth:
            write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("pkce"))
            async with open_process_host(work(tmp_path), args=ARGS) as host:
                opened, _ = await open_pkce(host)
                _, redirect = await browse(opened["url"])
                assert redirect is not None
                status, _ = await browse(redirect)
                response = await login_response(host)
    assert status == 400
    assert response["success"] is False
    assert response["error"] == "Authorization failed: The user said no"


def test_pasted_forms() -> None:
    state = "s" * 32
    assert parse_pasted(f"http://127.0.0.1:1/callback?code=abc&state={state}", state) == "abc"
    assert parse_pasted(f"?code=abc&state={state}", state) == "abc"
    assert parse_pasted(f"abc#{state}", state) == "abc"
    assert parse_pasted("abc", state) == "abc"
    assert parse_pasted("  ", state) is None
    mismatch = parse_pasted("abc#other", state)
    assert isinstance(mismatch, LoginError)
    assert str(mismatch) == STATE_MISMATCH
    # A redirect URL always carries its state: one without is not ours.
    assert isinstance(parse_pasted("http://127.0.0.1:1/callback?code=abc", state), LoginError)


# --- API key -------------------------------------------------------------------------------------


async def test_api_key_login(tmp_path: Path, isolated_agent_dir: Path) -> None:
    key = "sk-ant-LOGIN-SECRET"
    with trio.fail_after(LIMIT):
        async with open_process_host(work(tmp_path), args=ARGS) as host:
            before = providers_of(await call(host, "get_login_providers"))
            await start_login(host, "anthropic")
            prompt = await host.ui_request("input")
            await host.answer(prompt, value=f" Bearer {key} ")
            response = await login_response(host)
            after = providers_of(await call(host, "get_login_providers"))
            await start_login(host, "openai", "login-2")
            empty = await host.ui_request("input")
            await host.answer(empty, value="")
            refused = await login_response(host, "login-2")
        frames = msgspec.json.encode(host.frames).decode()
    assert before["anthropic"] == {"id": "anthropic", "name": "Anthropic", "available": True,
                                   "authenticated": False}
    assert prompt["title"] == "Paste your Anthropic API key"
    assert prompt["timeout"] == 600000
    assert response == {"type": "response", "command": "login", "id": "login-1",
                        "success": True, "data": {"providerId": "anthropic"}}
    assert after["anthropic"]["authenticated"] is True
    assert auth_file(isolated_agent_dir) == {"anthropic": {"type": "api_key", "key": key}}
    assert refused["success"] is False
    assert refused["error"] == "API key is required"
    # The key went from the host to the file; no frame of the server carries it.
    assert key not in frames
    assert key not in host.stderr


async def test_unknown_provider(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_process_host(work(tmp_path), args=ARGS) as host:
            response = await call(host, "login", providerId="claude-pro")
    assert response["success"] is False
    assert response["error"] == "Unknown OAuth provider: claude-pro"


# --- abort, a second login, the host going away --------------------------------------------------


async def test_abort_cancels_a_login_and_a_second_login_is_refused(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_fake_oauth(device_polls=[]) as oauth:  # pending until aborted
            write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("device"))
            async with open_process_host(work(tmp_path), args=ARGS) as host:
                await start_login(host, "corp")
                await host.ui_request("open_url")
                second = await call(host, "login", providerId="anthropic")
                state = await call(host, "get_state")  # the lanes stay free meanwhile
                aborted = await call(host, "abort")
                response = await login_response(host)
                again = await call(host, "get_login_providers")
    # That no poll comes after a cancellation is timed in virtual time below
    # (test_a_cancelled_device_login_polls_no_more).
    assert second["success"] is False
    assert second["error"] == "A login is already in progress (abort cancels it)"
    assert state["success"] is True
    assert aborted["success"] is True
    assert response["success"] is False
    assert response["error"] == "Login cancelled"
    assert providers_of(again)["corp"]["authenticated"] is False
    assert not (isolated_agent_dir / "auth.json").exists()


async def test_stdin_closed_during_a_login_prompt(tmp_path: Path,
                                                  isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_process_host(work(tmp_path), args=ARGS) as host:
            await start_login(host, "openai")
            await host.ui_request("input")
            await host.close_input()
            rest = await host.rest()
            code = await host.wait()
    (response,) = [f for f in rest if f["type"] == "response"]
    assert response["success"] is False
    assert response["error"] == UI_DISCONNECTED
    assert code == 0
    assert not (isolated_agent_dir / "auth.json").exists()


async def test_stdin_closed_during_the_pkce_paste_prompt(tmp_path: Path,
                                                        isolated_agent_dir: Path) -> None:
    """The paste prompt fails when the host goes away: that ends the race and the login fails
    with the disconnect, as the API-key prompt does (not with an exception group, which the
    command would not take for a failed login)."""
    with trio.fail_after(LIMIT):
        async with open_fake_oauth() as oauth:
            write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("pkce"))
            async with open_process_host(work(tmp_path), args=ARGS) as host:
                await open_pkce(host)
                await host.close_input()
                rest = await host.rest()
                code = await host.wait()
    (response,) = [f for f in rest if f["type"] == "response"]
    assert response["success"] is False
    assert response["error"] == UI_DISCONNECTED
    assert code == 0
    assert not (isolated_agent_dir / "auth.json").exists()


async def test_stdin_closed_while_a_device_login_polls(tmp_path: Path,
                                                       isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_fake_oauth(device_polls=[]) as oauth:
            write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("device"))
            async with open_process_host(work(tmp_path), args=ARGS) as host:
                await start_login(host, "corp")
                await host.ui_request("open_url")
                await host.close_input()
                rest = await host.rest()
                code = await host.wait()
    (response,) = [f for f in rest if f["type"] == "response"]
    assert response["success"] is False
    assert response["error"].startswith("Cancelled: the host closed the input")
    assert code == 0


# --- refresh -------------------------------------------------------------------------------------


def store_login(agent_dir: Path, oauth: FakeOAuth, *, expires: int) -> dict[str, Any]:
    body = oauth.issue()
    entry = {"type": "oauth", "access": body["access_token"],
             "refresh": body["refresh_token"], "expires": expires}
    path = agent_dir / "auth.json"
    path.write_bytes(msgspec.json.encode({"corp": entry}))
    path.chmod(0o600)
    return entry


async def test_refresh_before_expiry_happens_once_for_concurrent_calls(
        isolated_agent_dir: Path) -> None:
    async with open_fake_oauth(refresh_delay=0.2) as oauth:
        write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("device"))
        old = store_login(isolated_agent_dir, oauth, expires=0)
        registry = ModelRegistry.load(isolated_agent_dir)
        model = registry.find("corp", "corp-large")
        assert model is not None
        async with httpx.AsyncClient() as http, trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(registry.refresh_if_due, "corp", http)
        # Fresh now: a later call does not refresh again.
        async with httpx.AsyncClient() as http:
            await registry.refresh_if_due("corp", http)
    assert oauth.refreshes == 1
    stored = auth_file(isolated_agent_dir)["corp"]
    assert stored["access"] != old["access"]
    assert stored["access"] in oauth.access_tokens
    assert stored["refresh"] != old["refresh"]  # rotated
    assert registry.headers(model)["authorization"] == f"Bearer {stored['access']}"
    assert registry.api_key("corp") is None  # a login is a Bearer header, not a key header


async def test_the_process_refreshes_an_expiring_login_before_the_model_call(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_fake_oauth() as oauth, open_fake_llm([text_reply("hi")]) as llm:
            write_corp(isolated_agent_dir, llm.base_url, oauth.oauth_block("device"))
            old = store_login(isolated_agent_dir, oauth, expires=0)
            async with open_process_host(work(tmp_path), args=ARGS) as host:
                await prompt_reply(host)
            texts = everything_but_auth(isolated_agent_dir, host)
    assert oauth.refreshes == 1
    stored = auth_file(isolated_agent_dir)["corp"]
    assert stored["access"] != old["access"]
    assert llm.requests[0].headers["authorization"] == f"Bearer {stored['access']}"
    assert leaked(oauth, texts) == []


async def test_a_failed_refresh_asks_to_log_in_again_and_keeps_the_credential(
        isolated_agent_dir: Path) -> None:
    async with open_fake_oauth(refresh_error="invalid_grant") as oauth:
        write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("device"))
        old = store_login(isolated_agent_dir, oauth, expires=0)
        registry = ModelRegistry.load(isolated_agent_dir)
        async with httpx.AsyncClient() as http:
            with pytest.raises(ProviderError) as caught:
                await registry.refresh_if_due("corp", http)
    assert caught.value.kind == "auth"
    assert "log in again" in caught.value.message
    assert "invalid_grant" in caught.value.message
    assert old["access"] not in caught.value.message
    assert old["refresh"] not in caught.value.message
    assert auth_file(isolated_agent_dir)["corp"] == old


async def test_a_token_far_from_expiry_is_not_refreshed(isolated_agent_dir: Path) -> None:
    async with open_fake_oauth() as oauth:
        write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("device"))
        # 61 s from now: outside the 60 s refresh window.
        store_login(isolated_agent_dir, oauth, expires=int(time.time() * 1000) + 61_000)
        registry = ModelRegistry.load(isolated_agent_dir)
        async with httpx.AsyncClient() as http:
            await registry.refresh_if_due("corp", http)
    assert oauth.refreshes == 0


# --- the device flow's timing, and hostile authorization servers ---------------------------------
#
# In this program, on virtual time: the real fake server over loopback HTTP and a real httpx
# client, with ``device_login`` itself (the RPC path is tested above). The clock jumps only after
# every task has waited ``JUMP_AFTER`` of real time, not at once: an HTTP exchange is real I/O,
# and a jump in its midst would run into the request's 30 s deadline.

JUMP_AFTER = 0.005
CORP = LoginTarget(id="corp", name="corp")
EXPIRED = "corp device code expired; restart the login"


@pytest.fixture
def virtual_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=JUMP_AFTER)


@attrs.define
class SilentUI:
    """The user of a device login: reads the page and the code, is asked nothing."""

    opened: list[str] = attrs.field(factory=list)
    notices: list[str] = attrs.field(factory=list)

    def open_url(self, url: str, *, launch_url: str | None = None,
                 instructions: str | None = None) -> None:
        self.opened.append(url)

    def notify(self, message: str) -> None:
        self.notices.append(message)

    async def input(self, title: str, *, placeholder: str | None = None,
                    timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        raise AssertionError("a device login asks nothing")


async def device_poll_times(**script: Any) -> tuple[list[float], OAuthTokens | LoginError]:
    """A device login against a fake scripted so: when it polled (seconds after it began) and
    what it ended in."""
    start = trio.current_time()
    async with open_fake_oauth(**script) as oauth, httpx.AsyncClient(trust_env=False) as http:
        config = OAuthConfig(**oauth.oauth_block("device"))
        try:
            outcome: OAuthTokens | LoginError = await device_login(
                SilentUI(), http, CORP, config)
        except LoginError as exc:
            outcome = exc
    return [round(t - start, 3) for t in oauth.poll_times], outcome


async def test_device_polling_takes_the_servers_interval_but_at_least_5_s(
        virtual_clock: trio.testing.MockClock) -> None:
    """``interval: 0.0001`` polled 109 times in 5 s; RFC 8628's 5 s is the least."""
    times, outcome = await device_poll_times(interval=0.0001,
                                             device_polls=["pending", "pending", "ok"])
    assert times == [5.0, 10.0, 15.0]
    assert isinstance(outcome, OAuthTokens)
    times, outcome = await device_poll_times(interval=7.5, device_polls=["pending", "ok"])
    assert times == [7.5, 15.0]


async def test_device_polling_slows_down_by_5_s(virtual_clock: trio.testing.MockClock) -> None:
    times, outcome = await device_poll_times(
        interval=5, device_polls=["pending", "slow_down", "pending", "slow_down", "ok"])
    assert times == [5.0, 10.0, 20.0, 30.0, 45.0]
    assert isinstance(outcome, OAuthTokens)
    # A server that names a longer interval gets it; a hostile one gets a minute.
    times, _ = await device_poll_times(interval=5, slow_down_interval=30,
                                       device_polls=["slow_down", "ok"])
    assert times == [5.0, 35.0]
    times, _ = await device_poll_times(interval=5, slow_down_interval=1e308,
                                       device_polls=["slow_down", "pending", "ok"])
    assert times == [5.0, 65.0, 125.0]


async def test_device_polling_ends_at_the_servers_answer(
        virtual_clock: trio.testing.MockClock) -> None:
    times, outcome = await device_poll_times(interval=5, device_polls=["pending", "expired"])
    assert (times, str(outcome)) == ([5.0, 10.0], EXPIRED)
    times, outcome = await device_poll_times(interval=5, device_polls=["denied"])
    assert (times, str(outcome)) == ([5.0], "corp device authorization was denied")


async def test_a_huge_interval_and_lifetime_end_in_expiry_within_half_an_hour(
        virtual_clock: trio.testing.MockClock) -> None:
    """``interval`` or ``expires_in`` of 1e308 never finished: the interval is at most a
    minute, the code lives at most 30 minutes."""
    times, outcome = await device_poll_times(interval=1e308, device_expires_in=1e308,
                                             device_polls=[])
    assert isinstance(outcome, LoginError)
    assert str(outcome) == EXPIRED
    assert times == [60.0 * n for n in range(1, 31)]
    # The interval alone: a login the user approves still succeeds, a minute per poll.
    times, outcome = await device_poll_times(interval=1e308, device_polls=["pending", "ok"])
    assert (times, isinstance(outcome, OAuthTokens)) == ([60.0, 120.0], True)


async def test_a_cancelled_device_login_polls_no_more(
        virtual_clock: trio.testing.MockClock) -> None:
    async with open_fake_oauth(interval=5, device_polls=[]) as oauth, \
            httpx.AsyncClient(trust_env=False) as http:
        config = OAuthConfig(**oauth.oauth_block("device"))
        with trio.move_on_after(12):
            await device_login(SilentUI(), http, CORP, config)
        polls = oauth.polls
        await trio.sleep(600)
        left = oauth.polls
    assert (polls, left) == (2, 2)


@pytest.mark.parametrize("expires_in", [1e308, 10**400], ids=["1e308", "400 digits"])
def test_a_huge_token_lifetime_is_read_as_a_year(expires_in: float) -> None:
    """``expires_in: 1e308`` failed the login with ``OverflowError``."""
    tokens = tokens_from({"access_token": "at", "expires_in": expires_in}, "corp", now_ms=0)
    assert tokens.expires == MAX_TOKEN_SECONDS * 1000 - 5 * 60 * 1000
    assert MAX_TOKEN_SECONDS == 365 * 24 * 3600
    # Nothing sane, or already over: expired now (renewed at the next call).
    for nothing in (-5, 0, float("nan")):
        assert tokens_from({"access_token": "at", "expires_in": nothing}, "corp",
                           now_ms=0).expires == -5 * 60 * 1000


async def test_a_huge_or_compressed_reply_is_refused() -> None:
    form = {"grant_type": "refresh_token", "refresh_token": "rt", "client_id": "omp-test-client"}

    async def refused(**script: Any) -> str:
        async with open_fake_oauth(**script) as oauth, \
                httpx.AsyncClient(trust_env=False) as http:
            with pytest.raises(LoginError) as caught:
                await post_form(http, "corp", oauth.token_url, form)
        return str(caught.value).replace(oauth.token_url, "<url>")

    assert await refused(response_padding=300 << 20) == (
        "corp request to <url> was answered with more than 1 MiB; an OAuth reply is a few KB")
    assert await refused(content_encoding="gzip") == (
        "corp request to <url> was answered with a gzip-encoded body; only uncompressed "
        "replies are accepted")
    # Within the bound the padding is read: the answer is the server's own (an OAuth error).
    assert await refused(response_padding=512 << 10) == (
        "corp authorization server said invalid_grant: unknown refresh token")


async def test_a_300_mb_token_reply_fails_the_login_and_costs_no_memory(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """Through the process: the 300 MB reply took its RSS to 655 MB."""
    with trio.fail_after(LIMIT):
        async with open_fake_oauth(response_padding=300 << 20) as oauth:
            write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("pkce"))
            async with open_process_host(work(tmp_path), args=ARGS) as host:
                assert host.process is not None
                before = procfs.reset_peak_rss(host.process.pid)
                opened, paste = await open_pkce(host)
                _, redirect = await browse(opened["url"])
                assert redirect is not None
                await host.answer(paste, value=redirect)
                response = await login_response(host)
                growth = procfs.peak_rss_mb(host.process.pid) - before
    print(f"a 300 MB token reply: peak RSS +{growth:.1f} MiB")
    assert response["success"] is False
    assert response["error"] == (f"corp request to {oauth.token_url} was answered with more "
                                 "than 1 MiB; an OAuth reply is a few KB")
    assert growth < 20
    assert not (isolated_agent_dir / "auth.json").exists()


async def test_a_token_of_endless_lifetime_logs_in_for_a_year(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """Through the process: ``expires_in: 1e308`` failed the login with ``OverflowError``."""
    with trio.fail_after(LIMIT):
        async with open_fake_oauth(token_expires_in=1e308) as oauth:
            write_corp(isolated_agent_dir, "http://127.0.0.1:9", oauth.oauth_block("pkce"))
            async with open_process_host(work(tmp_path), args=ARGS) as host:
                opened, paste = await open_pkce(host)
                _, redirect = await browse(opened["url"])
                assert redirect is not None
                started = time.time() * 1000
                await host.answer(paste, value=redirect)
                response = await login_response(host)
                ended = time.time() * 1000
    assert response["success"] is True, response
    expires = auth_file(isolated_agent_dir)["corp"]["expires"]
    year = MAX_TOKEN_SECONDS * 1000 - 5 * 60 * 1000
    assert started + year - 1000 <= expires <= ended + year


# --- auth.json and models.yml --------------------------------------------------------------------


def test_auth_json_reads_every_form(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    path.write_text('{"a": "sk-a", "b": {"key": "sk-b"}, "c": {"type": "api_key", "key": "k"},'
                    ' "d": {"type": "oauth", "access": "AT-1", "refresh": "RT-1", "expires": 5},'
                    ' "e": {"access": "AT-2"}}')
    path.chmod(0o600)
    found = read_auth_file(path)
    assert found["a"] == ApiKey("sk-a")
    assert found["c"] == ApiKey("k")
    assert found["d"] == OAuthTokens("AT-1", "RT-1", 5)
    assert isinstance(found["e"], OAuthTokens)
    assert found["e"].refresh is None
    assert load_auth_file(path)["d"] == "AT-1"
    assert "AT-1" not in repr(found["d"])  # no token through a repr
    assert "RT-1" not in repr(found["d"])
    assert "sk-a" not in repr(found["a"])
    path.write_text('{"d": {"type": "oauth", "access": "at", "expires": "soon"}}')
    with pytest.raises(ConfigError, match=r"\$\.d\.expires: expected epoch milliseconds"):
        read_auth_file(path)


@pytest.mark.parametrize("expires", ["1e308", "-1e308", "1e300", "-5", "8640000000000001",
                                     "1" + "0" * 400])
def test_an_out_of_range_expiry_is_an_expired_token(tmp_path: Path, expires: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``expires: 1e308`` is no date: the token is treated as expired (renewed before it is
    used, or "log in again"), with a warning naming the entry; never an OverflowError."""
    path = tmp_path / "auth.json"
    path.write_text(f'{{"d": {{"type": "oauth", "access": "AT", "expires": {expires}}}}}')
    path.chmod(0o600)
    assert read_auth_file(path)["d"] == OAuthTokens("AT", None, 0)
    assert f"{path}: $.d.expires: " in capsys.readouterr().err
    path.write_text('{"d": {"type": "oauth", "access": "AT", "expires": 1e999}}')
    with pytest.raises(ConfigError, match="not valid JSON: Number out of range"):
        read_auth_file(path)


async def test_a_login_keeps_the_other_entries(tmp_path: Path) -> None:
    path = tmp_path / "agent" / "auth.json"
    path.write_text('{"openai": "sk-o", "other": {"key": "x", "note": "kept"}}')
    path.chmod(0o644)
    credentials = Credentials.load(path)
    await credentials.store("corp", OAuthTokens("at", "rt", 7))
    data = msgspec.json.decode(path.read_bytes())
    assert data == {"openai": "sk-o", "other": {"key": "x", "note": "kept"},
                    "corp": {"type": "oauth", "access": "at", "expires": 7, "refresh": "rt"}}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["auth.json"]  # no temp file left


@pytest.mark.parametrize(("oauth", "message"), [
    ({"flow": "device", "clientId": "c", "tokenUrl": "https://t/token"},
     "$.providers.corp.oauth.deviceAuthorizationUrl: required for `flow: device`"),
    ({"flow": "pkce", "clientId": "c", "tokenUrl": "https://t/token"},
     "$.providers.corp.oauth.authorizationUrl: required for `flow: pkce`"),
    ({"flow": "pkce", "clientId": "c", "tokenUrl": "/token", "authorizationUrl": "https://a"},
     "$.providers.corp.oauth.tokenUrl: must be an absolute http(s) URL, got '/token'"),
    ({"flow": "magic", "clientId": "c", "tokenUrl": "https://t"},
     "$.providers.corp.oauth.flow: must be one of 'device', 'pkce' (got 'magic')"),
    ({"flow": "pkce", "clientId": "c", "tokenUrl": "https://t", "authorizationUrl": "https://a",
      "redirectPort": 70000},
     "$.providers.corp.oauth.redirectPort: must be a port number from 0 to 65535, got 70000"),
])
def test_oauth_block_mistakes_are_named(tmp_path: Path, oauth: dict[str, Any],
                                        message: str) -> None:
    write_corp(tmp_path, "http://x", oauth)
    with pytest.raises(ConfigError) as caught:
        load_models_file(tmp_path / "models.yml")
    assert message in str(caught.value)


def test_an_oauth_provider_needs_no_api_key(isolated_agent_dir: Path) -> None:
    write_corp(isolated_agent_dir, "http://x", {
        "flow": "device", "clientId": "c", "tokenUrl": "https://t/token",
        "deviceAuthorizationUrl": "https://t/device"})
    registry = ModelRegistry.load(isolated_agent_dir)
    assert registry.has_credentials("corp") is False
    assert registry.missing_key_hint("corp") == (
        "log in first (the `login` command with providerId `corp`)")
