"""Chunk lookup, hits from register memory, fill on pass, generations (p4/include/pool.p4, ``MyIngress.pool``)."""

from __future__ import annotations

from collections.abc import Mapping

from kvpool.contract import (
    CHUNK_GEN,
    CHUNK_GEN_KEY,
    FLAG_NO_CACHE,
    FLAG_SWITCH_SERVED,
    FRAG_PAYLOAD,
    KV_IPV4_LEN_DATA,
    KV_IPV4_LEN_NO_PAYLOAD,
    KV_UDP_LEN_DATA,
    KV_UDP_LEN_NO_PAYLOAD,
    OP_DATA,
    OP_GET,
    OP_INVALIDATE,
    POOL_ENTRY,
    POOL_LOOKUP,
    POOL_SLOTS,
    POOL_STATS,
    SLICE_BYTES,
    SLICES,
    SLOT_FILLS,
    SLOT_GEN,
    SLOT_HITS,
    SLOT_KEY,
    SLOT_VALID,
    STATUS_OK,
    SWITCH_REPLY_TTL,
    PoolStat,
    PoolState,
)
from kvpool.contract import DropReason as Drop
from switchmodel.parser import Kv, Meta, Packet
from switchmodel.v1model import M32, Control

POOL_STATE_FILLING = int(PoolState.FILLING)
POOL_STATE_VALID = int(PoolState.VALID)


class Pool(Control):
    """``control Pool``: the paged pool in registers (slices + slot tags) and per-chunk generations."""

    def apply(self, pkt: Packet, meta: Meta) -> None:
        """``Pool.apply``: lookup; a hit serves, fills or invalidates; unanswered reply room is stripped."""
        kv = pkt.kv
        assert kv is not None
        res = self.state.lookup(POOL_LOOKUP, (kv.chunk_key,), meta.packet_length)
        if res.hit:
            self._pool_hit(pkt, meta, res.action, res.params)
        else:
            self._count(POOL_STATS, PoolStat.LOOKUP_MISS, meta)
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
        if action == POOL_ENTRY:
            p = params
            meta.pool_found = 1
            meta.base_slot = p["base_slot"]
            meta.pool_frag_count = p["frag_count"]
            meta.pool_chunk_len = p["chunk_len"]
            meta.pool_generation = p["generation"]
            meta.pool_state = p["state"]

        gen_key = self._read(CHUNK_GEN_KEY, meta.base_slot)
        gen_val = self._read(CHUNK_GEN, meta.base_slot)
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
                self._count(POOL_STATS, PoolStat.BYPASS, meta)
            elif not slot_ok:
                self._count(POOL_STATS, PoolStat.SLOT_RANGE, meta)
            elif pkt.payload is None:
                self._count(POOL_STATS, PoolStat.NO_ROOM, meta)
            elif self._slot_current(slot, kv.chunk_key, meta.cur_generation):
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
            elif kv.frag_count != meta.pool_frag_count or kv.chunk_len != meta.pool_chunk_len:
                meta.drop_reason = Drop.FILL_MISMATCH
            elif kv.generation < meta.cur_generation:
                self._count(POOL_STATS, PoolStat.FILL_STALE, meta)
            else:
                if kv.generation > meta.cur_generation:
                    self._advance_generation(kv, meta, kv.generation)
                    self._count(POOL_STATS, PoolStat.INVALIDATE, meta)
                if not usable:
                    pass  # disabled entry: the DATA passes, nothing is remembered
                elif not slot_ok:
                    self._count(POOL_STATS, PoolStat.SLOT_RANGE, meta)
                else:
                    current = (meta.pool_state == POOL_STATE_VALID
                               and self._slot_current(slot, kv.chunk_key, meta.cur_generation))
                    if current:
                        self._count(POOL_STATS, PoolStat.FILL_SKIPPED, meta)
                    else:
                        self._write_slot(pkt, meta, slot)
                        self._count(SLOT_FILLS, slot, meta)
                        self._count(POOL_STATS, PoolStat.FILL, meta)
        elif kv.opcode == OP_INVALIDATE:
            if kv.generation > meta.cur_generation:
                self._advance_generation(kv, meta, kv.generation)
                self._count(POOL_STATS, PoolStat.INVALIDATE, meta)
            else:
                self._count(POOL_STATS, PoolStat.INVALIDATE_STALE, meta)

    def _slot_current(self, slot: int, chunk_key: int, generation: int) -> bool:
        """The slot's tag says: written, this chunk, this generation."""
        valid = self._read(SLOT_VALID, slot)
        key = self._read(SLOT_KEY, slot)
        gen = self._read(SLOT_GEN, slot)
        return valid == 1 and key == chunk_key and gen == generation

    def _advance_generation(self, kv: Kv, meta: Meta, generation: int) -> None:
        """Action ``advance_generation``."""
        self._write(CHUNK_GEN, meta.base_slot, generation)
        self._write(CHUNK_GEN_KEY, meta.base_slot, kv.chunk_key)
        meta.cur_generation = generation

    def _write_slot(self, pkt: Packet, meta: Meta, slot: int) -> None:
        """Action ``write_slot``: 11 slices and the slot's tag."""
        kv = pkt.kv
        assert kv is not None and pkt.payload is not None
        for reg, chunk in zip(SLICES, pkt.payload, strict=True):
            self._write(reg, slot, int.from_bytes(chunk, "big"))
        self._write(SLOT_KEY, slot, kv.chunk_key)
        self._write(SLOT_GEN, slot, meta.cur_generation)
        self._write(SLOT_VALID, slot, 1)

    def _serve(self, pkt: Packet, meta: Meta, slot: int, payload_len: int) -> None:
        """Action ``serve``: the GET becomes the DATA reply in place."""
        kv, ip, udp = pkt.kv, pkt.ipv4, pkt.udp
        assert kv is not None and ip is not None and udp is not None
        # The reply room (valid slices) receives the fragment: the packet does not grow.
        pkt.payload = [self._read(reg, slot).to_bytes(SLICE_BYTES, "big") for reg in SLICES]
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
