"""Authentication (issue 13): the token file, 401 on every mutating endpoint of both APIs without the
token, and a node that can register and publish only as itself.

The session's token file is a temporary one (tests/conftest.py); every daemon and client here
reads it the way they read the operator's real one.
"""

from __future__ import annotations

import http.client
import json
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostagent.api import AgentApi
from hostagent.daemon import Agent, AgentConfig
from hostagent.registration import ControllerClient, Registration
from kvpool import auth
from kvpool.http_api import ApiError, Auth, Route, is_remote
from tests.ctl_harness import SMALL, TOPO, Daemon, running
from tests.paths import REPO

H0, H1 = TOPO.hosts["h0"], TOPO.hosts["h1"]
PARAMS = {"key": "0x1", "node": "h0", "name": "s1"}


# ---------------------------------------------------------------------------------- the token file
def test_token_file_is_made_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "token"
    assert auth.read(path) is None and auth.secret(path) is None
    token = auth.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert auth.load_or_create(path) == token and auth.secret(path) == token.value
    assert len(token.value) == 64 and token.value not in repr(token)
    assert token.matches(token.value) and not token.matches(token.value[:-1] + "x") and not token.matches("")
    path.chmod(0o644)
    with pytest.raises(auth.TokenError, match="chmod 600"):
        auth.load_or_create(path)
    path.write_text("short\n")
    path.chmod(0o600)
    with pytest.raises(auth.TokenError, match="does not hold a token"):
        auth.load_or_create(path)


def test_default_path_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(auth.ENV, str(tmp_path / "t"))
    assert auth.default_path() == tmp_path / "t"
    monkeypatch.delenv(auth.ENV)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert auth.default_path() == tmp_path / "kvpool" / "token"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert auth.default_path() == Path.home() / ".config" / "kvpool" / "token"


def test_which_calls_need_the_token() -> None:
    def route(auth_: Auth) -> Route:
        return Route("POST", ("v1", "x"), lambda _r: None, auth_)  # type: ignore[arg-type,return-value]

    assert route(Auth.TOKEN).needs_token(None) and route(Auth.TOKEN).needs_token("10.0.0.1")
    assert not route(Auth.NONE).needs_token(None)
    local = route(Auth.LOCAL_TOKEN)
    assert local.needs_token(None) and local.needs_token("127.0.0.1") and local.needs_token("::1")
    assert not local.needs_token("10.0.0.1")  # another host: the handler checks its address instead
    assert is_remote("10.0.0.1") and not is_remote("127.0.0.5") and not is_remote(None)


