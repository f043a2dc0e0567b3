"""The TNA program (p4/tna/) against the shared contract, and what bf-p4c made of it.

Three tiers, each skipping with its reason:

* sources (always; the C preprocessor expands the macros): the geometry is the contract's,
  the wire format comes from the shared includes only, and every table, key, action,
  parameter, counter, digest and register the controller names is declared where its
  P4Info name says;
* committed bf-p4c output (``p4/tna/build/``, written by ``make -C p4 tna``): the P4Info
  has the contract's names, keys, parameters and sizes, and the resource summary fits one
  Tofino 1 pipe and was compiled from the current sources;
* bf-p4c itself (on PATH or named by ``KVPOOL_BF_P4C``): a fresh compile gives the
  committed P4Info.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvpool import contract, wire
from kvpool.p4rt.p4info import P4Info, names_missing
from tests.paths import SCRIPTS

#: scripts/tna_resources.py, loaded as the other script tests load theirs (scripts/ is no package).
TNA_RESOURCES: dict[str, Any] = runpy.run_path(str(SCRIPTS / "tna_resources.py"))
sources_digest = TNA_RESOURCES["sources_digest"]

TNA = contract.TNA_DIR
INCLUDE = contract.INCLUDE_DIR
CPP = shutil.which("cpp")
BF_P4C = os.environ.get("KVPOOL_BF_P4C") or shutil.which("bf-p4c")

needs_cpp = pytest.mark.skipif(CPP is None, reason="no C preprocessor (cpp) to expand the P4 macros")
needs_p4info = pytest.mark.skipif(
    not contract.TNA_P4INFO_PATH.exists(),
    reason="p4/tna/build/kvpool_tna.p4info.txtpb not built yet (make -C p4 tna, needs bf-p4c)")
needs_resources = pytest.mark.skipif(
    not contract.TNA_RESOURCES_PATH.exists(),
    reason="p4/tna/build/resources.json not built yet (make -C p4 tna, needs bf-p4c)")

_DEFINE = re.compile(r"^\s*#define\s+(\w+)\s+(\d+)\s*$", re.M)
_CONST = re.compile(r"^\s*const\s+bit<\d+>\s+(\w+)\s*=\s*([^;]+);", re.M)
WIRE_HEADERS = ("ethernet_t", "arp_t", "ipv4_t", "udp_t", "kvpool_t")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _defines(text: str) -> dict[str, int]:
    return {name: int(value) for name, value in _DEFINE.findall(_strip_comments(text))}


def _geometry_block() -> str:
    """The overridable geometry block of the shared constants.p4 (BMv2's values)."""
    text = (INCLUDE / "constants.p4").read_text()
    found = re.search(r"#ifndef KVPOOL_GEOMETRY\n(.*?)#endif  // KVPOOL_GEOMETRY", text, re.S)
    assert found is not None, "constants.p4 has no KVPOOL_GEOMETRY block"
    return found.group(1)


# ------------------------------------------------------------------------------- geometry


def test_geometry_is_the_contracts() -> None:
    geometry = (TNA / "geometry.p4").read_text()
    defines = _defines(geometry)
    assert {name: defines[name] for name in ("POOL_SLOTS", "POOL_ENTRIES", "PENDING_SLOTS", "MAX_WAITERS",
                                           "PENDING_REPLIES", "SERVED_WORDS")} == {
        "POOL_SLOTS": contract.TNA_POOL_SLOTS, "POOL_ENTRIES": contract.TNA_POOL_ENTRIES,
        "PENDING_SLOTS": contract.TNA_PENDING_SLOTS, "MAX_WAITERS": contract.TNA_MAX_WAITERS,
        "PENDING_REPLIES": contract.TNA_PENDING_REPLIES, "SERVED_WORDS": contract.TNA_SERVED_WORDS,
    }
    assert defines["PENDING_REPLIES"] == defines["PENDING_SLOTS"] * defines["MAX_WAITERS"]
    assert defines["POOL_ENTRIES"] == defines["POOL_SLOTS"] + 1
    assert "SERVED_BYTES = 4 * SERVED_WORDS;" in geometry
    assert 4 * defines["SERVED_WORDS"] == contract.TNA_SERVED_BYTES
    # The index arithmetic of coalesce.p4 takes crc[10:0] and a 5-bit waiter id.
    assert defines["PENDING_SLOTS"] == 2 ** 11 and defines["MAX_WAITERS"] == 2 ** 5
    # mod SKETCH_COLS / BLOOM_BITS are the low 12 bits in popularity.p4.
    assert defines["SKETCH_COLS"] == defines["BLOOM_BITS"] == 2 ** 12
    # Sizes the TNA program keeps are BMv2's, so the controller's tables fit either.
    shared = ("MISMATCH_CELLS", "SKETCH_COLS", "BLOOM_BITS", "ROUTE_ENTRIES", "ARP_ENTRIES",
              "WRITER_ENTRIES", "GUARD_ENTRIES")
    assert {n: defines[n] for n in shared} == {n: getattr(contract, n) for n in shared}


def test_geometry_replaces_the_whole_bmv2_block() -> None:
    """Every name of the overridable block of constants.p4 is defined by geometry.p4 too."""
    block = _geometry_block()
    bmv2 = set(_defines(block)) | {name for name, _ in _CONST.findall(_strip_comments(block))}
    geometry = (TNA / "geometry.p4").read_text()
    tna = set(_defines(geometry)) | {name for name, _ in _CONST.findall(_strip_comments(geometry))}
    assert bmv2 - tna == set()
    assert "#define KVPOOL_GEOMETRY" in geometry


def test_the_wire_format_has_one_home() -> None:
    """The TNA program includes the shared wire headers and constants and declares none of them."""
    sources = {p.name: _strip_comments(p.read_text()) for p in TNA.glob("*.p4")}
    for name, text in sources.items():
        for header in WIRE_HEADERS:
            assert not re.search(rf"\bheader\s+{header}\b", text), f"{name} declares {header}"
        for digest in contract.DIGEST_MEMBERS:
            assert not re.search(rf"\bstruct\s+{digest}\b", text), f"{name} declares {digest}"
    assert '#include "../include/wire.p4"' in sources["headers.p4"]
    main = sources["kvpool_tna.p4"]
    assert main.index('#include "geometry.p4"') < main.index('#include "../include/constants.p4"')
    shared = set(_defines((INCLUDE / "constants.p4").read_text())) | {
        n for n, _ in _CONST.findall(_strip_comments((INCLUDE / "constants.p4").read_text()))}
    overridable = set(_defines(_geometry_block())) | {n for n, _ in _CONST.findall(_geometry_block())}
    for name, text in sources.items():
        again = (set(_defines(text)) | {n for n, _ in _CONST.findall(text)}) & (shared - overridable)
        assert again == set(), f"{name} defines shared constants again"


def test_the_product_tables_are_generated_from_the_fragment_size() -> None:
    """p4/tna/products.p4 is what scripts/tna_products.py writes (python -m scripts.tna_products)."""
    products_p4 = runpy.run_path(str(SCRIPTS / "tna_products.py"))["products_p4"]
    text = products_p4()
    assert (TNA / "products.p4").read_text() == text, "regenerate: python -m scripts.tna_products > p4/tna/products.p4"
    assert f"1 : idx_lo_times_set(32w{wire.FRAG_PAYLOAD});" in text
    assert f"255 : idx_hi_times_set(32w{255 * 256 * wire.FRAG_PAYLOAD});" in text


# ------------------------------------------------------------------------------- declarations


def _preprocessed(tmp: Path) -> str:
    """kvpool_tna.p4 after cpp, with the architecture's includes stubbed out."""
    stubs = tmp / "stubs"
    stubs.mkdir()
    (stubs / "core.p4").write_text("")
    (stubs / "tna.p4").write_text("")
    assert CPP is not None
    done = subprocess.run([CPP, "-P", "-undef", "-nostdinc", "-I", str(stubs), str(contract.TNA_MAIN)],
                          capture_output=True, text=True, check=True)
    return _strip_comments(done.stdout)


def _block(text: str, start: int) -> str:
    """The text between the brace at or after ``start`` and its match."""
    open_at = text.index("{", start)
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1:i]
    raise AssertionError("unbalanced braces")


