"""The kvpool P4 program (p4/, v1model) executed in Python, packet by packet.

``KvpoolPipeline.process(ingress_port, frame)`` runs one frame through the same stages,
in the same order and with the same arithmetic as ``p4/kvpool.p4`` on BMv2's
``simple_switch``: parser -> verify checksum -> ingress -> packet replication -> egress
(per copy) -> compute checksum -> deparser.  Every table, counter, register, digest and
multicast group is the one in :class:`switchmodel.state.SwitchState`, addressed by its
P4Info name, so a controller programs the model and BMv2 with the same P4Runtime
messages.  The section comments name the P4 file each part mirrors; read them side by
side.  ``switchmodel/DIFFERENCES.md`` lists where the model knowingly differs from BMv2.

v1model details reproduced on purpose (they decide which packets come out):

* a parser error does not drop by itself; ingress sees ``parser_error`` and drops;
* user metadata, locals and standard metadata start at 0 for every packet;
* ``mark_to_drop`` sets ``egress_spec`` to 511 *and* ``mcast_grp`` to 0;
* a non-zero ``mcast_grp`` wins over ``egress_spec``; each replica carries a copy of the
  headers and user metadata and its own ``egress_rid``; an unknown group replicates to
  nothing;
* register reads out of range leave the destination unchanged (0 for a fresh local),
  writes and counter updates out of range do nothing (BMv2 logs and skips them);
* ``hash`` is ``base + algo(bytes) % max`` on the MSB-first packed field list, with
  BMv2's CRC definitions (:mod:`switchmodel.hashes`);
* the deparser emits the valid headers, then the bytes the parser did not consume.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from kvpool import contract as names
from kvpool import wire
from kvpool.contract import (
    BLOOM_BITS,
    BLOOM_SALT,
    COALESCE_MCAST_GRP,
    ETHERTYPE_ARP,
    ETHERTYPE_IPV4,
    FLAG_COALESCED,
    FLAG_NO_CACHE,
    FLAG_RETRANSMIT,
    FLAG_SWITCH_SERVED,
    FRAG_PAYLOAD,
    IPPROTO_UDP,
    KNOWN_FLAGS,
    KV_IPV4_LEN_DATA,
    KV_IPV4_LEN_NO_PAYLOAD,
    KV_UDP_LEN_DATA,
    KV_UDP_LEN_NO_PAYLOAD,
    MAX_FRAG_INDEX,
    MAX_WAITERS,
    OP_DATA,
    OP_GET,
    OP_INVALIDATE,
    OP_MAX,
    OP_NACK,
    PENDING_SLOTS,
    POOL_SLOTS,
    SKETCH_COLS,
    SKETCH_COUNT_MAX,
    SKETCH_SALT,
    SLICE_BYTES,
    STATUS_MAX,
    STATUS_OK,
    SWITCH_REPLY_TTL,
    CoalesceStat,
    DropReason,
    EgressStat,
    PoolStat,
    PoolState,
    PopularityStat,
)
from switchmodel import hashes
from switchmodel.state import StateError, SwitchState

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# P4Info names (kvpool/contract.py holds them for the whole project; short aliases here)
# --------------------------------------------------------------------------------------------

T_WRITERS: Final = names.WRITERS
T_POOL: Final = names.POOL_LOOKUP
T_POP_CONFIG: Final = names.POPULARITY_CONFIG
T_CO_CONFIG: Final = names.COALESCE_CONFIG
T_WAITER: Final = names.WAITER_LOOKUP
T_ROUTE: Final = names.IPV4_ROUTE
T_ARP: Final = names.ARP_FORWARD
T_WAITER_EGRESS: Final = names.WAITER_EGRESS

A_ALLOW_WRITER: Final = names.ALLOW_WRITER
A_POOL_ENTRY: Final = names.POOL_ENTRY
A_SET_POPULARITY: Final = names.SET_POPULARITY
A_SET_TIMEOUT: Final = names.SET_PENDING_TIMEOUT
A_SET_WAITER: Final = names.SET_WAITER_ID
A_IPV4_FORWARD: Final = names.IPV4_FORWARD
A_DROP_NO_ROUTE: Final = names.DROP_NO_ROUTE
A_ARP_UNICAST: Final = names.ARP_UNICAST
A_ARP_FLOOD: Final = names.ARP_FLOOD
A_REWRITE_WAITER: Final = names.REWRITE_WAITER

C_DROP: Final = names.DROP_REASON
C_SLOT_HITS: Final = names.SLOT_HITS
C_SLOT_FILLS: Final = names.SLOT_FILLS
C_POOL_STATS: Final = names.POOL_STATS
C_CO_STATS: Final = names.COALESCE_STATS
C_POP_STATS: Final = names.POPULARITY_STATS
C_WAITER_REPLICAS: Final = names.WAITER_REPLICAS
C_EGRESS_STATS: Final = names.EGRESS_STATS

R_SLICES: Final = names.SLICES
R_SLOT_KEY: Final = names.SLOT_KEY
R_SLOT_GEN: Final = names.SLOT_GEN
R_SLOT_VALID: Final = names.SLOT_VALID
R_CHUNK_GEN: Final = names.CHUNK_GEN
R_CHUNK_GEN_KEY: Final = names.CHUNK_GEN_KEY
R_SKETCH: Final = names.SKETCH_ROWS
R_BLOOM: Final = names.BLOOM_ROWS
R_PENDING_TAG: Final = names.PENDING_TAG
R_PENDING_TS: Final = names.PENDING_TS
R_PENDING_WAITERS: Final = names.PENDING_WAITERS
R_PENDING_REPLY: Final = names.PENDING_REPLY

D_HOT_CHUNK: Final = names.HOT_CHUNK

REQUIRED_NAMES: Final = tuple(n for n in names.all_names() if n != ("action", names.NO_ACTION))
"""Every P4Info object the pipeline touches; a pipeline config lacking one is not kvpool."""

SLICES: Final = wire.SLICES_PER_FRAGMENT
POOL_STATE_FILLING: Final = int(PoolState.FILLING)
POOL_STATE_VALID: Final = int(PoolState.VALID)
DROP_PORT: Final = 511
"""v1model's drop port on BMv2 (``egress_spec == 511`` drops)."""
BMV2_HEADROOM: Final = 512
"""Bytes a packet may grow by in BMv2's simple_switch (its buffer is ingress length + 512)."""

