"""Which switch holds a chunk: the meeting point of its demand paths toward its holders."""

from __future__ import annotations

import pytest

from controller.policy.site import Site, choose_site, edge_switches
from kvpool.topology import Topology, leaf_spine, star

FABRIC = leaf_spine(4, 2, 8, 2)  # holders h0, h101 on s1; requesters on s2..s4; spines s5, s6
HOLDERS = ["h0", "h101"]


def test_star_holds_everything_on_its_one_switch() -> None:
    assert choose_site(star(4), ["h0"], {"s1": 9}) == Site("s1")


def test_demand_behind_several_leaves_meets_at_the_spine() -> None:
    site = choose_site(FABRIC, HOLDERS, {"s2": 3, "s3": 3, "s4": 2})
    # All three leaves reach the holders' leaf through spine s5 (the lowest port): one copy
    # there saves the holder links and the spine-to-holder link; the leaves relay the room.
    assert site == Site("s5", frozenset({"s2", "s3", "s4"}))
    assert site.switches == {"s2", "s3", "s4", "s5"}


def test_demand_behind_one_leaf_stays_on_that_leaf() -> None:
    assert choose_site(FABRIC, HOLDERS, {"s3": 5}) == Site("s3")


def test_no_reports_place_for_every_requester() -> None:
    assert edge_switches(FABRIC) == {"s2": 3, "s3": 3, "s4": 2}
    assert choose_site(FABRIC, HOLDERS, {}) == Site("s5", frozenset({"s2", "s3", "s4"}))
    # Counts of zero and unknown switches are no demand.
    assert choose_site(FABRIC, HOLDERS, {"s3": 0, "s9": 4}) == choose_site(FABRIC, HOLDERS, {})


def test_demand_on_the_holders_leaf_keeps_the_copy_there() -> None:
    one_leaf = leaf_spine(1, 1, 3)
    assert choose_site(one_leaf, ["h0"], {"s1": 3}) == Site("s1")
    assert choose_site(FABRIC, HOLDERS, {"s1": 1, "s2": 4}) == Site("s1", frozenset({"s2", "s5"}))


def test_holders_apart_with_no_common_switch_fall_back_to_the_busiest_branch() -> None:
    # Two holders on two leaves of a fabric that routes them over different spines has no
    # switch on every path: the busiest demand switch serves its own requesters.
    topo = Topology.from_dict({
        "switches": {"s1": {}, "s2": {}, "s3": {}},
        "hosts": {"h0": {"ip": "10.0.0.100/24", "mac": "08:00:00:00:00:64", "role": "holder"},
                  "h101": {"ip": "10.0.0.101/24", "mac": "08:00:00:00:00:65", "role": "holder"},
                  "h1": {"ip": "10.0.0.1/24", "mac": "08:00:00:00:00:01"},
                  "h2": {"ip": "10.0.0.2/24", "mac": "08:00:00:00:00:02"}},
        "links": [["s1-p1", "s2-p1"], ["s1-p2", "s3-p1"], ["h0", "s2-p2"], ["h101", "s3-p2"], ["h1", "s2-p3"],
                  ["h2", "s3-p3"]]})
    assert choose_site(topo, ["h0", "h101"], {"s2": 2, "s3": 5}) == Site("s3")


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="at least one holder"):
        choose_site(FABRIC, [], {"s2": 1})