def _controls(text: str) -> dict[str, str]:
    return {m.group(1): _block(text, m.end()) for m in re.finditer(r"\bcontrol\s+(\w+)\s*\(", text)}


def _resolve(controls: dict[str, str], name: str) -> tuple[str, str]:
    """(bodies of the controls that may declare it, leaf name) for a P4Info name ``Ctl.inst.leaf``.

    An instance answers to its own name or to an ``@name("inst")`` on it; several can share a
    name (the TNA ingress names its pool lookup "pool" beside the pool), so every one of them
    is searched.
    """
    parts = name.split(".")
    bodies = [controls[parts[0]]]
    for instance in parts[1:-1]:
        pattern = rf'(?:@name\("{instance}"\)\s*(\w+)\s*\(\s*\)\s*\w+|\b(\w+)\s*\(\s*\)\s*{instance})\s*;'
        types = [m.group(1) or m.group(2) for body in bodies for m in re.finditer(pattern, body)]
        assert types, f"{name}: no instance {instance}"
        bodies = [controls[t] for t in types]
    return "\n".join(bodies), parts[-1]


@pytest.fixture(scope="module")
def controls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _controls(_preprocessed(tmp_path_factory.mktemp("tna")))


@needs_cpp
def test_every_table_has_the_contracts_keys(controls: dict[str, str]) -> None:
    for table, keys in contract.TABLE_KEYS.items():
        body, leaf = _resolve(controls, table)
        found = re.search(rf"\btable\s+{leaf}\s*\{{", body)
        assert found is not None, f"{table} is not declared"
        decl = _block(body, found.start())
        key = re.search(r"\bkey\s*=\s*\{(.*?)\}", decl, re.S)
        declared = tuple(k.split(":")[0].strip() for k in key.group(1).split(";") if k.strip()) if key else ()
        assert declared == keys, table
        assert "size = " in decl, f"{table} states no size"


