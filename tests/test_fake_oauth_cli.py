"""``python -m omp.testing.fake_oauth``: a real server from the command line, as the fake LLM's.

It prints where it listens and the ``oauth:`` blocks that point at it, serves a scripted device
flow to a real HTTP client, ends with exit 0 on SIGTERM, and refuses a bad script (exit 2)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import httpx
import trio

LIMIT = 30


async def _first_lines(stream: trio.abc.ReceiveStream, count: int) -> list[str]:
    data = b""
    while data.count(b"\n") < count:
        chunk = await stream.receive_some(4096)
        assert chunk, f"the server's output ended: {data!r}"
        data += chunk
    return data.decode().splitlines()[:count]


async def test_serves_a_device_flow_and_exits_0_on_sigterm() -> None:
    with trio.fail_after(LIMIT):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "omp.testing.fake_oauth", "--client-id", "cli-client",
             "--device-polls", "pending,ok", "--interval", "0"],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            assert process.stdout is not None
            banner, device, pkce = await _first_lines(process.stdout, 3)
            assert banner.startswith("fake OAuth listening on http://127.0.0.1:")
            base = banner.rsplit(" ", 1)[1]
            block = json.loads(device)["oauth"]
            assert block["flow"] == "device"
            assert block["clientId"] == "cli-client"
            assert json.loads(pkce)["oauth"]["authorizationUrl"] == f"{base}/authorize"
            async with httpx.AsyncClient() as http:
                code = (await http.post(block["deviceAuthorizationUrl"],
                                        data={"client_id": "cli-client"})).json()
                poll = {"grant_type": "urn:ietf:params:oauth:grant-type:device_code",
                        "device_code": code["device_code"], "client_id": "cli-client"}
                first = await http.post(block["tokenUrl"], data=poll)
                second = await http.post(block["tokenUrl"], data=poll)
            assert first.status_code == 400
            assert first.json()["error"] == "authorization_pending"
            assert second.status_code == 200
            assert second.json()["access_token"].startswith("at-")
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


def test_a_bad_script_is_refused_naming_it() -> None:
    done = subprocess.run([sys.executable, "-m", "omp.testing.fake_oauth",
                           "--device-polls", "ok,maybe"],
                          capture_output=True, text=True, timeout=LIMIT, check=False)
    assert done.returncode == 2
    assert "'maybe'" in done.stderr
    assert done.stdout == ""
