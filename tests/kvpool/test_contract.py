"""kvpool.contract against the P4 program: P4Info names, constants.p4, header layout, p4/README.md.

One home per fact: the contract module is what the model, the controller and the tests
import, so this is where it is checked against what p4c compiled
(``p4/build/kvpool.p4info.txtpb``), what the sources say (``p4/include/*.p4``) and what the
documentation promises (the enum blocks of ``p4/README.md``).  Wire-format constants are
checked against :mod:`kvpool.wire`.
"""

from __future__ import annotations

import ast
import enum
import re
from pathlib import Path

import pytest

from kvpool import contract, wire
from kvpool.contract import CoalesceStat, DropReason, EgressStat, PoolStat, PoolState, PopularityStat
from kvpool.p4rt.p4info import P4Info, names_missing
from kvpool.wire import Flag, Opcode, Status

P4_DIR = contract.P4_DIR
INCLUDE = contract.INCLUDE_DIR

needs_p4info = pytest.mark.skipif(not contract.P4INFO_PATH.exists(),
                                  reason="p4/build/kvpool.p4info.txtpb not built yet (make -C p4)")

_CONST = re.compile(r"^\s*const\s+(?:bit<(\d+)>|(\w+))\s+(\w+)\s*=\s*(0x[0-9A-Fa-f]+|\d+)\s*;", re.M)
_DEFINE = re.compile(r"^\s*#define\s+(\w+)\s+(0x[0-9A-Fa-f]+|\d+)\s*$", re.M)
_TYPEDEF = re.compile(r"^\s*typedef\s+bit<(\d+)>\s+(\w+)\s*;", re.M)


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _p4_sources() -> str:
    return "\n".join(_strip_comments(p.read_text()) for p in sorted(INCLUDE.glob("*.p4")))


def _constants(text: str) -> dict[str, int]:
    """Every `const` and integer `#define` in ``text``, by name (names are unique)."""
    found: dict[str, int] = {}
    for _bits, _type, name, value in _CONST.findall(text):
        assert name not in found, f"{name} defined twice"
        found[name] = int(value, 0)
    for name, value in _DEFINE.findall(text):
        assert name not in found, f"{name} defined twice"
        found[name] = int(value, 0)
    return found


def _typedef_bits() -> dict[str, int]:
    return {name: int(bits) for bits, name in _TYPEDEF.findall(_p4_sources())}


def _header_fields(header: str) -> list[tuple[str, int]]:
    """(name, width) of each field of a P4 header type, typedefs resolved."""
    text = "\n".join(_strip_comments((INCLUDE / name).read_text()) for name in ("wire.p4", "headers.p4"))
    body = re.search(rf"header\s+{header}\s*\{{(.*?)\}}", text, re.S)
    assert body is not None, f"header {header} not found"
    widths = _typedef_bits()
    fields = []
    for type_name, name in re.findall(r"(bit<\w+>|\w+)\s+(\w+)\s*;", body.group(1)):
        if type_name.startswith("bit<"):
            arg = type_name[4:-1]
            bits = int(arg) if arg.isdigit() else C[arg]
        else:
            bits = widths[type_name]
        fields.append((name, bits))
    return fields


#: Every constant of p4/include/*.p4.
C = _constants(_p4_sources())
#: Only those of constants.p4 (the file the contract mirrors name for name).
CONSTANTS_P4 = _constants(_strip_comments((INCLUDE / "constants.p4").read_text()))

#: constants.p4 prefix -> the contract enum its index block is (prefix + member name = P4 name).
INDEX_BLOCKS: dict[str, type[enum.IntEnum]] = {
    "DROP_": DropReason,
    "POOL_STATE_": PoolState,
    "POOL_": PoolStat,
    "CO_": CoalesceStat,
    "POP_": PopularityStat,
    "EG_": EgressStat,
}
#: constants.p4 sizes of the labelled counters -> the counter whose size they are.
COUNTER_SIZE_NAMES = {
    "DROP_REASONS": contract.DROP_REASON,
    "POOL_STATS": contract.POOL_STATS,
    "COALESCE_STATS": contract.COALESCE_STATS,
    "POPULARITY_STATS": contract.POPULARITY_STATS,
    "EGRESS_STATS": contract.EGRESS_STATS,
}


