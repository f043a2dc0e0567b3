"""P4 constants and the kvpool header layout agree with kvpool.wire and with p4/README.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kvpool import wire
from kvpool.wire import Flag, Opcode, Status

P4_DIR = Path(__file__).resolve().parents[1] / "p4"
INCLUDE = P4_DIR / "include"

_CONST = re.compile(r"^\s*const\s+(?:bit<(\d+)>|(\w+))\s+(\w+)\s*=\s*(0x[0-9A-Fa-f]+|\d+)\s*;", re.M)
_DEFINE = re.compile(r"^\s*#define\s+(\w+)\s+(0x[0-9A-Fa-f]+|\d+)\s*$", re.M)
_TYPEDEF = re.compile(r"^\s*typedef\s+bit<(\d+)>\s+(\w+)\s*;", re.M)


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _p4_sources() -> str:
    return "\n".join(_strip_comments(p.read_text()) for p in sorted(INCLUDE.glob("*.p4")))


def _constants() -> dict[str, int]:
    """Every `const` and integer `#define` in p4/include, by name (names are unique)."""
    found: dict[str, int] = {}
    text = _p4_sources()
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
    text = _strip_comments((INCLUDE / "headers.p4").read_text())
    body = re.search(rf"header\s+{header}\s*\{{(.*?)\}}", text, re.S)
    assert body is not None, f"header {header} not found"
    widths = _typedef_bits()
    consts = _constants()
    fields = []
    for type_name, name in re.findall(r"(bit<\w+>|\w+)\s+(\w+)\s*;", body.group(1)):
        if type_name.startswith("bit<"):
            arg = type_name[4:-1]
            bits = int(arg) if arg.isdigit() else consts[arg]
        else:
            bits = widths[type_name]
        fields.append((name, bits))
    return fields


C = _constants()


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


def test_pool_geometry_is_consistent() -> None:
    widths = _typedef_bits()
    assert widths["waiterMask_t"] == C["MAX_WAITERS"]
    assert widths["waiterId_t"] == 16  # standard_metadata.egress_rid
    assert C["PENDING_REPLIES"] == C["PENDING_SLOTS"] * C["MAX_WAITERS"]
    assert C["POOL_ENTRIES"] <= C["POOL_SLOTS"]
    assert widths["epochTag_t"] == widths["epoch_t"] + 1
    assert C["DEFAULT_SKETCH_EPOCH"] < 2 ** widths["epoch_t"]
    for name in ("POOL_SLOTS", "PENDING_SLOTS", "SKETCH_COLS", "BLOOM_BITS"):
        assert C[name] > 0


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
    ("enum_name", "prefix", "size_name"),
    [
        ("DropReason", "DROP_", "DROP_REASONS"),
        ("PoolStat", "POOL_", "POOL_STATS"),
        ("CoalesceStat", "CO_", "COALESCE_STATS"),
        ("PopularityStat", "POP_", "POPULARITY_STATS"),
        ("EgressStat", "EG_", "EGRESS_STATS"),
    ],
)
def test_readme_enums_match_p4_indices(enum_name: str, prefix: str, size_name: str) -> None:
    skip = {"DROP_REASONS", "POOL_SLOTS", "POOL_ENTRIES", "POOL_STATS", "POOL_STATE_DISABLED",
            "POOL_STATE_FILLING", "POOL_STATE_VALID", "POP_STATS", "POPULARITY_STATS"}
    in_p4 = {k[len(prefix):]: v for k, v in C.items() if k.startswith(prefix) and k not in skip}
    documented = _readme_enum(enum_name)
    assert documented == in_p4
    assert len(set(in_p4.values())) == len(in_p4)
    assert max(in_p4.values()) < C[size_name]


def test_readme_pool_states_match() -> None:
    states = {k[len("POOL_STATE_"):]: v for k, v in C.items() if k.startswith("POOL_STATE_")}
    assert _readme_enum("PoolState") == states