@needs_cpp
def test_every_action_has_the_contracts_parameters(controls: dict[str, str]) -> None:
    for action, params in contract.ACTION_PARAMS.items():
        if action == contract.NO_ACTION:
            continue
        body, leaf = _resolve(controls, action)
        found = re.search(rf"\baction\s+{leaf}\s*\(([^)]*)\)", body)
        assert found is not None, f"{action} is not declared"
        declared = tuple(p.split()[-1] for p in found.group(1).split(",") if p.strip())
        assert declared == params, action


@needs_cpp
def test_every_counter_and_register_is_declared(controls: dict[str, str]) -> None:
    for counter in contract.COUNTERS:
        body, leaf = _resolve(controls, counter)
        assert re.search(rf"\bCounter<[^;]*\)\s*{leaf}\s*;", body), f"{counter} is not declared"
    for register in contract.TNA_REGISTER_SHAPES:
        body, leaf = _resolve(controls, register)
        assert re.search(rf"\bRegister<[^;]*\)\s*{leaf}\s*;", body), f"{register} is not declared"


@needs_cpp
def test_digests_keep_their_v1model_names(tmp_path: Path) -> None:
    text = _preprocessed(tmp_path)
    for digest in contract.DIGEST_MEMBERS:
        assert re.search(rf'@name\("\.{digest}"\)\s*Digest<{digest}>', text), digest


# ------------------------------------------------------------------------------- P4Info


@pytest.fixture(scope="module")
def p4info() -> P4Info:
    return P4Info.load(contract.TNA_P4INFO_PATH)


def _short(name: str) -> str:
    prefix = contract.TNA_PIPE + "."
    return name[len(prefix):] if name.startswith(prefix) else name


@needs_p4info
def test_p4info_has_every_contract_name(p4info: P4Info) -> None:
    assert names_missing(p4info, contract.tna_names()) == []
    assert p4info.pipe_prefix in ("", contract.TNA_PIPE + ".")


