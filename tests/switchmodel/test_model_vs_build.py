"""The switch model against the compiled program (p4/build/kvpool.json): hashes, header layouts, geometry.

A change to the P4 program recompiles ``p4/build/``; a change to only the model does not.
This test reads what p4c compiled and fails when the model's twin has drifted from it:

* every ``hash`` of the program (its ``calculations``: algorithm and input fields, the
  constants p4c copied into temporaries resolved from the action's ``assign`` primitives,
  the base and modulus of ``modify_field_with_hash_based_offset``) is recomputed here with
  :func:`switchmodel.hashes.v1model_hash` and compared with the model's own index function
  on random headers, and then with the register cells the model's pipeline actually writes
  for real packets;
* the IPv4 checksum (its field list in ``checksums``) against the model's ``ipv4_csum16``;
* the header layouts the model packs (``ipv4_t``, ``kvpool_t``, the payload stack);
* register sizes and widths, counter sizes and table sizes against :mod:`kvpool.contract`,
  which the model's hard-coded geometry comes from.

Changing, say, the pending-slot hash in ``switchmodel/coalesce.py`` alone fails here.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from kvpool import contract, wire
from kvpool.p4rt.codec import ActionCall, FieldMatch, TableEntry
from kvpool.p4rt.p4info import P4Info
from switchmodel import coalesce, hashes, pool, popularity
from switchmodel.checksum import ipv4_csum16
from switchmodel.parser import Ipv4, Kv
from switchmodel.pipeline import KvpoolPipeline
from switchmodel.state import SwitchState

pytestmark = pytest.mark.skipif(not (contract.BMV2_JSON_PATH.exists() and contract.P4INFO_PATH.exists()),
                                reason="p4/build/ is not built (make -C p4)")

#: Each hash of the program (by the field p4c stores its result in) -> the model's function for it.
MODEL_HASHES: dict[str, Callable[[Kv], int]] = {
    "metadata_t.pending_idx": coalesce.pending_index,
    "popularity_i0": lambda kv: popularity.sketch_indices(kv)[0],
    "popularity_i1": lambda kv: popularity.sketch_indices(kv)[1],
    "popularity_i2": lambda kv: popularity.sketch_indices(kv)[2],
    "popularity_b0": lambda kv: popularity.bloom_indices(kv)[0],
    "popularity_b1": lambda kv: popularity.bloom_indices(kv)[1],
    "pool_mismatch_cell": pool.mismatch_index,
}

#: ipv4_t field (as p4c names it) -> the model's Ipv4 attribute.
IPV4_FIELDS = {"version": "version", "ihl": "ihl", "diffserv": "diffserv", "totalLen": "total_len",
               "identification": "identification", "flags": "flags", "fragOffset": "frag_offset", "ttl": "ttl",
               "protocol": "protocol", "hdrChecksum": "checksum", "srcAddr": "src", "dstAddr": "dst"}


@dataclass(frozen=True)
class HashSpec:
    """One ``hash(dest, algo, base, {inputs}, max)`` of the compiled program."""

    dest: str
    dest_bits: int
    algo: str
    base: int
    max: int
    inputs: tuple[tuple[tuple[str, str] | int, int], ...]
    """(header field or constant, width) in input order."""
    registers: tuple[str, ...]
    """Register arrays the program indexes with ``dest`` directly."""

    def expected(self, kv: Kv) -> int:
        """What BMv2 computes for a packet whose kvpool header is ``kv``."""
        fields = []
        for source, bits in self.inputs:
            if isinstance(source, int):
                fields.append((source, bits))
            else:
                header, name = source
                assert header == "kv", f"hash {self.dest} reads {header}.{name}: teach this test that header"
                fields.append((getattr(kv, name), bits))
        return hashes.v1model_hash(self.algo, self.base, fields, self.max, self.dest_bits)


@pytest.fixture(scope="module")
def build() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(contract.BMV2_JSON_PATH.read_text())
    return doc


def _widths(build: dict[str, Any]) -> dict[tuple[str, str], int]:
    """(header instance, field) -> bits, for every header instance of the program."""
    types = {t["name"]: {f[0]: f[1] for f in t["fields"]} for t in build["header_types"]}
    return {(h["name"], field): bits for h in build["headers"] for field, bits in types[h["header_type"]].items()}


def _hash_specs(build: dict[str, Any]) -> dict[str, HashSpec]:
    widths = _widths(build)
    calcs = {c["name"]: c for c in build["calculations"]}
    indexed: dict[str, set[str]] = {}
    for action in build["actions"]:
        for prim in action["primitives"]:
            if prim["op"] in ("register_read", "register_write"):
                reg = next(p["value"] for p in prim["parameters"] if p["type"] == "register_array")
                index = prim["parameters"][2 if prim["op"] == "register_read" else 1]
                if index["type"] == "field":
                    indexed.setdefault(index["value"][1], set()).add(reg)
    specs: dict[str, HashSpec] = {}
    for action in build["actions"]:
        prims = action["primitives"]
        for i, prim in enumerate(prims):
            if prim["op"] != "modify_field_with_hash_based_offset":
                continue
            dest, base, calc, modulus = prim["parameters"]
            inputs: list[tuple[tuple[str, str] | int, int]] = []
            for item in calcs[calc["value"]]["input"]:
                assert item["type"] == "field", f"{calc['value']}: input {item} not a field"
                field = tuple(item["value"])
                # p4c copies header fields and constants into temporaries just before the hash.
                source: tuple[str, str] | int = (field[0], field[1])
                for earlier in reversed(prims[:i]):
                    if earlier["op"] == "assign" and earlier["parameters"][0]["value"] == list(field):
                        src = earlier["parameters"][1]
                        source = int(src["value"], 16) if src["type"] == "hexstr" else (src["value"][0],
                                                                                         src["value"][1])
                        break
                inputs.append((source, widths[(field[0], field[1])]))
            name = dest["value"][1]
            specs[name] = HashSpec(name, widths[(dest["value"][0], name)], calcs[calc["value"]]["algo"],
                                   int(base["value"], 16), int(modulus["value"], 16), tuple(inputs),
                                   tuple(sorted(indexed.get(name, ()))))
    return specs


def _random_kv(rng: random.Random) -> Kv:
    return Kv(*(rng.getrandbits(f.bits) for f in wire.FIELDS))


# ------------------------------------------------------------------------------- hashes


def test_every_hash_of_the_program_has_a_model_twin(build: dict[str, Any]) -> None:
    assert set(_hash_specs(build)) == set(MODEL_HASHES)


def test_model_hash_functions_compute_what_the_build_computes(build: dict[str, Any]) -> None:
    rng = random.Random(11)
    samples = [_random_kv(rng) for _ in range(300)]
    samples += [Kv(2, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0), Kv(2, 1, 0, (1 << 64) - 1, 0xFFFF, 1, 0, 0, 0, 0, 0, 0)]
    for name, spec in _hash_specs(build).items():
        model = MODEL_HASHES[name]
        wrong = [(hex(kv.chunk_key), kv.frag_index) for kv in samples if model(kv) != spec.expected(kv)]
        assert wrong == [], (f"{name}: the model's index differs from {spec.algo}({spec.inputs}) % {spec.max} "
                             f"for (chunk_key, frag_index) in {wrong[:3]}")


def test_hash_constants_and_moduli_are_the_contract_and_register_sizes(build: dict[str, Any]) -> None:
    specs = _hash_specs(build)
    shapes = {r["name"]: r["size"] for r in build["register_arrays"]}
    for spec in specs.values():
        assert spec.registers, f"{spec.dest} indexes no register directly"
        assert {shapes[r] for r in spec.registers} == {spec.max}, spec.dest
    constants = {src for spec in specs.values() for src, _ in spec.inputs if isinstance(src, int)}
    assert constants == {contract.SKETCH_SALT, contract.BLOOM_SALT}
    assert specs["metadata_t.pending_idx"].max == contract.PENDING_SLOTS
    assert {specs[f"popularity_i{i}"].max for i in range(3)} == {contract.SKETCH_COLS}
    assert {specs[f"popularity_b{i}"].max for i in range(2)} == {contract.BLOOM_BITS}


def _get_frame(key: int, frag: int, generation: int = 0, count: int = 1) -> bytes:
    return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.0.0.1", dst="10.0.0.2")
                 / UDP(sport=40000, dport=wire.KVPOOL_UDP_PORT)
                 / Raw(wire.get_packet(key, frag, count, generation=generation)))


def _data_frame(key: int, generation: int) -> bytes:
    """The holder (10.0.0.2, port 2) answering 10.0.0.1 with a one-fragment chunk of 100 bytes."""
    return bytes(Ether(src="02:00:00:00:00:02", dst="02:00:00:00:00:01") / IP(src="10.0.0.2", dst="10.0.0.1")
                 / UDP(sport=wire.KVPOOL_UDP_PORT, dport=40000)
                 / Raw(wire.data_packet(key, 0, bytes(100), generation=generation)))


def _programmed_model() -> tuple[SwitchState, KvpoolPipeline]:
    """The model with routes, a waiter id for the requester, a writer and a hot threshold of 1."""
    state = SwitchState()
    state.set_pipeline(P4Info.load(contract.P4INFO_PATH), contract.BMV2_JSON_PATH.read_bytes())
    for port, ip in ((1, 0x0A000001), (2, 0x0A000002)):
        state.insert_entry(contract.IPV4_ROUTE, TableEntry({contract.KEY_IPV4_DST: FieldMatch("lpm", ip, 32)},
                                                           ActionCall(contract.IPV4_FORWARD,
                                                                      {"port": port, "dst_mac": port})))
    state.insert_entry(contract.WAITER_LOOKUP, TableEntry({contract.KEY_WAITER_ADDR: FieldMatch("exact", 0x0A000001)},
                                                          ActionCall(contract.SET_WAITER_ID, {"waiter_id": 0})))
    state.set_default_action(contract.POPULARITY_CONFIG, contract.SET_POPULARITY, {"threshold": 1, "epoch": 3})
    state.insert_entry(contract.WRITERS, TableEntry({contract.KEY_INGRESS_PORT: FieldMatch("exact", 2),
                                                     contract.KEY_WRITER_SRC: FieldMatch("exact", 0x0A000002)},
                                                    ActionCall(contract.ALLOW_WRITER, {})))
    return state, KvpoolPipeline(state, clock_us=lambda: 1000)


@pytest.mark.parametrize("seed", range(4))
def test_the_pipeline_writes_the_cells_the_build_indexes(build: dict[str, Any], seed: int) -> None:
    """Real GETs through the model: each hashed register changes exactly at the build's indices."""
    rng = random.Random(seed)
    first = Kv(2, 1, 0, rng.getrandbits(64) | 1, 0, 1, 0, 0, 0, 0, 0, 0)  # fragment 0: counted and coalesced
    second = Kv(2, 1, 0, rng.getrandbits(64) | 1, rng.randrange(1, 1 << 16), 1, 0, 0, 0, 0, 0, 0)  # coalesced only
    # A writer's DATA for an admitted chunk at another generation: reported, in its mismatch cell.
    third = Kv(2, 2, 0, rng.getrandbits(64) | 1, 0, 1, 0, 0, 100, 0, 100, 0)
    state, pipe = _programmed_model()
    state.insert_entry(contract.POOL_LOOKUP, TableEntry(
        {contract.KEY_CHUNK_KEY: FieldMatch("exact", third.chunk_key)},
        ActionCall(contract.POOL_ENTRY, {"base_slot": 0, "frag_count": 1, "chunk_len": 100, "generation": 5,
                                         "state": 1, "placement": 9})))
    for kv in (first, second):
        # Range GETs (the ones a switch coalesces), pinned to a generation, so every pending cell
        # they write is non-zero ({owner, generation}).
        assert [port for port, _ in pipe.process(1, _get_frame(kv.chunk_key, kv.frag_index, 7, count=2))] == [2]
    assert [port for port, _ in pipe.process(2, _data_frame(third.chunk_key, 0))] == [1]
    for spec in _hash_specs(build).values():
        packets = {"metadata_t.pending_idx": (first, second), "pool_mismatch_cell": (third,)}.get(spec.dest, (first,))
        want = {spec.expected(kv) for kv in packets}
        for reg in spec.registers:
            written = {i for i in range(state.register_size(reg)) if state.register_read(reg, i)}
            assert written == want, f"{reg} (indexed by {spec.dest}): model wrote {written}, the build says {want}"


