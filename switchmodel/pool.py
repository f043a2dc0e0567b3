"""Chunk lookup, hits from register memory, fill on pass (p4/include/pool.p4, ``MyIngress.pool``).

A slot is served only when its tag is ``{placement, frag_index}`` of the chunk's entry;
only writer DATA that matches the entry (generation, ``frag_count``, ``chunk_len``) is
written, and writer DATA that does not is forwarded, counted and reported by a
``fill_mismatch_t`` digest, whose cell comes from :func:`mismatch_index`.  An entry in
state UPSTREAM (the chunk lives on a switch nearer the holder) lets a GET keep its room.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvpool.contract import (
    FILL_MISMATCH,
    FLAG_COALESCED,
    FLAG_NO_CACHE,
    FLAG_SWITCH_SERVED,
    FRAG_PAYLOAD,
    KV_IPV4_LEN_DATA,
    KV_IPV4_LEN_NO_PAYLOAD,
    KV_UDP_LEN_DATA,
    KV_UDP_LEN_NO_PAYLOAD,
    MISMATCH_CELLS,
    MISMATCH_SEEN,
    OP_DATA,
    OP_GET,
    OP_INVALIDATE,
    POOL_ENTRY,
    POOL_LOOKUP,
    POOL_SLOTS,
    POOL_STATS,
    SLICE_BYTES,
    SLICES,
    SLOT_CHECK,
    SLOT_FILLS,
    SLOT_HITS,
    SLOT_TAG,
    STATUS_OK,
    SWITCH_REPLY_TTL,
    PoolStat,
    PoolState,
)
from switchmodel import hashes
from switchmodel.parser import Kv, Meta, Packet
from switchmodel.v1model import M32, Control

POOL_STATE_FILLING = int(PoolState.FILLING)
POOL_STATE_VALID = int(PoolState.VALID)
POOL_STATE_UPSTREAM = int(PoolState.UPSTREAM)
_REPLICA_FLAGS = FLAG_SWITCH_SERVED | FLAG_COALESCED


def mismatch_index(kv: Kv) -> int:
    """The chunk's ``mismatch_seen`` cell: ``hash(crc16, 0, {chunk_key}, MISMATCH_CELLS)``."""
    return hashes.crc16(kv.chunk_key.to_bytes(8, "big")) % MISMATCH_CELLS


def mismatch_value(kv: Kv) -> int:
    """What a cell remembers of a reported mismatch: ``(key[63:32] ^ generation) ++ (key[31:0] ^ chunk_len)``."""
    return ((((kv.chunk_key >> 32) ^ kv.generation) & M32) << 32) | (((kv.chunk_key & M32) ^ kv.chunk_len) & M32)