@needs_p4info
def test_p4info_has_nothing_else(p4info: P4Info) -> None:
    assert {_short(t.name) for t in p4info.tables} == set(contract.TABLE_KEYS)
    assert {_short(c.name) for c in p4info.counters} == set(contract.COUNTERS)
    assert {_short(d.name) for d in p4info.digests} == set(contract.DIGEST_MEMBERS)
    assert {_short(r.name) for r in p4info.registers} == set(contract.TNA_REGISTER_SHAPES)


@needs_p4info
def test_p4info_keys_params_digests_and_sizes(p4info: P4Info) -> None:
    for table, keys in contract.TABLE_KEYS.items():
        assert tuple(p4info.match_field_names(table)) == keys, table
        assert p4info.table(table).size >= contract.TNA_TABLE_SIZES[table], table
    for action, params in contract.ACTION_PARAMS.items():
        assert tuple(p.name for p in p4info.action(action).params) == params, action
    for digest, members in contract.DIGEST_MEMBERS.items():
        assert tuple(m for m, _ in p4info.digest(digest).members) == members, digest
    assert {_short(c.name): c.size for c in p4info.counters} == contract.TNA_COUNTER_SIZES
    assert {_short(r.name): (r.size, r.bitwidth) for r in p4info.registers} == contract.TNA_REGISTER_SHAPES


# ------------------------------------------------------------------------------- resources


@pytest.fixture(scope="module")
def resources() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(contract.TNA_RESOURCES_PATH.read_text())
    return data


@needs_resources
def test_it_fits_one_tofino1_pipe(resources: dict[str, Any]) -> None:
    assert resources["target"] == "tofino"
    assert resources["stages_available"] == contract.TNA_STAGES
    assert 0 < resources["stages_used"] <= contract.TNA_STAGES
    for stage in resources["stages"]:
        for unit, use in stage.items():
            if unit != "stage":
                assert use["used"] <= use["available"], (stage["stage"], unit)
    for kind, use in resources.get("phv_containers", {}).items():
        assert use["used"] <= use["available"], kind
    # The pool's words and the rest of the stateful state: 48 stateful ALUs in a pipe.
    assert resources["totals"]["stateful_alus"] >= contract.TNA_SERVED_WORDS
    # The assembler (which the bf-p4c driver runs, or make's BFAS) accepted it: it checks the
    # stage count and every unit against the chip.
    assert resources["assembled"] is True


@needs_resources
def test_the_summary_is_of_the_current_sources(resources: dict[str, Any]) -> None:
    assert resources["sources_sha256"] == sources_digest(contract.tna_sources()), (
        "p4/tna changed since p4/tna/build was compiled: make -C p4 tna")


# ------------------------------------------------------------------------------- bf-p4c