M32: Final = 0xFFFFFFFF
M48: Final = (1 << 48) - 1


# Counter indices: one definition, the operator's (checked against p4/README.md and
# constants.p4); the short names are the pipeline's.
Drop = DropReason
CoStat = CoalesceStat
PopStat = PopularityStat
EgStat = EgressStat


# --------------------------------------------------------------------------------------------
# Headers (p4/include/headers.p4) and the parsed packet
# --------------------------------------------------------------------------------------------

_ETH: Final = struct.Struct("!6s6sH")
_IPV4: Final = struct.Struct("!BBHHHBBHII")
_UDP: Final = struct.Struct("!HHHH")
_KV: Final = wire.HEADER_STRUCT
_ARP_LEN: Final = 28
_ARP_TPA: Final = struct.Struct("!I")


@dataclass(slots=True)
class Ipv4:
    """``ipv4_t``; ``flags`` and ``frag_offset`` are the 3- and 13-bit fields."""

    version: int
    ihl: int
    diffserv: int
    total_len: int
    identification: int
    flags: int
    frag_offset: int
    ttl: int
    protocol: int
    checksum: int
    src: int
    dst: int

    def pack(self) -> bytes:
        """The 20 header bytes."""
        return _IPV4.pack((self.version << 4) | self.ihl, self.diffserv, self.total_len, self.identification,
                          (self.flags << 13) | self.frag_offset, self.ttl, self.protocol, self.checksum,
                          self.src, self.dst)

    def copy(self) -> Ipv4:
        """An independent copy (multicast replicas own their headers)."""
        return Ipv4(self.version, self.ihl, self.diffserv, self.total_len, self.identification, self.flags,
                    self.frag_offset, self.ttl, self.protocol, self.checksum, self.src, self.dst)


@dataclass(slots=True)
class Kv:
    """``kvpool_t``: the 32-byte kvpool header, fields in wire order."""

    version: int
    opcode: int
    flags: int
    chunk_key: int
    frag_index: int
    frag_count: int
    request_id: int
    generation: int
    payload_len: int
    status: int
    chunk_len: int

    def pack(self) -> bytes:
        """The 32 header bytes."""
        return _KV.pack(self.version, self.opcode, self.flags, self.chunk_key, self.frag_index, self.frag_count,
                        self.request_id, self.generation, self.payload_len, self.status, self.chunk_len)

    def copy(self) -> Kv:
        """An independent copy."""
        return Kv(self.version, self.opcode, self.flags, self.chunk_key, self.frag_index, self.frag_count,
                  self.request_id, self.generation, self.payload_len, self.status, self.chunk_len)


@dataclass(slots=True)
class Packet:
    """``headers_t`` plus the unparsed rest of the frame; ``None`` means the header is invalid.

    Ethernet is kept as (dst, src, type) ints, ARP as raw bytes (only ``tpa`` is read and
    ARP is never rewritten), UDP as a 4-item list, payload slices as 128-byte strings.
    """

    eth_dst: int = 0
    eth_src: int = 0
    eth_type: int = 0
    eth_valid: bool = False
    arp: bytes | None = None
    ipv4: Ipv4 | None = None
    udp: list[int] | None = None
    kv: Kv | None = None
    payload: list[bytes] | None = None
    rest: bytes = b""
    parser_error: bool = False

    def copy(self) -> Packet:
        """A replica: same field values, independently writable."""
        return Packet(self.eth_dst, self.eth_src, self.eth_type, self.eth_valid, self.arp,
                      self.ipv4.copy() if self.ipv4 else None, list(self.udp) if self.udp else None,
                      self.kv.copy() if self.kv else None, list(self.payload) if self.payload else None,
                      self.rest, self.parser_error)

    def deparse(self) -> bytes:
        """``MyDeparser``: valid headers in wire order, then the unparsed bytes."""
        parts: list[bytes] = []
        if self.eth_valid:
            parts.append(_ETH.pack(self.eth_dst.to_bytes(6, "big"), self.eth_src.to_bytes(6, "big"),
                                   self.eth_type))
        if self.arp is not None:
            parts.append(self.arp)
        if self.ipv4 is not None:
            parts.append(self.ipv4.pack())
        if self.udp is not None:
            parts.append(_UDP.pack(*self.udp))
        if self.kv is not None:
            parts.append(self.kv.pack())
        if self.payload is not None:
            parts.extend(self.payload)
        parts.append(self.rest)
        return b"".join(parts)