def _enum_members(prefix: str) -> dict[str, int]:
    """The P4 constants of one index block, without the prefix (sizes and other blocks left out)."""
    longer = [p for p in INDEX_BLOCKS if p != prefix and p.startswith(prefix)]
    # Geometry constants share some prefixes (POOL_SLOTS): the contract has them as plain ints.
    plain = {n for n, v in vars(contract).items() if isinstance(v, int) and not isinstance(v, enum.Enum)}
    skip = set(COUNTER_SIZE_NAMES) | plain
    return {k[len(prefix):]: v for k, v in CONSTANTS_P4.items()
            if k.startswith(prefix) and k not in skip and not any(k.startswith(p) for p in longer)}


# ------------------------------------------------------------------------------- constants.p4


def test_every_constant_of_constants_p4_is_in_the_contract() -> None:
    """Same name, same value: a module constant, an enum member, or a counter size."""
    unmatched = {}
    for name, value in CONSTANTS_P4.items():
        got: int | None
        if name in COUNTER_SIZE_NAMES:
            got = contract.COUNTER_SIZES[COUNTER_SIZE_NAMES[name]]
        elif isinstance(getattr(contract, name, None), int):
            got = getattr(contract, name)
        else:
            prefix = max((p for p in INDEX_BLOCKS if name.startswith(p)), key=len, default=None)
            members = INDEX_BLOCKS[prefix].__members__ if prefix else {}
            member = members.get(name[len(prefix or ""):])
            got = int(member) if member is not None else None
        if got != value:
            unmatched[name] = (value, got)
    assert unmatched == {}, "constants.p4 value vs kvpool.contract value"


@pytest.mark.parametrize("prefix", sorted(INDEX_BLOCKS))
def test_index_blocks_are_the_contract_enums(prefix: str) -> None:
    labels = INDEX_BLOCKS[prefix]
    assert {m.name: int(m) for m in labels} == _enum_members(prefix)


def test_hash_salts_are_popularity_p4s() -> None:
    popularity = (INCLUDE / "popularity.p4").read_text()
    assert f"SKETCH_SALT = {contract.SKETCH_SALT:#X}".replace("0X", "0x") in popularity
    assert f"BLOOM_SALT  = {contract.BLOOM_SALT:#X}".replace("0X", "0x") in popularity
    assert (C["SKETCH_SALT"], C["BLOOM_SALT"]) == (contract.SKETCH_SALT, contract.BLOOM_SALT)


def test_port_version_and_geometry() -> None:
    assert C["KVPOOL_UDP_PORT"] == wire.KVPOOL_UDP_PORT
    assert C["KVPOOL_VERSION"] == wire.KVPOOL_VERSION
    assert C["KV_HEADER_BYTES"] == wire.HEADER_LEN
    assert C["SLICE_BYTES"] == wire.SLICE_BYTES
    assert C["SLICE_BITS"] == 8 * wire.SLICE_BYTES
    assert C["SLICES_PER_FRAGMENT"] == wire.SLICES_PER_FRAGMENT
    assert C["FRAG_PAYLOAD"] == wire.FRAG_PAYLOAD == C["SLICE_BYTES"] * C["SLICES_PER_FRAGMENT"]
    assert C["MAX_FRAG_INDEX"] == wire.MAX_FRAGMENTS
    assert C["KV_UDP_LEN_NO_PAYLOAD"] == wire.UDP_HEADER_LEN + wire.HEADER_LEN
    assert C["KV_UDP_LEN_DATA"] == wire.UDP_HEADER_LEN + wire.DATA_DATAGRAM_LEN
    assert C["KV_IPV4_LEN_DATA"] == wire.IPV4_HEADER_LEN + wire.UDP_HEADER_LEN + wire.DATA_DATAGRAM_LEN
    assert C["KV_IPV4_LEN_NO_PAYLOAD"] == wire.IPV4_HEADER_LEN + wire.UDP_HEADER_LEN + wire.HEADER_LEN