# ---------------------------------------------------------------------------------- 401 everywhere
def _call(url_port: int, route: Route, token: str | None) -> tuple[int, dict[str, object]]:
    path = "/" + "/".join(PARAMS[s[1:-1]] if s.startswith("{") else s for s in route.segments)
    conn = http.client.HTTPConnection("127.0.0.1", url_port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn.request(route.method, path, body=b"{}", headers=headers)
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    assert text.endswith("\n") and "\n" not in text[:-1], text
    return resp.status, json.loads(text)


def _check_every_mutating_route(port: int, routes: list[Route], token: str) -> int:
    checked = 0
    for route in routes:
        if route.method == "GET":
            assert route.auth is Auth.NONE
            continue
        checked += 1
        for presented in (None, "", "wrong" * 10, token + "x"):
            status, doc = _call(port, route, presented)
            assert (status, doc["code"]) == (401, "unauthorized"), (route, presented, doc)
            assert "Bearer" in str(doc["error"]) and token not in str(doc["error"])
        status, doc = _call(port, route, token)
        assert status != 401, (route, doc)  # with the token, whatever the endpoint then says
    return checked


def test_every_mutating_agent_endpoint_needs_the_token() -> None:
    agent = Agent(AgentConfig(udp_port=0, api_port=0, log_level="WARNING"))
    agent.start()
    try:
        routes = AgentApi(agent).router().routes
        assert _check_every_mutating_route(agent.api_port, routes, agent.token.value) == 8  # hints, lookup too
        assert agent.chunk(1) is None  # nothing refused got through
    finally:
        agent.stop()


@pytest.fixture
def bare(tmp_path: Path) -> Iterator[Daemon]:
    with running(tmp_path, switch=False) as d:
        yield d


def test_every_mutating_controller_endpoint_needs_the_token_from_a_local_caller(bare: Daemon) -> None:
    token = bare.api.token.value
    routes = bare.api.server.router.routes
    assert _check_every_mutating_route(bare.api.port, routes, token) == 12  # node versions and republish included
    assert bare.controller.directory.counts() == {"up": 0, "down": 0}


def test_ctl_works_for_its_user_and_is_refused_without_the_token(bare: Daemon, tmp_path: Path) -> None:
    ctl = [sys.executable, "-m", "controller.ctl", "--api", bare.url]
    ok = subprocess.run([*ctl, "quota", "3", "5"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert ok.returncode == 0 and "quota of tenant 3: 5" in ok.stdout, ok.stderr  # the token file, found by itself
    r = subprocess.run([*ctl, "--token-file", str(tmp_path / "none"), "quota", "3", "5"], capture_output=True,
                       text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "[unauthorized]" in r.stderr
    assert subprocess.run([*ctl, "--token-file", str(tmp_path / "none"), "--json", "nodes"], capture_output=True,
                          timeout=60, cwd=REPO).returncode == 0  # reads need no token


# ---------------------------------------------------------------------------------- node identity
def _register(client: ControllerClient, node_id: str, address: str, credential: str = "") -> dict[str, object]:
    headers = {auth.NODE_CREDENTIAL_HEADER: credential} if credential else {}
    return client.post("/v1/nodes/register", {"node_id": node_id, "address": address, "role": "holder",
                                              "tiers": {"pool": 1 << 20}}, headers)


def test_a_node_registers_and_publishes_only_as_itself(bare: Daemon) -> None:
    client = ControllerClient(bare.url)  # the operator's token, as a local agent has it
    reg = Registration(client, "h0", H0.address, "holder", {"pool": 1 << 20})
    reg.register()
    assert len(reg.credential) == 32
    reg.publish([SMALL], "pool", 1000)
    # Another local process with the operator's token but not h0's credential cannot speak for h0 ...
    for method, path, doc in (("POST", "/v1/nodes/h0/heartbeat", {}),
                              ("POST", "/v1/nodes/h0/publish", {"keys": ["0x99"], "tier": "pool", "nbytes": 1}),
                              ("POST", "/v1/nodes/h0/withdraw", {"keys": [f"{SMALL:#x}"]}),
                              ("DELETE", "/v1/nodes/h0", None)):
        for credential in ("", "0" * 32):
            with pytest.raises(ApiError) as e:
                client.call(method, path, doc, {auth.NODE_CREDENTIAL_HEADER: credential} if credential else {})
            assert (e.value.status, e.value.code) == (403, "bad_credential"), path
    # ... nor take its name while it is live, nor its address under another name.
    with pytest.raises(ApiError) as e:
        _register(client, "h0", H0.address)
    assert (e.value.status, e.value.code) == (409, "node_live")
    with pytest.raises(ApiError) as e:
        _register(client, "evil", H0.address)
    assert e.value.status == 403 and "already registered" in e.value.message
    holders = client.holders(SMALL)
    assert [(h["node_id"], h["address"]) for h in holders] == [("h0", H0.address)]
    assert client.holders(0x99) == []
    # The node itself still can, and re-registering with its credential keeps it.
    reg.heartbeat()
    reg.register()
    assert reg.reregistrations == 0 and client.holders(SMALL)
    reg.stop()
    assert client.get("/v1/nodes")["nodes"] == []


def test_a_restarted_agent_waits_for_its_old_registration_to_expire(tmp_path: Path) -> None:
    with running(tmp_path, heartbeat_timeout_s=0.3, switch=False) as d:
        client = ControllerClient(d.url)
        crashed = Registration(client, "h1", H1.address, "inference", {"hbm": 1 << 20})
        crashed.register()  # and then never heartbeats again, as a killed agent
        impatient = Registration(client, "h1", H1.address, "inference", {"hbm": 1 << 20}, live_wait_s=0.0)
        with pytest.raises(ApiError) as e:
            impatient.register()
        assert e.value.code == "node_live"
        restarted = Registration(client, "h1", H1.address, "inference", {"hbm": 1 << 20}, live_wait_s=10.0)
        restarted.register()  # waits until the epoch loop marks the old registration down
        assert restarted.credential and restarted.credential != crashed.credential
        with pytest.raises(ApiError) as e:
            crashed.heartbeat()  # the old credential speaks for nobody now
        assert e.value.code == "bad_credential"
        restarted.stop()