def parse(frame: bytes) -> Packet:
    """``MyParser`` (p4/include/parser.p4): Ethernet / (ARP | IPv4 / UDP / kvpool / 11 slices).

    A frame too short for a header that the parser extracts ends with ``parser_error``
    set and that header (and the ones after it) invalid, as BMv2 does.
    """
    pkt = Packet()
    n = len(frame)
    if n < 14:
        pkt.parser_error = True
        pkt.rest = frame
        return pkt
    dst, src, etype = _ETH.unpack_from(frame, 0)
    pkt.eth_dst, pkt.eth_src, pkt.eth_type, pkt.eth_valid = int.from_bytes(dst, "big"), int.from_bytes(
        src, "big"), etype, True
    off = 14
    if etype == ETHERTYPE_ARP:
        if n < off + _ARP_LEN:
            pkt.parser_error = True
        else:
            pkt.arp = frame[off:off + _ARP_LEN]
            off += _ARP_LEN
        pkt.rest = frame[off:]
        return pkt
    if etype != ETHERTYPE_IPV4:
        pkt.rest = frame[off:]
        return pkt
    if n < off + 20:
        pkt.parser_error = True
        pkt.rest = frame[off:]
        return pkt
    vi, tos, tlen, ident, ff, ttl, proto, csum, s, d = _IPV4.unpack_from(frame, off)
    ip = Ipv4(vi >> 4, vi & 0xF, tos, tlen, ident, ff >> 13, ff & 0x1FFF, ttl, proto, csum, s, d)
    pkt.ipv4 = ip
    off += 20
    # Options and fragments are forwarded untouched, never read as kvpool.
    if not (ip.ihl == 5 and ip.frag_offset == 0 and proto == IPPROTO_UDP):
        pkt.rest = frame[off:]
        return pkt
    if n < off + 8:
        pkt.parser_error = True
        pkt.rest = frame[off:]
        return pkt
    udp = list(_UDP.unpack_from(frame, off))
    pkt.udp = udp
    off += 8
    if udp[1] != wire.KVPOOL_UDP_PORT and udp[0] != wire.KVPOOL_UDP_PORT:
        pkt.rest = frame[off:]
        return pkt
    if n < off + wire.HEADER_LEN:
        pkt.parser_error = True
        pkt.rest = frame[off:]
        return pkt
    pkt.kv = Kv(*_KV.unpack_from(frame, off))
    off += wire.HEADER_LEN
    # DATA always has its payload; a GET whose UDP length is a DATA's carries reply room.
    if pkt.kv.opcode == OP_DATA or (pkt.kv.opcode == OP_GET and udp[2] == KV_UDP_LEN_DATA):
        # Eleven fixed extracts; less than 1408 bytes fails on the first slice that does
        # not fit (the ones before it stay valid, but ingress drops the packet anyway).
        if n < off + FRAG_PAYLOAD:
            pkt.parser_error = True
            full = (n - off) // SLICE_BYTES
            pkt.payload = [frame[off + i * SLICE_BYTES:off + (i + 1) * SLICE_BYTES] for i in range(full)]
            off += full * SLICE_BYTES
        else:
            pkt.payload = [frame[off + i * SLICE_BYTES:off + (i + 1) * SLICE_BYTES] for i in range(SLICES)]
            off += FRAG_PAYLOAD
    pkt.rest = frame[off:]
    return pkt


def ipv4_csum16(ip: Ipv4) -> int:
    """csum16 over the IPv4 header fields except the checksum (``MyVerifyChecksum`` field list).

    Summed from the field values, without packing bytes: the same ones' complement sum
    as :func:`switchmodel.checksum.ipv4_header_checksum` on the packed header.
    """
    total = (((ip.version << 12) | (ip.ihl << 8) | ip.diffserv) + ip.total_len + ip.identification
             + ((ip.flags << 13) | ip.frag_offset) + ((ip.ttl << 8) | ip.protocol)
             + (ip.src >> 16) + (ip.src & 0xFFFF) + (ip.dst >> 16) + (ip.dst & 0xFFFF))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


# --------------------------------------------------------------------------------------------
# Metadata (meta_t of headers.p4 + the standard_metadata fields the program reads)
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Meta:
    """``metadata_t`` and ``standard_metadata_t``; every field starts at 0 as in BMv2."""

    drop_reason: int = 0
    is_writer: int = 0
    served: int = 0
    flood: int = 0
    pool_found: int = 0
    base_slot: int = 0
    pool_frag_count: int = 0
    pool_chunk_len: int = 0
    pool_generation: int = 0
    pool_state: int = 0
    cur_generation: int = 0
    waiter_addr: int = 0
    has_waiter: int = 0
    waiter_id: int = 0
    pending_idx: int = 0
    record_reply: int = 0
    absorb: int = 0
    release: int = 0
    release_mask: int = 0
    release_dst: int = 0
    # standard_metadata
    ingress_port: int = 0
    egress_spec: int = 0
    egress_port: int = 0
    egress_rid: int = 0
    mcast_grp: int = 0
    ingress_timestamp: int = 0
    packet_length: int = 0
    # control-local state that lives for one packet (set by keyless config tables)
    hot_threshold: int = 0
    cur_epoch: int = 0
    pending_timeout: int = 0

    def copy(self) -> Meta:
        """A replica's copy of user and standard metadata (BMv2 copies the whole PHV)."""
        return dataclasses.replace(self)


def mark_to_drop(meta: Meta) -> None:
    """v1model ``mark_to_drop``: drop port as egress_spec and no multicast."""
    meta.egress_spec = DROP_PORT
    meta.mcast_grp = 0


# --------------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------------