# ------------------------------------------------------------------------------- checksum and headers


def _header_fields(build: dict[str, Any], header_type: str) -> list[tuple[str, int]]:
    return next([(f[0], f[1]) for f in t["fields"]] for t in build["header_types"] if t["name"] == header_type)


def _random_ipv4(rng: random.Random, fields: list[tuple[str, int]]) -> Ipv4:
    values = {IPV4_FIELDS[name]: rng.getrandbits(bits) for name, bits in fields}
    return Ipv4(**values)


def test_ipv4_checksum_is_the_builds(build: dict[str, Any]) -> None:
    calcs = {c["name"]: c for c in build["calculations"]}
    widths = dict(_header_fields(build, "ipv4_t"))
    rng = random.Random(5)
    assert {(c["verify"], c["update"]) for c in build["checksums"]} == {(True, False), (False, True)}
    for checksum in build["checksums"]:
        assert checksum["target"] == ["ipv4", "hdrChecksum"]
        calc = calcs[checksum["calculation"]]
        assert calc["algo"] == "csum16"
        names = [item["value"][1] for item in calc["input"]]
        for _ in range(200):
            ip = _random_ipv4(rng, list(widths.items()))
            data = hashes.pack_fields([(getattr(ip, IPV4_FIELDS[n]), widths[n]) for n in names])
            assert ipv4_csum16(ip) == hashes.csum16(data), names