@pytest.mark.slow
@pytest.mark.skipif(BF_P4C is None, reason="bf-p4c not on PATH and KVPOOL_BF_P4C not set")
@needs_p4info
def test_a_fresh_compile_gives_the_committed_p4info(tmp_path: Path) -> None:
    assert BF_P4C is not None
    p4info = tmp_path / "kvpool_tna.p4info.txtpb"
    done = subprocess.run(
        [BF_P4C, "--target", "tofino", "--arch", "tna", "--std", "p4-16", "-o", str(tmp_path / "out"),
         "--p4runtime-files", str(p4info), "--p4runtime-force-std-externs", str(contract.TNA_MAIN)],
        capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert p4info.read_text() == contract.TNA_P4INFO_PATH.read_text()


def test_summaries_count_units_per_stage() -> None:
    """scripts/tna_resources.py on a two-stage resources.json of bf-p4c's schema."""
    summarise = TNA_RESOURCES["summarise"]

    def stage(n: int, srams: int, alus: int) -> dict[str, Any]:
        return {"stage_number": n,
                "rams": {"nRows": 8, "nColumns": 10, "srams": [{"row": 0, "column": c, "usages": []}
                                                              for c in range(srams)]},
                "meter_alus": {"nAlus": 4, "meters": [{"row": r, "usages": []} for r in range(alus)]}}

    data = {"program_name": "kvpool_tna.p4",
            "resources": {"mau": {"nStages": 12, "mau_stages": [stage(1, 0, 0), stage(0, 12, 3)]}}}
    got = summarise(data, "bf-p4c 9.13.4", "abc")
    assert got["stages_used"] == 1
    assert got["totals"]["srams"] == 12 and got["totals"]["stateful_alus"] == 3
    assert got["stages"][0] == {"stage": 0, "srams": {"used": 12, "available": 80},
                                "stateful_alus": {"used": 3, "available": 4}}
    assert got["stages_available"] == 12 and got["sources_sha256"] == "abc"


# ------------------------------------------------------------------------------- the controller


def _bf_p4c_style(tmp: Path) -> Path:
    """The v1model P4Info named as bf-p4c names a TNA program's (pipe prefix, arch tna)."""
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2

    msg = p4info_pb2.P4Info()
    text_format.Parse(contract.P4INFO_PATH.read_text(), msg)
    msg.pkg_info.arch = "tna"
    for entity in (*msg.tables, *msg.actions):
        if entity.preamble.name != contract.NO_ACTION:
            entity.preamble.name = f"{contract.TNA_PIPE}.{entity.preamble.name}"
    path = tmp / "bf-p4c-style.p4info.txtpb"
    path.write_text(text_format.MessageToString(msg))
    return path


@pytest.mark.parametrize("which", ["bf-p4c-style", "committed"])
def test_the_controllers_driver_uses_the_contract_names(which: str, tmp_path: Path) -> None:
    """controller/ drives the TNA P4Info by the names it uses for the v1model one."""
    from controller.p4runtime import P4RuntimeSwitch
    from kvpool.tcp import free_port
    from switchmodel.p4rt_server import P4RuntimeServer
    from switchmodel.state import SwitchState

    if which == "committed":
        if not contract.TNA_P4INFO_PATH.exists():
            pytest.skip("p4/tna/build/kvpool_tna.p4info.txtpb not built yet (make -C p4 tna, needs bf-p4c)")
        p4info_path = contract.TNA_P4INFO_PATH
    else:
        if not contract.P4INFO_PATH.exists():
            pytest.skip("p4/build/kvpool.p4info.txtpb not built yet (make -C p4)")
        p4info_path = _bf_p4c_style(tmp_path)
    server = P4RuntimeServer(SwitchState(), f"127.0.0.1:{free_port()}").start()
    try:
        with P4RuntimeSwitch(f"127.0.0.1:{server.port}", p4info_path, b'{"model": true}', timeout_s=3) as sw:
            sw.connect()
            prefix = sw.p4info.pipe_prefix  # what bf-p4c puts before table and action names
            assert prefix == contract.TNA_PIPE + "." or (which == "committed" and prefix == "")
            sw.insert_entry(contract.POOL_LOOKUP, {contract.KEY_CHUNK_KEY: 0x1234}, contract.POOL_ENTRY,
                            {"base_slot": 3, "frag_count": 1, "chunk_len": 100, "generation": 7, "state": 2,
                             "placement": 9})
            sw.insert_entry(contract.WAITER_LOOKUP, {contract.KEY_WAITER_ADDR: "10.0.0.2"}, contract.SET_WAITER_ID,
                            {"waiter_id": 1})
            sw.set_default_action(contract.COALESCE_CONFIG, contract.SET_PENDING_TIMEOUT, {"timeout_us": 50_000})
            entries = {e.table: e for e in sw.read_entries()}
            assert entries[prefix + contract.POOL_LOOKUP].params["placement"] == 9
            assert sw.read_default_action(contract.COALESCE_CONFIG) == (
                prefix + contract.SET_PENDING_TIMEOUT, {"timeout_us": 50_000})
            for counter in contract.COUNTERS:
                assert len(sw.read_counter(counter)) == sw.p4info.counter(counter).size
            for digest in contract.DIGEST_MEMBERS:
                sw.configure_digest(digest, max_list_size=1)
            assert set(sw.read_digest_configs()) == set(contract.DIGEST_MEMBERS)
    finally:
        server.stop()
