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
    assert topo.to_dict() == leaf_spine(2, 2, 4, fabric_mbps=1000, host_mbps=1000).to_dict()
    assert set(topo.switches) == {"s1", "s2", "s3", "s4"}


def test_star_routes_point_at_host_ports() -> None:
    topo = star(3)
    routes = {(r.switch, r.host): r.port for r in topo.host_routes()}
    assert routes == {("s1", "h0"): 1, ("s1", "h1"): 2, ("s1", "h2"): 3, ("s1", "h3"): 4}


def test_leaf_spine_routes_cross_the_fabric() -> None:
    topo = leaf_spine(2, 2, 2)
    routes = {(r.switch, r.host): r.port for r in topo.host_routes()}
    # h3 sits on leaf s2 (hosts there start at port 3): leaf s1 sends it up spine port 1 (lowest
    # port among equal-cost paths), the spines send it down their port 2, s2 delivers locally.
    assert routes[("s1", "h3")] == 1
    assert routes[("s3", "h3")] == 2 and routes[("s4", "h3")] == 2
    assert routes[("s2", "h3")] == 3
    assert routes[("s2", "h0")] in (1, 2)
    assert len(routes) == 4 * len(topo.hosts)


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