def test_header_layouts_are_the_builds(build: dict[str, Any]) -> None:
    rng = random.Random(3)
    ipv4 = _header_fields(build, "ipv4_t")
    kv_fields = _header_fields(build, "kvpool_t")
    assert kv_fields == [(f.name, f.bits) for f in wire.FIELDS]
    for _ in range(50):
        ip = _random_ipv4(rng, ipv4)
        assert ip.pack() == hashes.pack_fields([(getattr(ip, IPV4_FIELDS[n]), b) for n, b in ipv4])
        kv = _random_kv(rng)
        assert kv.pack() == hashes.pack_fields([(getattr(kv, n), b) for n, b in kv_fields])
    (stack,) = build["header_stacks"]
    assert (stack["name"], stack["size"]) == ("payload", contract.SLICES_PER_FRAGMENT)
    assert _header_fields(build, stack["header_type"]) == [("v", contract.SLICE_BITS)]


# ------------------------------------------------------------------------------- geometry


def test_register_counter_and_table_sizes_are_the_contracts(build: dict[str, Any]) -> None:
    assert {r["name"]: (r["size"], r["bitwidth"]) for r in build["register_arrays"]} == contract.REGISTER_SHAPES
    assert {c["name"]: c["size"] for c in build["counter_arrays"] if not c["is_direct"]} == contract.COUNTER_SIZES
    tables = {t["name"]: t["max_size"] for p in build["pipelines"] for t in p["tables"]}
    assert {name: tables[name] for name in contract.TABLE_SIZES} == contract.TABLE_SIZES
    learn = {entry["name"]: len(entry["elements"]) for entry in build["learn_lists"]}
    assert learn == {d: len(m) for d, m in contract.DIGEST_MEMBERS.items()}