@dataclass
class PipelineStats:
    """What happened to frames in the model, beyond the P4 counters (for status and benches)."""

    frames_in: int = 0
    frames_out: int = 0
    dropped_no_pipeline: int = 0
    dropped_ingress: int = 0
    dropped_egress: int = 0
    replicas: int = 0
    beyond_bmv2_headroom: int = 0
    """Frames sent larger than their ingress length + 512 bytes: BMv2 cannot build them."""


def default_clock_us() -> Callable[[], int]:
    """A 48-bit microsecond clock starting near 0, like ``ingress_global_timestamp`` on BMv2."""
    start = time.monotonic_ns()
    return lambda: ((time.monotonic_ns() - start) // 1000) & M48


class KvpoolPipeline:
    """Runs frames through the kvpool program against a :class:`SwitchState`."""

    def __init__(self, state: SwitchState, clock_us: Callable[[], int] | None = None) -> None:
        """``clock_us`` gives ``ingress_global_timestamp``; tests may pass a fake one."""
        self.state = state
        self.clock_us = clock_us or default_clock_us()
        self.stats = PipelineStats()
        self._ready: bool | None = None
        self._ready_generation = -1
        self._lock = threading.Lock()
        # Live register and counter arrays of the committed pipeline (re-fetched on commit).
        self._regs: dict[str, list[int]] = {}
        self._reg_mask: dict[str, int] = {}
        self._ctrs: dict[str, list[list[int]]] = {}

    # --- pipeline checks ---------------------------------------------------------------------

    def ready(self) -> bool:
        """True when a pipeline is committed and its P4Info has every object this model runs."""
        gen = self.state.generation
        if gen != self._ready_generation:
            self._ready_generation = gen
            pipe = self.state.pipeline
            if pipe is None:
                self._ready = False
            else:
                missing = [f"{kind} {name}" for kind, name in REQUIRED_NAMES if not pipe.p4info.has(kind, name)]
                if missing:
                    log.error("pipeline is not kvpool: P4Info lacks %s; dropping every packet",
                              ", ".join(missing[:5]))
                self._ready = not missing
                if self._ready:
                    self._regs = {r.name: self.state.register_cells(r.name) for r in pipe.p4info.registers}
                    self._reg_mask = {r.name: (1 << r.bitwidth) - 1 for r in pipe.p4info.registers}
                    self._ctrs = {c.name: self.state.counter_cells(c.name) for c in pipe.p4info.counters}
        return bool(self._ready)

    # --- externs with BMv2's out-of-range behaviour -----------------------------------------

    def _read(self, reg: str, index: int, current: int = 0) -> int:
        """``register.read``: out of range leaves the destination as it was."""
        cells = self._regs[reg]
        return cells[index] if 0 <= index < len(cells) else current

    def _write(self, reg: str, index: int, value: int) -> None:
        """``register.write``, cut to the cell width; out of range writes nothing."""
        cells = self._regs[reg]
        if 0 <= index < len(cells):
            cells[index] = value & self._reg_mask[reg]

    def _count(self, ctr: str, index: int, meta: Meta) -> None:
        """``counter.count`` (packets; bytes kept too, as BMv2 does): out of range counts nothing."""
        cells = self._ctrs[ctr]
        if 0 <= index < len(cells):
            cell = cells[index]
            cell[0] += 1
            cell[1] += meta.packet_length

    # --- top level ---------------------------------------------------------------------------

    def process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Run one frame received on ``ingress_port``; return ``(egress_port, frame)`` for each copy sent."""
        with self._lock:
            self.stats.frames_in += 1
            if not self.ready():
                # Like simple_switch_grpc before SetForwardingPipelineConfig: nothing forwards.
                self.stats.dropped_no_pipeline += 1
                return []
            try:
                out = self._process(ingress_port, frame)
            except StateError as exc:
                # The pipeline changed under this packet (e.g. a reload between lookups).
                log.warning("packet dropped, state changed while processing: %s", exc.message)
                self.stats.dropped_no_pipeline += 1
                return []
            self.stats.frames_out += len(out)
            return out

    def _process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        pkt = parse(frame)
        meta = Meta(ingress_port=ingress_port, ingress_timestamp=self.clock_us() & M48, packet_length=len(frame))
        checksum_error = pkt.ipv4 is not None and pkt.ipv4.ihl == 5 and ipv4_csum16(pkt.ipv4) != pkt.ipv4.checksum
        self._ingress(pkt, meta, checksum_error)

        # Packet replication engine / unicast (simple_switch ingress_thread).
        copies: list[tuple[Packet, Meta]]
        if meta.mcast_grp != 0:
            copies = []
            for replica in self.state.multicast_group(meta.mcast_grp):
                m = meta.copy()
                m.egress_port = replica.port
                m.egress_rid = replica.rid
                copies.append((pkt.copy(), m))
            self.stats.replicas += len(copies)
        elif meta.egress_spec == DROP_PORT:
            self.stats.dropped_ingress += 1
            return []
        else:
            meta.egress_port = meta.egress_spec
            meta.egress_rid = 0
            copies = [(pkt, meta)]

        out: list[tuple[int, bytes]] = []
        for p, m in copies:
            # simple_switch initialises egress_spec to a value other than the drop port.
            m.egress_spec = DROP_PORT + 1
            self._egress(p, m)
            if m.egress_spec == DROP_PORT:
                self.stats.dropped_egress += 1
                continue
            if p.ipv4 is not None and p.ipv4.ihl == 5:
                # MyComputeChecksum.
                p.ipv4.checksum = ipv4_csum16(p.ipv4)
            data = p.deparse()
            if len(data) > len(frame) + BMV2_HEADROOM:
                # BMv2 overruns its packet buffer here (and crashes); the model sends the
                # frame the P4 program describes and says so (switchmodel/DIFFERENCES.md).
                self.stats.beyond_bmv2_headroom += 1
                if self.stats.beyond_bmv2_headroom == 1:
                    log.warning("a %d-byte frame grew to %d bytes: more than BMv2's %d bytes of headroom",
                                len(frame), len(data), BMV2_HEADROOM)
            out.append((m.egress_port, data))
        return out

    # --- ingress (p4/include/ingress.p4) -----------------------------------------------------

    def _ingress(self, pkt: Packet, meta: Meta, checksum_error: bool) -> None:
        kv = pkt.kv
        if pkt.parser_error:
            meta.drop_reason = Drop.PARSE_ERROR
        elif checksum_error:
            meta.drop_reason = Drop.BAD_CHECKSUM
        elif kv is not None:
            self._safety(pkt, meta)

        if meta.drop_reason == Drop.NONE and kv is not None:
            self._pool(pkt, meta)
            if meta.drop_reason == Drop.NONE and meta.served == 0:
                is_get = kv.opcode == OP_GET
                single_get = is_get and kv.frag_count == 1
                response = (kv.opcode in (OP_DATA, OP_NACK)) and meta.is_writer == 1
                if is_get:
                    self._popularity(pkt, meta)
                if single_get or response:
                    self._coalesce(pkt, meta)

        if meta.drop_reason == Drop.NONE:
            if meta.absorb == 1:
                meta.egress_spec = meta.ingress_port
            else:
                ip = pkt.ipv4
                if ip is not None and meta.served == 0:
                    if ip.ttl <= 1:
                        meta.drop_reason = Drop.TTL_EXPIRED
                    else:
                        ip.ttl -= 1
                if meta.drop_reason == Drop.NONE and meta.release == 0:
                    self._forwarding(pkt, meta)

        if meta.drop_reason != Drop.NONE:
            self._count(C_DROP, meta.drop_reason, meta)
            mark_to_drop(meta)

    # --- safety (p4/include/safety.p4) -------------------------------------------------------

    def _safety(self, pkt: Packet, meta: Meta) -> None:
        kv = pkt.kv
        udp = pkt.udp
        ip = pkt.ipv4
        assert kv is not None and udp is not None and ip is not None
        idx = kv.frag_index
        cnt = kv.frag_count
        frag = FRAG_PAYLOAD
        done = (idx * frag) & M32
        rest = (kv.chunk_len - done) & M32

        if kv.version != wire.KVPOOL_VERSION:
            meta.drop_reason = Drop.BAD_VERSION
        elif kv.opcode == 0 or kv.opcode > OP_MAX:
            meta.drop_reason = Drop.BAD_OPCODE
        elif kv.flags & ~KNOWN_FLAGS & 0xFFFF:
            meta.drop_reason = Drop.BAD_FLAGS
        elif cnt == 0 or idx == MAX_FRAG_INDEX:
            meta.drop_reason = Drop.BAD_RANGE
        elif kv.opcode == OP_DATA:
            if idx >= cnt:
                meta.drop_reason = Drop.BAD_RANGE
            else:
                # payload_len 1..1408, UDP length 1448, frag_count == ceil(chunk_len / 1408)
                # and payload_len == min(1408, chunk_len - idx * 1408), in 32-bit arithmetic.
                bad_plen = kv.payload_len == 0 or kv.payload_len > FRAG_PAYLOAD or udp[2] != KV_UDP_LEN_DATA
                bad_clen = kv.chunk_len <= ((cnt - 1) * frag) & M32 or kv.chunk_len > (cnt * frag) & M32
                bad_rest = (rest >= frag and kv.payload_len != FRAG_PAYLOAD) or (
                    rest < frag and kv.payload_len != rest)
                if bad_plen or bad_clen or bad_rest:
                    meta.drop_reason = Drop.BAD_LENGTH
        elif kv.payload_len != 0:
            meta.drop_reason = Drop.BAD_LENGTH
        elif udp[2] != KV_UDP_LEN_NO_PAYLOAD and not (kv.opcode == OP_GET and udp[2] == KV_UDP_LEN_DATA):
            # No payload, except the reply room a GET may carry.
            meta.drop_reason = Drop.BAD_LENGTH
        elif kv.opcode == OP_GET and idx + cnt > MAX_FRAG_INDEX:
            meta.drop_reason = Drop.BAD_RANGE

        if meta.drop_reason == Drop.NONE:
            if kv.opcode == OP_NACK:
                if kv.status == STATUS_OK or kv.status > STATUS_MAX:
                    meta.drop_reason = Drop.BAD_STATUS
            elif kv.status != STATUS_OK:
                meta.drop_reason = Drop.BAD_STATUS

        if meta.drop_reason == Drop.NONE:
            res = self.state.lookup(T_WRITERS, (ip.src,), meta.packet_length)
            if res.action == A_ALLOW_WRITER:
                meta.is_writer = 1
            if kv.opcode == OP_INVALIDATE and meta.is_writer == 0:
                meta.drop_reason = Drop.NOT_WRITER

    # --- pool (p4/include/pool.p4) -----------------------------------------------------------

    def _pool(self, pkt: Packet, meta: Meta) -> None:
        kv = pkt.kv
        assert kv is not None
        res = self.state.lookup(T_POOL, (kv.chunk_key,), meta.packet_length)
        if res.hit:
            self._pool_hit(pkt, meta, res.action, res.params)
        else:
            self._count(C_POOL_STATS, PoolStat.LOOKUP_MISS, meta)
        if kv.opcode == OP_GET and meta.served == 0 and pkt.payload is not None:
            self._strip_reply_room(pkt)

    def _strip_reply_room(self, pkt: Packet) -> None:
        """Action ``strip_reply_room``: what goes on past this switch is a plain GET."""
        assert pkt.ipv4 is not None and pkt.udp is not None
        pkt.payload = None
        pkt.ipv4.total_len = KV_IPV4_LEN_NO_PAYLOAD
        pkt.udp[2] = KV_UDP_LEN_NO_PAYLOAD
        pkt.udp[3] = 0

    def _pool_hit(self, pkt: Packet, meta: Meta, action: str, params: Mapping[str, int]) -> None:
        """The ``pool_lookup`` hit branch of ``Pool.apply``."""
        kv = pkt.kv
        assert kv is not None
        if action == A_POOL_ENTRY:
            p = params
            meta.pool_found = 1
            meta.base_slot = p["base_slot"]
            meta.pool_frag_count = p["frag_count"]
            meta.pool_chunk_len = p["chunk_len"]
            meta.pool_generation = p["generation"]
            meta.pool_state = p["state"]

        gen_key = self._read(R_CHUNK_GEN_KEY, meta.base_slot)
        gen_val = self._read(R_CHUNK_GEN, meta.base_slot)
        meta.cur_generation = meta.pool_generation
        if gen_key == kv.chunk_key and gen_val > meta.pool_generation:
            meta.cur_generation = gen_val

        slot = (meta.base_slot + kv.frag_index) & M32
        slot_ok = meta.base_slot < POOL_SLOTS and slot < POOL_SLOTS
        usable = meta.pool_state in (POOL_STATE_FILLING, POOL_STATE_VALID)

        if kv.opcode == OP_GET:
            if (kv.frag_count != 1 or kv.flags & FLAG_NO_CACHE
                    or (kv.generation != 0 and kv.generation != meta.cur_generation)
                    or not usable or kv.frag_index >= meta.pool_frag_count):
                self._count(C_POOL_STATS, PoolStat.BYPASS, meta)
            elif not slot_ok:
                self._count(C_POOL_STATS, PoolStat.SLOT_RANGE, meta)
            elif pkt.payload is None:
                self._count(C_POOL_STATS, PoolStat.NO_ROOM, meta)
            elif self._slot_current(slot, kv.chunk_key, meta.cur_generation):
                rest = (meta.pool_chunk_len - kv.frag_index * FRAG_PAYLOAD) & M32
                payload_len = rest & 0xFFFF if rest < FRAG_PAYLOAD else FRAG_PAYLOAD
                self._serve(pkt, meta, slot, payload_len)
                self._count(C_SLOT_HITS, slot, meta)
                self._count(C_POOL_STATS, PoolStat.HIT, meta)
            else:
                self._count(C_POOL_STATS, PoolStat.MISS_UNFILLED, meta)
        elif kv.opcode == OP_DATA:
            if meta.is_writer == 0:
                self._count(C_POOL_STATS, PoolStat.FILL_UNAUTH, meta)
            elif kv.frag_count != meta.pool_frag_count or kv.chunk_len != meta.pool_chunk_len:
                meta.drop_reason = Drop.FILL_MISMATCH
            elif kv.generation < meta.cur_generation:
                self._count(C_POOL_STATS, PoolStat.FILL_STALE, meta)
            else:
                if kv.generation > meta.cur_generation:
                    self._advance_generation(kv, meta, kv.generation)
                    self._count(C_POOL_STATS, PoolStat.INVALIDATE, meta)
                if not usable:
                    pass  # disabled entry: the DATA passes, nothing is remembered
                elif not slot_ok:
                    self._count(C_POOL_STATS, PoolStat.SLOT_RANGE, meta)
                else:
                    current = (meta.pool_state == POOL_STATE_VALID
                               and self._slot_current(slot, kv.chunk_key, meta.cur_generation))
                    if current:
                        self._count(C_POOL_STATS, PoolStat.FILL_SKIPPED, meta)
                    else:
                        self._write_slot(pkt, meta, slot)
                        self._count(C_SLOT_FILLS, slot, meta)
                        self._count(C_POOL_STATS, PoolStat.FILL, meta)
        elif kv.opcode == OP_INVALIDATE:
            if kv.generation > meta.cur_generation:
                self._advance_generation(kv, meta, kv.generation)
                self._count(C_POOL_STATS, PoolStat.INVALIDATE, meta)
            else:
                self._count(C_POOL_STATS, PoolStat.INVALIDATE_STALE, meta)

    def _slot_current(self, slot: int, chunk_key: int, generation: int) -> bool:
        """The slot's tag says: written, this chunk, this generation."""
        valid = self._read(R_SLOT_VALID, slot)
        key = self._read(R_SLOT_KEY, slot)
        gen = self._read(R_SLOT_GEN, slot)
        return valid == 1 and key == chunk_key and gen == generation

    def _advance_generation(self, kv: Kv, meta: Meta, generation: int) -> None:
        """Action ``advance_generation``."""
        self._write(R_CHUNK_GEN, meta.base_slot, generation)
        self._write(R_CHUNK_GEN_KEY, meta.base_slot, kv.chunk_key)
        meta.cur_generation = generation

    def _write_slot(self, pkt: Packet, meta: Meta, slot: int) -> None:
        """Action ``write_slot``: 11 slices and the slot's tag."""
        kv = pkt.kv
        assert kv is not None and pkt.payload is not None
        for reg, chunk in zip(R_SLICES, pkt.payload, strict=True):
            self._write(reg, slot, int.from_bytes(chunk, "big"))
        self._write(R_SLOT_KEY, slot, kv.chunk_key)
        self._write(R_SLOT_GEN, slot, meta.cur_generation)
        self._write(R_SLOT_VALID, slot, 1)

    def _serve(self, pkt: Packet, meta: Meta, slot: int, payload_len: int) -> None:
        """Action ``serve``: the GET becomes the DATA reply in place."""
        kv, ip, udp = pkt.kv, pkt.ipv4, pkt.udp
        assert kv is not None and ip is not None and udp is not None
        # The reply room (valid slices) receives the fragment: the packet does not grow.
        pkt.payload = [self._read(reg, slot).to_bytes(SLICE_BYTES, "big") for reg in R_SLICES]
        pkt.eth_dst, pkt.eth_src = pkt.eth_src, pkt.eth_dst
        ip.src, ip.dst = ip.dst, ip.src
        ip.total_len = KV_IPV4_LEN_DATA
        ip.ttl = SWITCH_REPLY_TTL
        udp[0], udp[1] = udp[1], udp[0]
        udp[2] = KV_UDP_LEN_DATA
        udp[3] = 0
        kv.opcode = OP_DATA
        kv.flags = FLAG_SWITCH_SERVED
        kv.frag_count = meta.pool_frag_count
        kv.generation = meta.cur_generation
        kv.payload_len = payload_len
        kv.status = STATUS_OK
        kv.chunk_len = meta.pool_chunk_len
        meta.served = 1

    # --- popularity (p4/include/popularity.p4) -----------------------------------------------

    def _popularity(self, pkt: Packet, meta: Meta) -> None:
        kv = pkt.kv
        assert kv is not None
        if not (meta.pool_found == 0 and kv.frag_index == 0 and not kv.flags & FLAG_RETRANSMIT):
            return
        cfg = self.state.lookup(T_POP_CONFIG, (), meta.packet_length)
        if cfg.action == A_SET_POPULARITY:
            meta.hot_threshold = cfg.params["threshold"]
            meta.cur_epoch = cfg.params["epoch"]
        tag = 0x80 | (meta.cur_epoch & 0x7F)

        key8 = kv.chunk_key.to_bytes(8, "big")
        salt4 = SKETCH_SALT.to_bytes(4, "big")
        idx = (hashes.crc32(key8) % SKETCH_COLS, hashes.crc16(key8) % SKETCH_COLS,
               hashes.crc32(key8 + salt4) % SKETCH_COLS)
        counts = []
        for reg, i in zip(R_SKETCH, idx, strict=True):
            cell = self._read(reg, i)
            counts.append(_next_count(cell, tag))
        for reg, i, n in zip(R_SKETCH, idx, counts, strict=True):
            self._write(reg, i, (tag << 24) | n)
        self._count(C_POP_STATS, PopStat.COUNTED, meta)
        estimate = min(counts)

        if estimate >= meta.hot_threshold:
            bloom_in = BLOOM_SALT.to_bytes(4, "big") + key8
            b0 = hashes.crc32(bloom_in) % BLOOM_BITS
            b1 = hashes.crc16(bloom_in) % BLOOM_BITS
            seen0 = self._read(R_BLOOM[0], b0)
            seen1 = self._read(R_BLOOM[1], b1)
            if seen0 == tag and seen1 == tag:
                self._count(C_POP_STATS, PopStat.SUPPRESSED, meta)
            else:
                self._write(R_BLOOM[0], b0, tag)
                self._write(R_BLOOM[1], b1, tag)
                # BMv2 hands digests to the learn engine even for packets dropped later.
                self.state.emit_digest(D_HOT_CHUNK, (kv.chunk_key, estimate, meta.cur_epoch))
                self._count(C_POP_STATS, PopStat.REPORTED, meta)

    # --- coalescing, ingress half (p4/include/coalesce.p4) -----------------------------------

    def _coalesce(self, pkt: Packet, meta: Meta) -> None:
        kv, ip = pkt.kv, pkt.ipv4
        assert kv is not None and ip is not None
        cfg = self.state.lookup(T_CO_CONFIG, (), meta.packet_length)
        if cfg.action == A_SET_TIMEOUT:
            meta.pending_timeout = cfg.params["timeout_us"]
        meta.waiter_addr = ip.src if kv.opcode == OP_GET else ip.dst
        res = self.state.lookup(T_WAITER, (meta.waiter_addr,), meta.packet_length)
        if res.action == A_SET_WAITER:
            meta.has_waiter = 1
            meta.waiter_id = res.params["waiter_id"]
        if meta.waiter_id >= MAX_WAITERS:
            meta.has_waiter = 0

        meta.pending_idx = zlib.crc32(kv.chunk_key.to_bytes(8, "big") + kv.frag_index.to_bytes(2, "big")) \
            % PENDING_SLOTS
        tag = (kv.chunk_key << 16) | kv.frag_index
        slot_tag = self._read(R_PENDING_TAG, meta.pending_idx)
        slot_ts = self._read(R_PENDING_TS, meta.pending_idx)
        slot_mask = self._read(R_PENDING_WAITERS, meta.pending_idx)
        # The P4 casts the shift amount to bit<8> (BMv2 shifts by at most 8 bits); a shift
        # by the full width or more gives 0.
        shift = meta.waiter_id & 0xFF
        me = (1 << shift) & M32 if shift < 32 else 0
        now = meta.ingress_timestamp

        if kv.opcode == OP_GET:
            live = slot_mask != 0 and ((now - slot_ts) & M48) < meta.pending_timeout
            if meta.has_waiter == 0:
                self._count(C_CO_STATS, CoStat.NO_WAITER_ID, meta)
            elif live and slot_tag == tag:
                self._write(R_PENDING_WAITERS, meta.pending_idx, slot_mask | me)
                meta.record_reply = 1
                if kv.flags & FLAG_RETRANSMIT:
                    self._count(C_CO_STATS, CoStat.RETRANSMIT, meta)
                else:
                    meta.absorb = 1
                    self._count(C_CO_STATS, CoStat.ABSORBED, meta)
            elif live:
                self._count(C_CO_STATS, CoStat.COLLISION, meta)
            else:
                if slot_mask != 0:
                    self._count(C_CO_STATS, CoStat.EXPIRED_REUSED, meta)
                self._write(R_PENDING_TAG, meta.pending_idx, tag)
                self._write(R_PENDING_TS, meta.pending_idx, now)
                self._write(R_PENDING_WAITERS, meta.pending_idx, me)
                meta.record_reply = 1
                self._count(C_CO_STATS, CoStat.FIRST, meta)
        elif meta.has_waiter == 1 and slot_tag == tag and slot_mask & me:
            self._write(R_PENDING_WAITERS, meta.pending_idx, 0)
            meta.release = 1
            meta.release_mask = slot_mask
            meta.release_dst = meta.waiter_id
            meta.mcast_grp = COALESCE_MCAST_GRP
            self._count(C_CO_STATS, CoStat.RELEASE, meta)

    # --- forwarding (p4/include/forwarding.p4) -----------------------------------------------

    def _forwarding(self, pkt: Packet, meta: Meta) -> None:
        if pkt.ipv4 is not None:
            res = self.state.lookup(T_ROUTE, (pkt.ipv4.dst,), meta.packet_length)
            if res.action == A_IPV4_FORWARD:
                meta.egress_spec = res.params["port"]
                pkt.eth_dst = res.params["dst_mac"]
            elif res.action == A_DROP_NO_ROUTE:
                meta.drop_reason = Drop.NO_ROUTE
        elif pkt.arp is not None:
            (tpa,) = _ARP_TPA.unpack_from(pkt.arp, 24)
            res = self.state.lookup(T_ARP, (tpa,), meta.packet_length)
            if res.action == A_ARP_UNICAST:
                meta.egress_spec = res.params["port"]
            elif res.action == A_ARP_FLOOD:
                meta.mcast_grp = res.params["mcast_grp"]
                meta.flood = 1
            elif res.action == A_DROP_NO_ROUTE:
                meta.drop_reason = Drop.NO_ROUTE
        else:
            meta.drop_reason = Drop.UNHANDLED

    # --- egress (p4/include/egress.p4 and the egress half of coalesce.p4) --------------------

    def _egress(self, pkt: Packet, meta: Meta) -> None:
        if meta.flood == 1 and meta.egress_port == meta.ingress_port:
            mark_to_drop(meta)
            return
        kv = pkt.kv
        if meta.release == 1:
            assert kv is not None and pkt.udp is not None and pkt.ipv4 is not None
            rid = meta.egress_rid
            if rid >= MAX_WAITERS or not meta.release_mask & (1 << (rid & 0xFF)):
                mark_to_drop(meta)
                self._count(C_EGRESS_STATS, EgStat.REPLICA_PRUNED, meta)
                return
            res = self.state.lookup(T_WAITER_EGRESS, (rid,), meta.packet_length)
            if res.hit:
                if res.action == A_REWRITE_WAITER:
                    pkt.ipv4.dst = res.params["addr"]
                    pkt.eth_dst = res.params["mac"]
                reply = self._read(R_PENDING_REPLY, (meta.pending_idx * MAX_WAITERS + rid) & M32)
                kv.request_id = reply >> 16
                pkt.udp[1] = reply & 0xFFFF
                if rid != meta.release_dst:
                    kv.flags |= FLAG_COALESCED
                pkt.udp[3] = 0
                self._count(C_WAITER_REPLICAS, rid, meta)
                self._count(C_EGRESS_STATS, EgStat.REPLICA_SENT, meta)
            else:
                mark_to_drop(meta)
                self._count(C_EGRESS_STATS, EgStat.NO_WAITER_ENTRY, meta)
        elif meta.record_reply == 1:
            assert kv is not None and pkt.udp is not None
            self._write(R_PENDING_REPLY, (meta.pending_idx * MAX_WAITERS + meta.waiter_id) & M32,
                        (kv.request_id << 16) | pkt.udp[0])
            self._count(C_EGRESS_STATS, EgStat.REPLY_RECORDED, meta)
            if meta.absorb == 1:
                mark_to_drop(meta)


def _next_count(cell: int, tag: int) -> int:
    """``next_count`` of popularity.p4: the cell's count this epoch plus one, saturating."""
    count = cell & SKETCH_COUNT_MAX if (cell >> 24) & 0xFF == tag else 0
    if count != SKETCH_COUNT_MAX:
        count += 1
    return count
