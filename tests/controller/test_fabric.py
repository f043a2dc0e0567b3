"""The controller's per-switch intended state, from topologies: pure checks, then shipped to the model."""

from __future__ import annotations

import pytest

from controller.fabric import FabricSettings, sink_addresses, switch_configs, waiter_ids
from kvpool import contract as n
from kvpool.contract import COALESCE_MCAST_GRP
from kvpool.tcp import free_port
from kvpool.topology import leaf_spine, star

KVPOOL_P4INFO = n.build_dir() / n.P4INFO_FILE


def test_star_config() -> None:
    topo = star(3)
    cfg = switch_configs(topo)["s1"]
    routes = {e.match[n.KEY_IPV4_DST]: e.params for e in cfg.entries if e.table == n.IPV4_ROUTE}
    assert routes[("10.0.0.100", 32)] == {"port": 1, "dst_mac": "08:00:00:00:00:64"}
    assert routes[("10.0.0.2", 32)] == {"port": 3, "dst_mac": "08:00:00:00:00:02"}
    sink = [e for e in cfg.entries if e.table == n.IPV4_ROUTE and e.action == n.DROP_NO_ROUTE]
    assert [e.match[n.KEY_IPV4_DST] for e in sink] == [("10.0.0.254", 32)]
    # The holder's address is a writer on the port towards the holder only.
    writers = [e.match for e in cfg.entries if e.table == n.WRITERS]
    assert writers == [{n.KEY_INGRESS_PORT: 1, n.KEY_WRITER_SRC: "10.0.0.100"}]
    # Every host port admits its host's address only.
    guards = {e.match[n.KEY_INGRESS_PORT]: e.params["addr"] for e in cfg.entries if e.table == n.HOST_GUARD}
    assert guards == {1: "10.0.0.100", 2: "10.0.0.1", 3: "10.0.0.2", 4: "10.0.0.3"}
    assert set(cfg.digests) == {n.HOT_CHUNK, n.FILL_MISMATCH}
    assert waiter_ids(topo, "s1") == {"h1": 0, "h2": 1, "h3": 2}
    # One replica per waiter, out of the port toward it, with the waiter id as its rid; the
    # group for highest id t holds waiters 0..t (a release replicates only that far).
    assert cfg.groups == {COALESCE_MCAST_GRP: [(2, 0)], COALESCE_MCAST_GRP + 1: [(2, 0), (3, 1)],
                          COALESCE_MCAST_GRP + 2: [(2, 0), (3, 1), (4, 2)]}
    rewrite = {e.match[n.KEY_EGRESS_RID]: e.params for e in cfg.entries if e.table == n.WAITER_EGRESS}
    assert rewrite[1] == {"addr": "10.0.0.2", "mac": "08:00:00:00:00:02"}
    assert cfg.defaults[n.COALESCE_CONFIG] == (n.SET_PENDING_TIMEOUT, {"timeout_us": 100_000})


def test_waiter_ids_sort_numerically_and_are_bounded() -> None:
    assert list(waiter_ids(star(12), "s1")) == [f"h{i}" for i in range(1, 13)]


def test_waiter_ids_put_a_switchs_own_hosts_first() -> None:
    topo = leaf_spine(3, 2, 6)  # h1..h6 dealt over leaves s2 and s3
    own = {leaf: sorted((h for h in ("h1", "h2", "h3", "h4", "h5", "h6") if topo.attachment(h) == leaf),
                        key=lambda h: int(h[1:])) for leaf in ("s2", "s3")}
    assert own["s2"] and own["s3"]
    for leaf, hosts in own.items():
        ids = waiter_ids(topo, leaf)
        assert sorted(ids.values()) == list(range(6))
        assert [h for h, _ in sorted(ids.items(), key=lambda kv: kv[1])][:len(hosts)] == hosts
    # A release to the leaf's own requesters replicates to them only.
    groups = switch_configs(topo)["s2"].groups
    assert groups[COALESCE_MCAST_GRP + len(own["s2"]) - 1] == [
        (r.port, w) for w, r in enumerate(r for h in own["s2"] for r in topo.host_routes()
                                          if r.switch == "s2" and r.host == h)]