def test_geometry_and_values_match_constants_p4() -> None:
    names = ["POOL_SLOTS", "PENDING_SLOTS", "MAX_WAITERS", "SKETCH_COLS", "BLOOM_BITS", "COALESCE_MCAST_GRP",
             "SKETCH_COUNT_MAX", "KV_UDP_LEN_NO_PAYLOAD", "KV_UDP_LEN_DATA", "KV_IPV4_LEN_DATA",
             "KV_IPV4_LEN_NO_PAYLOAD", "SWITCH_REPLY_TTL", "MAX_FRAG_INDEX"]
    assert {name: getattr(contract, name) for name in names} == {name: C[name] for name in names}
    assert (int(PoolState.FILLING), int(PoolState.VALID), int(PoolState.UPSTREAM)) == (
        C["POOL_STATE_FILLING"], C["POOL_STATE_VALID"], C["POOL_STATE_UPSTREAM"])


def test_opcodes_flags_status() -> None:
    for op in Opcode:
        assert C[f"OP_{op.name}"] == op.value
    assert C["OP_MAX"] == max(Opcode)
    for flag in (Flag.SWITCH_SERVED, Flag.RETRANSMIT, Flag.COALESCED, Flag.NO_CACHE):
        assert C[f"FLAG_{flag.name}"] == flag.value
    assert C["KNOWN_FLAGS"] == wire.KNOWN_FLAGS
    assert C["STATUS_OK"] == Status.OK
    assert C["STATUS_MAX"] == max(Status)
    assert sorted(int(s) for s in Status) == list(range(C["STATUS_MAX"] + 1))


def test_kvpool_header_matches_wire_fields() -> None:
    fields = _header_fields("kvpool_t")
    assert fields == [(f.name, f.bits) for f in wire.FIELDS]
    assert sum(bits for _, bits in fields) == 8 * wire.HEADER_LEN


def test_payload_slices_cover_fragment() -> None:
    assert _header_fields("kvSlice_t") == [("v", 8 * wire.SLICE_BYTES)]
    headers = _strip_comments((INCLUDE / "headers.p4").read_text())
    assert re.search(r"kvSlice_t\[SLICES_PER_FRAGMENT\]\s+payload\s*;", headers)
    parser = _strip_comments((INCLUDE / "parser.p4").read_text())
    assert parser.count("packet.extract(hdr.payload.next);") == wire.SLICES_PER_FRAGMENT
    assert len(contract.SLICES) == wire.SLICES_PER_FRAGMENT


def test_pool_geometry_is_consistent() -> None:
    widths = _typedef_bits()
    assert widths["waiterMask_t"] == C["MAX_WAITERS"]
    assert widths["waiterId_t"] == 16  # standard_metadata.egress_rid
    assert C["PENDING_REPLIES"] == C["PENDING_SLOTS"] * C["MAX_WAITERS"]
    assert C["POOL_ENTRIES"] == C["POOL_SLOTS"] + 1  # a chunk per slot at most, plus the placement mark
    assert widths["slotTag_t"] == widths["placement_t"] + 16  # {placement, frag_index}
    assert widths["epochTag_t"] == widths["epoch_t"] + 1
    assert C["DEFAULT_SKETCH_EPOCH"] < 2 ** widths["epoch_t"]
    assert 2 ** widths["epoch_t"] - 1 == contract.EPOCH_MAX
    for name in ("POOL_SLOTS", "PENDING_SLOTS", "SKETCH_COLS", "BLOOM_BITS"):
        assert C[name] > 0


# ------------------------------------------------------------------------------- p4/README.md


def _readme_enum(name: str) -> dict[str, int]:
    """Members of `class <name>(enum.IntEnum)` in the python blocks of p4/README.md."""
    readme = (P4_DIR / "README.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", readme, re.S):
        for node in ast.parse(block).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                members = {}
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
                        target, value = stmt.targets[0], stmt.value.value
                        assert isinstance(target, ast.Name) and isinstance(value, int)
                        members[target.id] = value
                return members
    raise AssertionError(f"enum {name} not documented in p4/README.md")


@pytest.mark.parametrize(
    ("labels", "prefix", "size_name"),
    [
        (DropReason, "DROP_", "DROP_REASONS"),
        (PoolStat, "POOL_", "POOL_STATS"),
        (CoalesceStat, "CO_", "COALESCE_STATS"),
        (PopularityStat, "POP_", "POPULARITY_STATS"),
        (EgressStat, "EG_", "EGRESS_STATS"),
    ],
)
def test_readme_enums_match_p4_indices(labels: type[enum.IntEnum], prefix: str, size_name: str) -> None:
    skip = {"DROP_REASONS", "POOL_SLOTS", "POOL_ENTRIES", "POOL_STATS", "POOL_STATE_DISABLED",
            "POOL_STATE_FILLING", "POOL_STATE_VALID", "POOL_STATE_UPSTREAM", "POP_STATS", "POPULARITY_STATS"}
    in_p4 = {k[len(prefix):]: v for k, v in C.items() if k.startswith(prefix) and k not in skip}
    documented = _readme_enum(labels.__name__)
    assert documented == in_p4
    assert len(set(in_p4.values())) == len(in_p4)
    assert max(in_p4.values()) < C[size_name]
    # The operator's labels (controller stats) are the documented ones.
    assert {m.name: m.value for m in labels} == documented


