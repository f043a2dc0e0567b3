"""The directory of holders: registration against the node list, heartbeats, publish/withdraw."""

from __future__ import annotations

import pytest

from controller.directory import (
    BAD_REQUEST,
    NODE_DOWN,
    OVER_CAPACITY,
    REFUSED,
    UNKNOWN_NODE,
    Directory,
    DirectoryError,
    Role,
)

MiB = 1 << 20


class Clock:
    """A hand-driven clock."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def d(clock: Clock) -> Directory:
    return Directory({"10.0.0.1": Role.HOLDER, "10.0.0.2": Role.INFERENCE, "10.0.0.3": None},
                     heartbeat_timeout_s=3.0, clock=clock)


def _code(exc: pytest.ExceptionInfo[DirectoryError]) -> str:
    return exc.value.code


def test_register_publish_and_find_holders(d: Directory) -> None:
    d.register("h0", "10.0.0.1", "holder", {"dram": 10 * MiB, "pool": 100 * MiB})
    d.register("h2", "10.0.0.3", "holder", {"dram": 10 * MiB})
    assert d.publish("h0", [1, 2], "pool", 5000) == 2
    assert d.publish("h0", [1], "dram", 5000) == 1
    assert d.publish("h2", [1], "dram", 5000) == 1
    holders = d.holders(1)
    # Fastest tier first, then by node id.
    assert [(h.node_id, h.tier) for h in holders] == [("h0", "dram"), ("h2", "dram"), ("h0", "pool")]
    assert holders[0].address == "10.0.0.1" and holders[0].nbytes == 5000 and holders[0].role is Role.HOLDER
    assert d.holders(3) == []
    tiers = d.tiers()
    assert tiers["dram"] == {"capacity": 20 * MiB, "used": 10000, "chunks": 2, "nodes": 2}
    assert tiers["pool"] == {"capacity": 100 * MiB, "used": 10000, "chunks": 2, "nodes": 1}
    assert tiers["hbm"]["capacity"] == 0
    assert d.counts() == {"up": 2, "down": 0}


def test_republishing_does_not_double_count(d: Directory) -> None:
    d.register("h0", "10.0.0.1", "holder", {"dram": 10 * MiB})
    d.publish("h0", [1, 1, 2], "dram", 1000)
    assert d.publish("h0", [1], "dram", 3000) == 0
    assert d.tiers()["dram"]["used"] == 4000


def test_withdraw(d: Directory) -> None:
    d.register("h0", "10.0.0.1", "holder", {"dram": MiB, "pool": MiB})
    d.publish("h0", [7], "dram", 100)
    d.publish("h0", [7], "pool", 100)
    assert d.withdraw("h0", [7], "dram") == 1
    assert [h.tier for h in d.holders(7)] == ["pool"]
    assert d.withdraw("h0", [7, 8]) == 1
    assert d.holders(7) == [] and d.tiers()["pool"]["used"] == 0
    assert d.chunk_tiers() == {}


def test_unlisted_address_or_wrong_role_is_refused(d: Directory) -> None:
    with pytest.raises(DirectoryError, match="not in the configured node list") as e:
        d.register("x", "10.9.9.9", "holder", {})
    assert _code(e) == REFUSED
    with pytest.raises(DirectoryError, match="configured as inference") as e:
        d.register("h1", "10.0.0.2", "holder", {})
    assert _code(e) == REFUSED
    d.register("h0", "10.0.0.1", "holder", {})
    with pytest.raises(DirectoryError, match="already registered as node 'h0'"):
        d.register("imposter", "10.0.0.1", "holder", {})


@pytest.mark.parametrize(("node_id", "role", "caps", "match"), [
    ("", "holder", {}, "node id"),
    ("h0", "boss", {}, "role"),
    ("h0", "holder", {"ssd": 1}, "tier 'ssd'"),
    ("h0", "holder", {"dram": -1}, "capacity of tier dram"),
])
def test_bad_registration(d: Directory, node_id: str, role: str, caps: dict[str, int], match: str) -> None:
    with pytest.raises(DirectoryError, match=match) as e:
        d.register(node_id, "10.0.0.1", role, caps)
    assert _code(e) == BAD_REQUEST
    assert d.nodes() == []


def test_publish_errors_leave_state_alone(d: Directory) -> None:
    with pytest.raises(DirectoryError) as e:
        d.publish("nobody", [1], "dram", 1)
    assert _code(e) == UNKNOWN_NODE
    d.register("h0", "10.0.0.1", "holder", {"dram": 1000})
    with pytest.raises(DirectoryError, match="no 'pool' tier"):
        d.publish("h0", [1], "pool", 1)
    d.publish("h0", [1], "dram", 600)
    with pytest.raises(DirectoryError, match="would hold 1200 of 1000") as e:
        d.publish("h0", [2], "dram", 600)
    assert _code(e) == OVER_CAPACITY
    assert [h.nbytes for h in d.holders(1)] == [600] and d.holders(2) == []


def test_silent_node_goes_down_and_comes_back_clean(d: Directory, clock: Clock) -> None:
    d.register("h0", "10.0.0.1", "holder", {"dram": MiB})
    d.register("h1", "10.0.0.2", "inference", {"hbm": MiB})
    d.publish("h0", [5], "dram", 10)
    clock.t += 2.0
    d.heartbeat("h1")
    assert d.sweep() == []
    clock.t += 2.0  # h0 silent for 4 s > 3 s; h1 for 2 s
    assert d.sweep() == ["h0"]
    assert d.holders(5) == []
    assert d.counts() == {"up": 1, "down": 1}
    assert d.tiers()["dram"]["capacity"] == 0
    with pytest.raises(DirectoryError, match="register again") as e:
        d.heartbeat("h0")
    assert _code(e) == NODE_DOWN
    with pytest.raises(DirectoryError) as e:
        d.publish("h0", [6], "dram", 10)
    assert _code(e) == NODE_DOWN
    # Re-registering starts from nothing: the agent republishes what it holds now.
    d.register("h0", "10.0.0.1", "holder", {"dram": MiB})
    assert d.holders(5) == []
    d.publish("h0", [5], "dram", 10)
    assert [h.node_id for h in d.holders(5)] == ["h0"]
    assert [n["up"] for n in d.nodes()] == [True, True]


def test_a_down_nodes_address_can_be_taken_over(d: Directory, clock: Clock) -> None:
    d.register("old", "10.0.0.3", "holder", {})
    clock.t += 10
    d.sweep()
    d.register("new", "10.0.0.3", "inference", {})
    assert {n["node_id"]: n["up"] for n in d.nodes()} == {"new": True, "old": False}


def test_deregister(d: Directory) -> None:
    d.register("h0", "10.0.0.1", "holder", {"dram": MiB})
    d.publish("h0", [1], "dram", 10)
    d.deregister("h0")
    assert d.holders(1) == [] and d.nodes() == []
    with pytest.raises(DirectoryError):
        d.deregister("h0")


def test_generations_follow_content_and_are_never_issued_twice(d: Directory) -> None:
    first, prev = d.issue(7, digest=0xAAAA, nbytes=5000)
    assert (first.generation, prev) == (1, None)
    assert d.issue(7, 0xAAAA, 5000) == (first, None)  # same bytes (a holder restart): same generation
    second, prev = d.issue(7, 0xBBBB, 5000)
    assert second.generation == 2 and prev == first
    third, prev = d.issue(7, 0xAAAA, 5000)  # the old bytes again are new content now
    assert third.generation == 3 and prev == second
    assert d.issue(7, 0xAAAA, 6000)[0].generation == 4  # another length is another content
    assert d.generations([7, 8]) == {7: 4} and d.version(8) is None
    assert d.version(7) == third.__class__(4, 0xAAAA, 6000)
    with pytest.raises(DirectoryError) as err:
        d.issue(7, -1, 10)
    assert _code(err) == BAD_REQUEST


def test_a_restarted_directory_relearns_from_copies_and_never_goes_back(d: Directory) -> None:
    # An agent republishes what it held before the controller restarted.
    assert d.note(9, generation=5, digest=0x55, nbytes=100) is True
    assert d.generations([9]) == {9: 5}
    assert d.note(9, 5, 0x55, 100) is True  # another copy of the same version
    assert d.note(9, 4, 0x44, 100) is False  # an older copy: stale, its holder drops it
    assert d.issue(9, 0x55, 100)[0].generation == 5  # the holder publishes the same bytes again
    # A key published before the agent holding an older copy came back: that copy is stale,
    # and its generation is never issued again for other bytes.
    assert d.issue(10, 0x1, 100)[0].generation == 1
    assert d.note(10, 3, 0x3, 100) is False
    assert d.issue(10, 0x2, 100)[0].generation == 4
    with pytest.raises(DirectoryError):
        d.note(10, 0, 0x3, 100)


def test_only_copies_of_the_current_generation_are_offered(d: Directory) -> None:
    d.register("h0", "10.0.0.1", "holder", {"dram": 10 * MiB})
    d.register("h2", "10.0.0.3", "holder", {"dram": 10 * MiB})
    d.publish("h0", [1], "dram", 100)  # before the directory issued anything: offered
    assert [h.node_id for h in d.holders(1)] == ["h0"]
    v1, _ = d.issue(1, 0x11, 100)
    d.publish("h0", [1], "dram", 100, generations={1: v1.generation})
    d.publish("h2", [1], "dram", 100, generations={1: v1.generation})
    assert [h.node_id for h in d.holders(1)] == ["h0", "h2"]
    v2, _ = d.issue(1, 0x22, 100)
    d.publish("h0", [1], "dram", 100, generations={1: v2.generation})
    assert [h.node_id for h in d.holders(1)] == ["h0"]  # h2 still holds generation 1
    d.withdraw("h2", [1])
    d.publish("h2", [1], "dram", 100)  # no generation said: not offered once one was issued
    assert [h.node_id for h in d.holders(1)] == ["h0"]
