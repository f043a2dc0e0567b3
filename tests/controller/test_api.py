"""The controller API against a real daemon and the model switch over gRPC (tests/ctl_harness.py).

Every override is checked in the switch's own table state afterwards; refusals carry a
reason code and leave the switch alone; the directory is driven over TCP and the Unix
socket, including a node that misses its heartbeats and comes back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostagent.registration import ControllerClient, Registration
from kvpool import wire
from kvpool.contract import DropReason
from kvpool.http_api import ApiError, ApiUnreachableError
from tests.ctl_harness import (
    BIG,
    CHILD,
    HUGE,
    OTHER,
    P4INFO,
    POOL_SLOTS,
    SLOTS,
    SMALL,
    TOPO,
    TWO,
    UNKNOWN,
    Daemon,
    running,
)
from tests.paths import REPO

ROOT = REPO
H0, H1, H2 = (TOPO.hosts[h] for h in ("h0", "h1", "h2"))


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with running(tmp_path) as d:
        yield d


@pytest.fixture
def api(daemon: Daemon) -> ControllerClient:
    return ControllerClient(daemon.url, timeout=10)


@pytest.fixture
def bare(tmp_path: Path) -> Iterator[Daemon]:
    """The daemon and its API without a switch: the directory needs none (and no P4Info)."""
    with running(tmp_path, switch=False) as d:
        yield d


def _refused(client: ControllerClient, path: str, body: dict[str, object]) -> ApiError:
    with pytest.raises(ApiError) as e:
        client.post(path, body)
    return e.value


def _holder(client: ControllerClient, tiers: dict[str, int] | None = None) -> Registration:
    reg = Registration(client, "h0", H0.address, "holder", tiers or {"dram": 1 << 20, "pool": 1 << 24})
    reg.register()
    return reg


# ------------------------------------------------------------------------------------ reads
def test_status_names_switches_nodes_and_pipeline(daemon: Daemon, api: ControllerClient) -> None:
    st = api.get("/v1/status")
    sw = st["switches"]["s1"]
    assert sw["address"] == daemon.switch_address and sw["device_id"] == 1
    assert sw["connected"] and sw["master"]
    assert sw["pipeline"]["installed"] is True and sw["pipeline"]["p4info"] == P4INFO.name
    assert sw["slots"] == {"total": POOL_SLOTS, "used": 0, "free": POOL_SLOTS}
    assert st["nodes"] == {"up": 0, "down": 0}
    assert st["mode"] == "pool" and st["target"] == "model" and st["catalog"] == len(SLOTS)
    first = st["epoch"]
    time.sleep(0.2)
    assert api.get("/v1/status")["epoch"] > first, "the epoch loop is not running"


def test_unknown_paths_methods_and_bodies(api: ControllerClient) -> None:
    for method, path, code in (("GET", "/v1/nope", 404), ("GET", "/v2/status", 404), ("POST", "/v1/status", 405),
                               ("GET", "/v1/admit", 405), ("GET", "/v1/switches/s9", 404)):
        with pytest.raises(ApiError) as e:
            api.call(method, path, {} if method == "POST" else None)
        assert e.value.status == code, (method, path)
    e2 = _refused(api, "/v1/admit", {"key": "xyz"})
    assert e2.status == 400 and "not hex" in str(e2)
    e3 = _refused(api, "/v1/evict", {"key": f"{SMALL:#x}", "action": "shred"})
    assert e3.status == 400 and "demote or drop" in str(e3)
    e4 = _refused(api, "/v1/quota", {"tenant": -1, "slots": 3})
    assert e4.status == 400
    with pytest.raises(ApiError, match="expected one of value"):
        api.get("/v1/top?sort=colour")


def test_switch_endpoint_for_the_shell(daemon: Daemon, api: ControllerClient) -> None:
    sw = api.get("/v1/switches/s1")
    assert sw["address"] == daemon.switch_address and sw["device_id"] == 1
    assert Path(sw["p4info"]) == P4INFO.resolve()


# ------------------------------------------------------------------------------------ overrides
def test_admit_writes_the_pool_entry_and_evict_removes_it(daemon: Daemon, api: ControllerClient) -> None:
    out = api.post("/v1/admit", {"key": f"{TWO:#x}"})
    assert out["admitted"] == [f"{TWO:#x}"] and out["evicted"] == []
    entry = daemon.pool_entry(TWO)
    assert entry is not None, "admit is not visible in the switch after the call returned"
    assert entry["base_slot"] == out["base_slot"] and entry["frag_count"] == SLOTS[TWO]
    assert entry["chunk_len"] == 2 * wire.FRAG_PAYLOAD
    assert api.post("/v1/admit", {"key": f"{TWO:#x}"})["already"] is True
    st = api.get("/v1/status")
    assert st["switches"]["s1"]["slots"]["used"] == 2 and st["pool"]["chunks"] == 1
    top = api.get("/v1/top")["chunks"]
    assert [r["key"] for r in top] == [f"{TWO:#x}"] and top[0]["tier"] == "switch"

    # Demotion needs a live node holding it in a lower tier; --drop does not.
    e = _refused(api, "/v1/evict", {"key": f"{TWO:#x}", "action": "demote"})
    assert e.status == 409 and e.code == "no_lower_tier"
    assert daemon.pool_entry(TWO) is not None
    out = api.post("/v1/evict", {"key": f"{TWO:#x}", "action": "drop"})
    assert out["evicted"] == [f"{TWO:#x}"] and out["action"] == "drop"
    assert daemon.pool_entry(TWO) is None
    e = _refused(api, "/v1/evict", {"key": f"{TWO:#x}", "action": "drop"})
    assert e.code == "not_resident"


def test_evict_demote_with_a_holder_in_a_lower_tier(daemon: Daemon, api: ControllerClient) -> None:
    # A copy in an inference node's own HBM serves nobody else: not somewhere to demote to.
    requester = Registration(api, "h1", H1.address, "inference", {"hbm": 1 << 20})
    requester.register()
    requester.publish([SMALL], "hbm", 1000)
    api.post("/v1/admit", {"key": f"{SMALL:#x}"})
    assert _refused(api, "/v1/evict", {"key": f"{SMALL:#x}"}).code == "no_lower_tier"
    reg = _holder(api)
    reg.publish([SMALL], "pool", 1000)
    assert daemon.pool_entry(SMALL) is not None
    out = api.post("/v1/evict", {"key": f"{SMALL:#x}"})  # demote is the default
    assert out["action"] == "demote" and daemon.pool_entry(SMALL) is None
    chunk = api.get(f"/v1/chunks/{SMALL:#x}")
    assert [(h["node_id"], h["tier"]) for h in chunk["holders"]] == [("h1", "hbm"), ("h0", "pool")]
    assert chunk["switch"] is None  # out of the switch, never fetched: not a row of top


def test_a_parent_is_not_evicted_before_its_child(daemon: Daemon, api: ControllerClient) -> None:
    api.post("/v1/admit", {"key": f"{SMALL:#x}"})
    api.post("/v1/admit", {"key": f"{CHILD:#x}"})
    e = _refused(api, "/v1/evict", {"key": f"{SMALL:#x}", "action": "drop"})
    assert e.code == "has_children" and "child" in str(e)
    api.post("/v1/evict", {"key": f"{CHILD:#x}", "action": "drop"})
    api.post("/v1/evict", {"key": f"{SMALL:#x}", "action": "drop"})
    assert daemon.pool_entry(SMALL) is None and daemon.pool_entry(CHILD) is None


def test_pin_unpin_and_the_pin_limit(daemon: Daemon, api: ControllerClient) -> None:
    out = api.post("/v1/pin", {"key": f"{BIG:#x}"})
    assert out["admitted"] == [f"{BIG:#x}"]
    assert daemon.pool_entry(BIG) is not None and daemon.pool_entry(BIG)["frag_count"] == 8  # type: ignore[index]
    row = next(r for r in api.get("/v1/top")["chunks"] if r["key"] == f"{BIG:#x}")
    assert row["pinned"] is True
    e = _refused(api, "/v1/evict", {"key": f"{BIG:#x}", "action": "drop"})
    assert e.code == "pinned" and "unpin" in str(e)
    # BIG holds the whole pin bound (25 % of 32 slots): one more pinned slot is refused.
    e = _refused(api, "/v1/pin", {"key": f"{OTHER:#x}"})
    assert e.status == 409 and e.code == "pin_limit" and "pin bound" in str(e)
    assert daemon.pool_entry(OTHER) is None
    api.post("/v1/unpin", {"key": f"{BIG:#x}"})
    assert daemon.pool_entry(BIG) is not None  # unpinned, still resident
    e = _refused(api, "/v1/unpin", {"key": f"{BIG:#x}"})
    assert e.code == "not_pinned"
    api.post("/v1/pin", {"key": f"{OTHER:#x}"})
    assert daemon.pool_entry(OTHER) is not None


def test_no_space_and_unknown_keys_are_refused(daemon: Daemon, api: ControllerClient) -> None:
    e = _refused(api, "/v1/admit", {"key": f"{HUGE:#x}"})
    assert e.status == 409 and e.code == "no_space"
    assert daemon.pool_entry(HUGE) is None
    for op in ("admit", "pin", "unpin", "evict"):
        e = _refused(api, f"/v1/{op}", {"key": f"{UNKNOWN:#x}"})
        assert e.code == "unknown_key" and "not in the catalog" in str(e), op
    with pytest.raises(ApiError) as ei:
        api.get(f"/v1/chunks/{UNKNOWN:#x}")
    assert ei.value.status == 404


def test_quota_evicts_the_tenants_chunks_from_the_switch(daemon: Daemon, api: ControllerClient) -> None:
    for key in (SMALL, TWO, OTHER):
        api.post("/v1/admit", {"key": f"{key:#x}"})
    out = api.post("/v1/quota", {"tenant": 0, "slots": 2})
    gone = {int(k, 16) for k in out["evicted"]}
    assert len(gone) >= 1
    left = [k for k in (SMALL, TWO, OTHER) if daemon.pool_entry(k) is not None]
    assert sum(SLOTS[k] for k in left) <= 2 and not gone & set(left)
    assert api.get("/v1/status")["switches"]["s1"]["slots"]["used"] == sum(SLOTS[k] for k in left)
    api.post("/v1/quota", {"tenant": 0, "slots": None})
    api.post("/v1/pin", {"key": f"{BIG:#x}"})
    e = _refused(api, "/v1/quota", {"tenant": 0, "slots": 4})
    assert e.code == "pin_limit" and "pinned slots" in str(e)


def test_overrides_need_the_pool_mode(bare: Daemon) -> None:
    from controller.settings import Mode

    bare.controller.settings.mode = Mode.MULTICAST
    e = _refused(ControllerClient(bare.url), "/v1/admit", {"key": f"{SMALL:#x}"})
    assert e.status == 409 and e.code == "pool_off" and "multicast" in str(e)


def test_override_times_out_when_no_epoch_runs(daemon: Daemon, api: ControllerClient) -> None:
    daemon.stop_event.set()
    daemon.loop.join(timeout=5)
    daemon.api.override_timeout_s = 0.3
    e = _refused(api, "/v1/admit", {"key": f"{SMALL:#x}"})
    assert e.status == 504 and e.code == "timeout"
    assert daemon.pool_entry(SMALL) is None
    # The abandoned override is not applied late, when epochs resume.
    daemon.controller.run_epoch()
    assert daemon.pool_entry(SMALL) is None


# ------------------------------------------------------------------------------------ stats, tiers
def test_stats_are_the_switch_counters_by_label(daemon: Daemon, api: ControllerClient) -> None:
    before = api.get("/v1/stats")["switches"]["s1"]
    assert set(before) >= {"drops", "pool", "coalesce", "popularity", "egress", "slots"}
    assert set(before["drops"]) == {m.name.lower() for m in DropReason if m is not DropReason.NONE}
    daemon.send(H1, H0, wire.get_packet(UNKNOWN, 0, 2, request_id=1))  # a range GET: coalescable
    daemon.send(H1, H0, b"\x00" * 10)  # too short for a kvpool header
    after = api.get("/v1/stats")["switches"]["s1"]
    assert after["pool"]["lookup_miss"] == before["pool"]["lookup_miss"] + 1
    assert after["popularity"]["counted"] == before["popularity"]["counted"] + 1
    assert after["coalesce"]["first"] == before["coalesce"]["first"] + 1
    assert after["drops"]["parse_error"] == before["drops"]["parse_error"] + 1


def test_stats_of_an_unreachable_switch_is_an_error_entry(daemon: Daemon, api: ControllerClient) -> None:
    daemon.stop_event.set()  # the epoch loop would fail on the lost switch (the daemon's concern, not the API's)
    daemon.loop.join(timeout=5)
    daemon.server.stop(0)
    sw = api.get("/v1/stats")["switches"]["s1"]
    assert "error" in sw and daemon.switch_address in sw["error"]


def test_tiers_sum_live_nodes_and_the_switch(daemon: Daemon, api: ControllerClient) -> None:
    reg = _holder(api, {"dram": 1000, "pool": 5000})
    reg2 = Registration(api, "h1", H1.address, "inference", {"hbm": 700, "dram": 300})
    reg2.register()
    reg.publish([SMALL, TWO], "pool", 1000)
    reg2.publish([SMALL], "hbm", 500)
    api.post("/v1/admit", {"key": f"{TWO:#x}"})
    tiers = api.get("/v1/tiers")["tiers"]
    assert tiers["pool"] == {"capacity": 5000, "used": 2000, "chunks": 2, "nodes": 1}
    assert tiers["dram"] == {"capacity": 1300, "used": 0, "chunks": 0, "nodes": 2}
    assert tiers["hbm"] == {"capacity": 700, "used": 500, "chunks": 1, "nodes": 1}
    assert tiers["switch"] == {"capacity": POOL_SLOTS * wire.FRAG_PAYLOAD, "used": 2 * wire.FRAG_PAYLOAD,
                               "chunks": 1, "nodes": 1}


# ------------------------------------------------------------------------------------ directory
def test_registration_over_the_unix_socket_and_holders(bare: Daemon) -> None:
    client = ControllerClient(f"unix:{bare.socket}")
    reg = Registration(client, "h0", H0.address, "holder", {"dram": 1 << 20})
    reg.register()
    assert reg.publish([SMALL, TWO], "dram", 1000) == 2
    chunk = client.get(f"/v1/chunks/{TWO:#x}")
    assert chunk["holders"] == [{"node_id": "h0", "address": H0.address, "tier": "dram", "nbytes": 1000,
                                 "role": "holder"}]
    assert [h["address"] for h in client.holders(SMALL)] == [H0.address]
    assert reg.withdraw([TWO]) == 1
    assert client.get(f"/v1/chunks/{TWO:#x}")["holders"] == []
    assert client.holders(UNKNOWN) == []
    nodes = client.get("/v1/nodes")["nodes"]
    assert [(n["node_id"], n["up"], n["chunks"]) for n in nodes] == [("h0", True, 1)]
    reg.stop()
    assert client.get("/v1/nodes")["nodes"] == []


def _netns_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root for a network namespace (unshare -n)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    return None


@pytest.mark.root
@pytest.mark.skipif(_netns_reason() is not None, reason=str(_netns_reason()))
def test_an_agent_in_another_network_namespace_registers_through_the_socket(bare: Daemon) -> None:
    # As a Mininet host: its own network namespace (the controller's loopback TCP port is not
    # reachable from there), the same filesystem (the Unix socket is).
    script = (
        "import sys\n"
        "from hostagent.registration import ControllerClient, Registration\n"
        "from kvpool.http_api import ApiUnreachableError\n"
        f"tcp = ControllerClient({bare.url!r}, timeout=2)\n"
        "try:\n"
        "    tcp.get('/v1/status')\n"
        "    sys.exit('TCP reached the controller from another namespace')\n"
        "except ApiUnreachableError:\n"
        "    print('tcp unreachable')\n"
        f"reg = Registration(ControllerClient('unix:{bare.socket}'), 'h0', {H0.address!r}, 'holder', "
        "{'pool': 1 << 20})\n"
        "reg.register()\n"
        f"print('new', reg.publish([{SMALL}], 'pool', 1000))\n"
    )
    r = subprocess.run(["unshare", "-n", sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["tcp", "unreachable", "new", "1"]
    client = ControllerClient(bare.url)
    assert [h["address"] for h in client.holders(SMALL)] == [H0.address]


def test_registration_outside_the_node_list_is_refused(bare: Daemon) -> None:
    api = ControllerClient(bare.url)
    e = _refused(api, "/v1/nodes/register", {"node_id": "x", "address": "10.9.9.9", "role": "holder", "tiers": {}})
    assert e.status == 403 and e.code == "refused" and "node list" in str(e)
    e = _refused(api, "/v1/nodes/register", {"node_id": "h1", "address": H1.address, "role": "holder",
                                             "tiers": {}})
    assert e.status == 403 and "configured as inference" in str(e)
    e = _refused(api, "/v1/nodes/register", {"node_id": "h0", "address": H0.address, "tiers": {"ssd": 1}})
    assert e.status == 400
    e = _refused(api, "/v1/nodes/nobody/publish", {"keys": ["0x1"], "tier": "dram", "nbytes": 1})
    assert e.status == 404
    assert api.get("/v1/status")["nodes"] == {"up": 0, "down": 0}


def test_a_silent_node_goes_down_and_comes_back_clean(tmp_path: Path) -> None:
    with running(tmp_path, heartbeat_timeout_s=0.3, switch=False) as d:
        api = ControllerClient(d.url)
        reg = Registration(api, "h0", H0.address, "holder", {"pool": 1 << 20})
        reg.register()
        reg.publish([SMALL], "pool", 1000)
        assert api.get(f"/v1/chunks/{SMALL:#x}")["holders"]
        deadline = time.monotonic() + 5
        while api.get("/v1/status")["nodes"]["down"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert api.get("/v1/status")["nodes"] == {"up": 0, "down": 1}
        assert api.get(f"/v1/chunks/{SMALL:#x}")["holders"] == []
        e = _refused(api, "/v1/nodes/h0/heartbeat", {})
        assert e.status == 410 and "register again" in str(e)
        # The client's heartbeat notices, registers again and republishes what it holds.
        reg.heartbeat()
        assert reg.reregistrations == 1
        assert [h["node_id"] for h in api.get(f"/v1/chunks/{SMALL:#x}")["holders"]] == ["h0"]
        assert api.get("/v1/status")["nodes"] == {"up": 1, "down": 0}
        # Heartbeating in the background keeps it up past several timeouts.
        reg.heartbeat_s = 0.05
        reg.start()  # registers again: what it published comes back with it
        time.sleep(1.0)
        assert api.get("/v1/status")["nodes"] == {"up": 1, "down": 0}
        assert [h["node_id"] for h in api.get(f"/v1/chunks/{SMALL:#x}")["holders"]] == ["h0"]
        assert reg.heartbeat_failures == 0
        reg.stop()
        assert api.get("/v1/status")["nodes"] == {"up": 0, "down": 0}


def test_unreachable_daemon_is_a_clear_error(tmp_path: Path) -> None:
    client = ControllerClient(f"unix:{tmp_path / 'none.sock'}", timeout=2)
    with pytest.raises(ApiUnreachableError, match="unreachable"):
        client.get("/v1/status")
    with pytest.raises(ValueError, match="expected http"):
        ControllerClient("ftp://x")