def test_leaf_spine_replicas_go_up_for_remote_waiters() -> None:
    topo = leaf_spine(2, 2, 4, holders=2)  # holders h0, h101 on s1 (ports 3, 4); h1..h4 on s2 (ports 3..6)
    cfgs = switch_configs(topo)
    # On leaf s1 every waiter lives on leaf s2: their replicas leave by spine port 1.
    assert cfgs["s1"].groups[COALESCE_MCAST_GRP + 3] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert cfgs["s2"].groups[COALESCE_MCAST_GRP + 3] == [(3, 0), (4, 1), (5, 2), (6, 3)]
    assert all(len(c.groups) == 4 and len(c.groups[COALESCE_MCAST_GRP + 3]) == 4 for c in cfgs.values())
    # Host ports are guarded; ports between switches are marked as fabric ports instead
    # (switches are trusted; popularity counts a fetch where it entered the fabric).
    guards = {e.match[n.KEY_INGRESS_PORT]: e.action for e in cfgs["s1"].entries if e.table == n.HOST_GUARD}
    assert guards == {1: n.FABRIC_PORT, 2: n.FABRIC_PORT, 3: n.GUARD_SOURCE, 4: n.GUARD_SOURCE}
    spine = {e.match[n.KEY_INGRESS_PORT]: e.action for e in cfgs["s3"].entries if e.table == n.HOST_GUARD}
    assert spine == {1: n.FABRIC_PORT, 2: n.FABRIC_PORT}
    # On every switch, each holder's address is a writer only on the port towards that holder.
    for sw, cfg in cfgs.items():
        writers = sorted((e.match[n.KEY_WRITER_SRC], e.match[n.KEY_INGRESS_PORT]) for e in cfg.entries
                         if e.table == n.WRITERS)
        ports = {r.host: r.port for r in topo.host_routes() if r.switch == sw}
        assert writers == [("10.0.0.100", ports["h0"]), ("10.0.0.101", ports["h101"])]


def test_every_switch_has_a_fill_sink_routed_toward_it() -> None:
    topo = leaf_spine(3, 2, 2)  # leaves s1..s3, spines s4, s5
    assert sink_addresses(topo) == {"s1": "10.0.0.254", "s2": "10.0.0.253", "s3": "10.0.0.252",
                                    "s4": "10.0.0.251", "s5": "10.0.0.250"}
    cfgs = switch_configs(topo)

    def sink_route(sw: str, addr: str) -> tuple[str, object]:
        (e,) = [e for e in cfgs[sw].entries if e.table == n.IPV4_ROUTE and e.match[n.KEY_IPV4_DST] == (addr, 32)]
        return e.action, e.params.get("port")

    # A push to the sink of spine s4 leaves the holders' leaf s1 by its port 1 and is dropped at s4.
    assert sink_route("s1", "10.0.0.251") == (n.IPV4_FORWARD, 1)
    assert sink_route("s4", "10.0.0.251") == (n.DROP_NO_ROUTE, None)
    # To leaf s2's sink: up through spine s4 (lowest port), down its port 2.
    assert sink_route("s1", "10.0.0.253") == (n.IPV4_FORWARD, 1)
    assert sink_route("s4", "10.0.0.253") == (n.IPV4_FORWARD, 2)
    with pytest.raises(ValueError, match="host h1's address"):
        sink_addresses(topo, FabricSettings(fill_sink="10.0.0.1"))


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match="popularity_epoch"):
        switch_configs(star(1), FabricSettings(popularity_epoch=0))


@pytest.mark.skipif(not KVPOOL_P4INFO.exists(), reason="p4/build/kvpool.p4info.txtpb not built yet")
def test_config_is_accepted_by_the_model_switch() -> None:
    from controller.p4runtime import P4RuntimeSwitch
    from switchmodel.p4rt_server import P4RuntimeServer
    from switchmodel.state import SwitchState

    port = free_port()
    server = P4RuntimeServer(SwitchState(), f"127.0.0.1:{port}").start()
    try:
        cfg = switch_configs(leaf_spine(2, 2, 6))["s1"]
        with P4RuntimeSwitch(f"127.0.0.1:{port}", KVPOOL_P4INFO, b"", timeout_s=3) as sw:
            sw.connect()
            sw.insert_entries(cfg.entries)
            for table, (action, params) in cfg.defaults.items():
                sw.set_default_action(table, action, params)
            for gid, replicas in cfg.groups.items():
                sw.set_multicast_group(gid, replicas)
            for name, dc in cfg.digests.items():
                sw.configure_digest(name, dc.max_timeout_ns, dc.max_list_size)
            assert len(sw.read_entries(n.IPV4_ROUTE)) == 11  # 7 hosts + the fill sinks of the 4 switches
            assert len(sw.read_entries(n.HOST_GUARD)) == 3  # the holder's port, the two spine ports
            assert len(sw.read_entries(n.WAITER_LOOKUP)) == 6
            assert sw.read_multicast_groups() == cfg.groups
            assert sw.read_default_action(n.POPULARITY_CONFIG) == (n.SET_POPULARITY, {"threshold": 4, "epoch": 1})
    finally:
        server.stop()