class Pool(Control):
    """``control Pool``: the paged pool in registers (slices, slot tags and checks)."""

    def apply(self, pkt: Packet, meta: Meta) -> None:
        """``Pool.apply``: lookup; a hit serves or fills; unanswered reply room is stripped."""
        kv = pkt.kv
        assert kv is not None
        res = self.state.lookup(POOL_LOOKUP, (kv.chunk_key,), meta.packet_length)
        keep_room = False
        if res.hit:
            keep_room = self._pool_hit(pkt, meta, res.action, res.params)
        else:
            self._count(POOL_STATS, PoolStat.LOOKUP_MISS, meta)
        if kv.opcode == OP_GET and meta.served == 0 and pkt.payload is not None and not keep_room:
            self._strip_reply_room(pkt)

    def _strip_reply_room(self, pkt: Packet) -> None:
        """Action ``strip_reply_room``: what goes on past this switch is a plain GET."""
        assert pkt.ipv4 is not None and pkt.udp is not None
        pkt.payload = None
        pkt.ipv4.total_len = KV_IPV4_LEN_NO_PAYLOAD
        pkt.udp[2] = KV_UDP_LEN_NO_PAYLOAD
        pkt.udp[3] = 0

    def _pool_hit(self, pkt: Packet, meta: Meta, action: str, params: Mapping[str, int]) -> bool:
        """The ``pool_lookup`` hit branch of ``Pool.apply``; True when a GET keeps its room (``keep_room``)."""
        kv = pkt.kv
        assert kv is not None
        if action == POOL_ENTRY:
            p = params
            meta.pool_found = 1
            meta.base_slot = p["base_slot"]
            meta.pool_frag_count = p["frag_count"]
            meta.pool_chunk_len = p["chunk_len"]
            meta.pool_generation = p["generation"]
            meta.pool_state = p["state"]
            meta.pool_placement = p["placement"]

        slot = (meta.base_slot + kv.frag_index) & M32
        slot_ok = meta.base_slot < POOL_SLOTS and slot < POOL_SLOTS
        usable = meta.pool_state in (POOL_STATE_FILLING, POOL_STATE_VALID) and meta.pool_placement != 0
        want = (meta.pool_placement << 16) | kv.frag_index

        if kv.opcode == OP_GET:
            if meta.pool_state == POOL_STATE_UPSTREAM:
                # A switch nearer the holder has the bytes: it gets the room.
                self._count(POOL_STATS, PoolStat.UPSTREAM, meta)
                return True
            if (kv.frag_count != 1 or kv.flags & FLAG_NO_CACHE
                    or (kv.generation != 0 and kv.generation != meta.pool_generation)
                    or not usable or kv.frag_index >= meta.pool_frag_count):
                self._count(POOL_STATS, PoolStat.BYPASS, meta)
            elif not slot_ok:
                self._count(POOL_STATS, PoolStat.SLOT_RANGE, meta)
            elif pkt.payload is None:
                self._count(POOL_STATS, PoolStat.NO_ROOM, meta)
            elif self._read(SLOT_TAG, slot) == want:
                rest = (meta.pool_chunk_len - kv.frag_index * FRAG_PAYLOAD) & M32
                payload_len = rest & 0xFFFF if rest < FRAG_PAYLOAD else FRAG_PAYLOAD
                self._serve(pkt, meta, slot, payload_len)
                self._count(SLOT_HITS, slot, meta)
                self._count(POOL_STATS, PoolStat.HIT, meta)
            else:
                self._count(POOL_STATS, PoolStat.MISS_UNFILLED, meta)
        elif kv.opcode == OP_DATA:
            if meta.is_writer == 0:
                self._count(POOL_STATS, PoolStat.FILL_UNAUTH, meta)
            elif kv.flags & _REPLICA_FLAGS:
                self._count(POOL_STATS, PoolStat.FILL_REPLICA, meta)
            elif (kv.generation != meta.pool_generation or kv.frag_count != meta.pool_frag_count
                    or kv.chunk_len != meta.pool_chunk_len):
                self._count(POOL_STATS, PoolStat.FILL_MISMATCH, meta)
                cell = mismatch_index(kv)
                what = mismatch_value(kv)
                if self._read(MISMATCH_SEEN, cell) != what:
                    self._write(MISMATCH_SEEN, cell, what)
                    self.state.emit_digest(FILL_MISMATCH, (kv.chunk_key, kv.generation, kv.frag_count,
                                                           kv.chunk_len))
                    self._count(POOL_STATS, PoolStat.MISMATCH_REPORTED, meta)
            elif not usable:
                pass  # disabled entry: the DATA passes, nothing is remembered
            elif not slot_ok:
                self._count(POOL_STATS, PoolStat.SLOT_RANGE, meta)
            else:
                current = meta.pool_state == POOL_STATE_VALID and self._read(SLOT_TAG, slot) == want
                if current and not kv.flags & FLAG_NO_CACHE:
                    self._count(POOL_STATS, PoolStat.FILL_SKIPPED, meta)
                else:
                    self._write_slot(pkt, slot, want)
                    self._count(SLOT_FILLS, slot, meta)
                    self._count(POOL_STATS, PoolStat.FILL, meta)
                    if current:
                        self._count(POOL_STATS, PoolStat.REPAIR, meta)
        elif kv.opcode == OP_INVALIDATE:
            self._count(POOL_STATS, PoolStat.INVALIDATE, meta)
        return False

    def _write_slot(self, pkt: Packet, slot: int, tag: int) -> None:
        """Action ``write_slot``: 11 slices, the slot's tag and the writer's check."""
        kv = pkt.kv
        assert kv is not None and pkt.payload is not None
        for reg, chunk in zip(SLICES, pkt.payload, strict=True):
            self._write(reg, slot, int.from_bytes(chunk, "big"))
        self._write(SLOT_TAG, slot, tag)
        self._write(SLOT_CHECK, slot, kv.check)

    def _serve(self, pkt: Packet, meta: Meta, slot: int, payload_len: int) -> None:
        """Action ``serve``: the GET becomes the DATA reply in place."""
        kv, ip, udp = pkt.kv, pkt.ipv4, pkt.udp
        assert kv is not None and ip is not None and udp is not None
        # The reply room (valid slices) receives the fragment: the packet does not grow.
        pkt.payload = [self._read(reg, slot).to_bytes(SLICE_BYTES, "big") for reg in SLICES]
        kv.check = self._read(SLOT_CHECK, slot, kv.check)
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
        kv.generation = meta.pool_generation
        kv.payload_len = payload_len
        kv.status = STATUS_OK
        kv.chunk_len = meta.pool_chunk_len
        meta.served = 1
