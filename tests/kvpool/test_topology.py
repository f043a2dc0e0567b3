"""Topologies as data: the committed JSON files, the generators, validation, host routes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool.topology import Topology, TopologyError, leaf_spine, load, star
from tests.paths import REPO

TOPO_DIR = REPO / "bmv2_topologies"


def test_committed_star_matches_generator() -> None:
    topo = load(TOPO_DIR / "star.json")
    assert topo.to_dict() == star(8, holder_mbps=100, host_mbps=1000).to_dict()
    assert [h.name for h in topo.holders()] == ["h0"]
    assert len(topo.inference_hosts()) == 8
    assert topo.host_link("h0").bandwidth_mbps == 100


def test_committed_leaf_spine_loads() -> None:
    topo = load(TOPO_DIR / "leaf_spine.json")
    assert topo.to_dict() == leaf_spine(4, 2, 8, 2, holder_mbps=100, host_mbps=1000, fabric_mbps=1000).to_dict()
    assert set(topo.switches) == {f"s{i}" for i in range(1, 7)}
    assert [h.name for h in topo.holders()] == ["h0", "h101"]


def test_star_routes_point_at_host_ports() -> None:
    topo = star(3)
    routes = {(r.switch, r.host): r.port for r in topo.host_routes()}
    assert routes == {("s1", "h0"): 1, ("s1", "h1"): 2, ("s1", "h2"): 3, ("s1", "h3"): 4}


def test_star_with_two_holders_puts_requesters_after_them() -> None:
    topo = star(2, holders=2)
    assert {h.name: h.address for h in topo.holders()} == {"h0": "10.0.0.100", "h101": "10.0.0.101"}
    routes = {(r.switch, r.host): r.port for r in topo.host_routes()}
    assert routes == {("s1", "h0"): 1, ("s1", "h101"): 2, ("s1", "h1"): 3, ("s1", "h2"): 4}


def test_leaf_spine_puts_holders_on_one_leaf_and_deals_requesters_over_the_others() -> None:
    topo = leaf_spine(4, 2, 8, 2)
    assert {h.name: topo.attachment(h.name) for h in topo.holders()} == {"h0": "s1", "h101": "s1"}
    leaves = {h.name: topo.attachment(h.name) for h in topo.inference_hosts()}
    assert leaves == {"h1": "s2", "h2": "s3", "h3": "s4", "h4": "s2", "h5": "s3", "h6": "s4", "h7": "s2",
                      "h8": "s3"}
    assert {s for s, spec in topo.switches.items() if spec["tier"] == "spine"} == {"s5", "s6"}
    # One leaf only: the requesters share it with the holders.
    alone = leaf_spine(1, 1, 3)
    assert {alone.attachment(h) for h in alone.hosts} == {"s1"}


def test_leaf_spine_routes_cross_the_fabric() -> None:
    topo = leaf_spine(2, 2, 2)
    routes = {(r.switch, r.host): r.port for r in topo.host_routes()}
    # h1 and h2 sit on leaf s2 (hosts there start at port 3): leaf s1 sends them up spine
    # port 1 (lowest port among equal-cost paths), the spines send them down their port 2,
    # s2 delivers locally.
    assert routes[("s1", "h1")] == 1
    assert routes[("s3", "h1")] == 2 and routes[("s4", "h1")] == 2
    assert (routes[("s2", "h1")], routes[("s2", "h2")]) == (3, 4)
    assert routes[("s2", "h0")] == 1
    assert len(routes) == 4 * len(topo.hosts)


def test_paths_to_hosts_and_switches() -> None:
    topo = leaf_spine(4, 2, 3)
    assert topo.path("s3", "h0") == ["s3", "s5", "s1"]
    assert topo.path("s1", "h2") == ["s1", "s5", "s3"]
    assert topo.path("s1", "h0") == ["s1"]
    assert topo.path("s6", "s2") == ["s6", "s2"]
    assert topo.next_hops("s5") == {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s6": 1}
    with pytest.raises(TopologyError, match="is linked to"):
        Topology.from_dict({"switches": {"s1": {}}, "hosts": {
            "h0": {"ip": "10.0.0.100/24", "mac": "08:00:00:00:00:64", "role": "holder"},
            "h1": {"ip": "10.0.0.1/24", "mac": "08:00:00:00:00:01"}},
            "links": [["h0", "h1"]]}).attachment("h0")


def test_generated_fabrics_are_symmetric_and_a_crossed_one_is_not() -> None:
    assert leaf_spine(4, 2, 8, 2).asymmetric_pairs() == []
    assert star(4).asymmetric_pairs() == []
    # Leaf s1 reaches the spines as s3 (port 1) then s4, leaf s2 the other way round: the
    # lowest port sends s1's packets through s3 and s2's back through s4.
    crossed = Topology.from_dict({
        "switches": {"s1": {}, "s2": {}, "s3": {}, "s4": {}},
        "hosts": {"h0": {"ip": "10.0.0.100/24", "mac": "08:00:00:00:00:64", "role": "holder"},
                  "h1": {"ip": "10.0.0.1/24", "mac": "08:00:00:00:00:01"}},
        "links": [["s1-p1", "s3-p1"], ["s1-p2", "s4-p1"], ["s2-p1", "s4-p2"], ["s2-p2", "s3-p2"],
                  ["h0", "s1-p3"], ["h1", "s2-p3"]]})
    assert crossed.asymmetric_pairs() == [("h0", "h1")]


def test_round_trip_through_dict() -> None:
    topo = leaf_spine(3, 2, 1, fabric_mbps=40)
    again = Topology.from_dict(topo.to_dict())
    assert again.to_dict() == topo.to_dict()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"hosts": {}, "switches": {}, "links": []}, "at least one switch"),
        ({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "10.0.0.1/24", "mac": "08:00:00:00:00:01"}},
          "links": [["h1", "s1-p1"]]}, "role 'holder'"),
        ({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "10.0.0.999/24", "mac": "08:00:00:00:00:01"}}},
         "bad ip"),
        ({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "10.0.0.1/24", "mac": "zz", "role": "holder"}}},
         "bad mac"),
        ({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "10.0.0.1/24", "mac": "08:00:00:00:00:01",
                                                   "role": "holder"}},
          "links": [["h1", "s1"]]}, "must name a port"),
        ({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "10.0.0.1/24", "mac": "08:00:00:00:00:01",
                                                   "role": "holder"}},
          "links": [["h1", "s1-p1", "2ms", -5]]}, "positive number"),
        ({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "10.0.0.1/24", "mac": "08:00:00:00:00:01",
                                                   "role": "holder"}},
          "links": [["h1", "s1-p1"], ["h9", "s1-p1"]]}, "not a host"),
        ({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "10.0.0.1/24", "mac": "08:00:00:00:00:01",
                                                   "role": "holder"}}, "bogus": 1}, "unknown keys"),
    ],
)
def test_bad_topologies_name_the_problem(data: dict[str, object], message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        Topology.from_dict(data)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="no such topology file"):
        load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TopologyError, match="not valid JSON"):
        load(bad)


def test_star_size_limits() -> None:
    assert len(star(16).hosts) == 17
    with pytest.raises(TopologyError, match=r"1\.\.16"):
        star(17)


def test_generator_limits_name_the_parameter() -> None:
    with pytest.raises(TopologyError, match=r"holders must be 1\.\.8"):
        star(2, holders=0)
    with pytest.raises(TopologyError, match=r"requesters must be 1\.\.32"):
        leaf_spine(4, 2, 33)
    with pytest.raises(TopologyError, match="leaves and spines"):
        leaf_spine(0, 2, 2)