def test_readme_pool_states_match() -> None:
    states = {k[len("POOL_STATE_"):]: v for k, v in C.items() if k.startswith("POOL_STATE_")}
    assert _readme_enum("PoolState") == states == {m.name: m.value for m in PoolState}


# ------------------------------------------------------------------------------- P4Info


@pytest.fixture(scope="module")
def p4info() -> P4Info:
    return P4Info.load(contract.P4INFO_PATH)


@needs_p4info
def test_every_name_exists(p4info: P4Info) -> None:
    assert names_missing(p4info, contract.all_names()) == []


@needs_p4info
def test_every_table_and_counter_is_named(p4info: P4Info) -> None:
    assert {t.name for t in p4info.tables} == set(contract.TABLE_KEYS)
    assert {c.name for c in p4info.counters} == set(contract.COUNTERS)
    assert {d.name for d in p4info.digests} == set(contract.DIGEST_MEMBERS)
    assert {r.name for r in p4info.registers} == set(contract.REGISTERS)


@needs_p4info
def test_keys_params_and_digest_members_match(p4info: P4Info) -> None:
    for table, keys in contract.TABLE_KEYS.items():
        assert tuple(p4info.match_field_names(table)) == keys, table
    for action, params in contract.ACTION_PARAMS.items():
        assert tuple(p.name for p in p4info.action(action).params) == params, action
    for digest, members in contract.DIGEST_MEMBERS.items():
        assert tuple(m for m, _ in p4info.digest(digest).members) == members, digest


@needs_p4info
def test_sizes_match_the_p4info(p4info: P4Info) -> None:
    assert {t.name: t.size for t in p4info.tables} == contract.TABLE_SIZES
    assert {c.name: c.size for c in p4info.counters} == contract.COUNTER_SIZES
    assert {r.name: (r.size, r.bitwidth) for r in p4info.registers} == contract.REGISTER_SHAPES


def test_build_paths() -> None:
    assert contract.P4INFO_PATH == contract.BUILD_DIR / contract.P4INFO_FILE
    assert contract.BMV2_JSON_PATH.parent == contract.P4C_VERSION_PATH.parent == contract.BUILD_DIR
    assert (contract.P4_DIR / "kvpool.p4").is_file() and contract.INCLUDE_DIR.is_dir()


def test_build_dir_honours_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(contract.BUILD_ENV, raising=False)
    assert contract.build_dir() == contract.BUILD_DIR
    monkeypatch.setenv(contract.BUILD_ENV, str(tmp_path))
    assert contract.build_dir() == tmp_path


def test_a_release_goes_to_the_group_of_its_highest_waiter() -> None:
    assert [contract.coalesce_group(m) for m in (1, 2, 3, 0b100, 0b111, 1 << 31, (1 << 32) - 1)] == [
        contract.COALESCE_MCAST_GRP + t for t in (0, 1, 1, 2, 2, 31, 31)]
    for bad in (0, 1 << 32, -1):
        with pytest.raises(ValueError, match="waiter bitmap"):
            contract.coalesce_group(bad)


def test_pending_table_outsizes_the_demos_single_gets_in_flight() -> None:
    """A GET whose pending slot another fragment holds is not coalesced: with every requester's
    budget in flight the table stays under a tenth full (at 16,384 slots replayed agent traffic
    at 3x the holder link had 17% of multicast's GETs collide, p4/README.md)."""
    from bmv2_topologies.experiment.config import TARGET_KNOBS, DemoConfig

    in_flight = max(k.in_flight for k in TARGET_KNOBS.values()) * DemoConfig.requesters
    assert in_flight / C["PENDING_SLOTS"] <= 0.1, (in_flight, C["PENDING_SLOTS"])
