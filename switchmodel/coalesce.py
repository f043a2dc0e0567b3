"""Coalescing of duplicate GETs and multicast of the answer (p4/include/coalesce.p4).

Two controls, as in the P4 file: :class:`Coalesce` (``MyIngress.coalesce``: pending slots,
waiter ids, the release) and :class:`CoalesceEgress` (``MyEgress.coalesce``: replica
pruning and rewrite, per-waiter reply records).  The pending slot of a fragment comes from
:func:`pending_index`, the program's ``hash`` through :mod:`switchmodel.hashes`, which
``tests/switchmodel/test_model_vs_build.py`` checks against the compiled ``p4/build/kvpool.json``.
"""

from __future__ import annotations

from kvpool.contract import (
    COALESCE_CONFIG,
    COALESCE_STATS,
    EGRESS_STATS,
    FLAG_COALESCED,
    FLAG_RETRANSMIT,
    MAX_WAITERS,
    OP_GET,
    OP_NACK,
    PENDING_KEY,
    PENDING_REPLY,
    PENDING_SLOTS,
    PENDING_SUB,
    PENDING_TS,
    PENDING_WAITERS,
    REWRITE_WAITER,
    SET_PENDING_TIMEOUT,
    SET_WAITER_ID,
    WAITER_EGRESS,
    WAITER_LOOKUP,
    WAITER_REPLICAS,
    coalesce_group,
)
from kvpool.contract import CoalesceStat as CoStat
from kvpool.contract import EgressStat as EgStat
from switchmodel import hashes
from switchmodel.parser import Kv, Meta, Packet
from switchmodel.v1model import M32, M48, Control, mark_to_drop


def pending_index(kv: Kv) -> int:
    """The chunk's pending slot: ``hash(crc32, 0, {chunk_key}, PENDING_SLOTS)``."""
    return hashes.crc32(kv.chunk_key.to_bytes(8, "big")) % PENDING_SLOTS


class Coalesce(Control):
    """``control Coalesce``: GETs join an answer in progress for their chunk; it is multicast."""

    def apply(self, pkt: Packet, meta: Meta) -> None:
        """``Coalesce.apply``: open, join or release the pending slot of a fragment."""
        kv, ip = pkt.kv, pkt.ipv4
        assert kv is not None and ip is not None
        cfg = self.state.lookup(COALESCE_CONFIG, (), meta.packet_length)
        if cfg.action == SET_PENDING_TIMEOUT:
            meta.pending_timeout = cfg.params["timeout_us"]
        meta.waiter_addr = ip.src if kv.opcode == OP_GET else ip.dst
        res = self.state.lookup(WAITER_LOOKUP, (meta.waiter_addr,), meta.packet_length)
        if res.action == SET_WAITER_ID:
            meta.has_waiter = 1
            meta.waiter_id = res.params["waiter_id"]
        if meta.waiter_id >= MAX_WAITERS:
            meta.has_waiter = 0

        meta.pending_idx = pending_index(kv)
        # {owner waiter id, the generation its GETs asked for}: GETs are coalesced only when
        # any answer to one answers all of them.
        sub = ((meta.waiter_id & 0xFFFF) << 32) | kv.generation
        slot_key = self._read(PENDING_KEY, meta.pending_idx)
        slot_sub = self._read(PENDING_SUB, meta.pending_idx)
        slot_ts = self._read(PENDING_TS, meta.pending_idx)
        slot_mask = self._read(PENDING_WAITERS, meta.pending_idx)
        # The P4 casts the shift amount to bit<8> (BMv2 shifts by at most 8 bits); a shift
        # by the full width or more gives 0.
        shift = meta.waiter_id & 0xFF
        me = (1 << shift) & M32 if shift < 32 else 0
        now = meta.ingress_timestamp
        same_chunk = slot_key == kv.chunk_key
        mine = slot_sub >> 32 == meta.waiter_id & 0xFFFF

        if kv.opcode == OP_GET:
            live = slot_mask != 0 and ((now - slot_ts) & M48) < meta.pending_timeout
            if meta.has_waiter == 0:
                self._count(COALESCE_STATS, CoStat.NO_WAITER_ID, meta)
            elif live and same_chunk and slot_sub & M32 == kv.generation:
                if mine:
                    self._write(PENDING_TS, meta.pending_idx, now)
                    meta.record_reply = 1
                    self._count(COALESCE_STATS, CoStat.OWNER, meta)
                elif kv.flags & FLAG_RETRANSMIT:
                    # What its sender missed: upstream, joining nothing (it would get the answer twice).
                    self._count(COALESCE_STATS, CoStat.RETRANSMIT, meta)
                else:
                    self._write(PENDING_WAITERS, meta.pending_idx, slot_mask | me)
                    meta.record_reply = 1
                    meta.absorb = 1
                    self._count(COALESCE_STATS, CoStat.ABSORBED, meta)
            elif live and same_chunk:
                self._count(COALESCE_STATS, CoStat.OTHER_GENERATION, meta)
            elif live:
                self._count(COALESCE_STATS, CoStat.COLLISION, meta)
            elif kv.flags & FLAG_RETRANSMIT:
                # It asks for a run, not up to the chunk's last fragment (which ends a slot):
                # a slot it opened would hold its joiners until the slot timed out.
                self._count(COALESCE_STATS, CoStat.RETRANSMIT, meta)
            else:
                if slot_mask != 0:
                    self._count(COALESCE_STATS, CoStat.EXPIRED_REUSED, meta)
                self._write(PENDING_KEY, meta.pending_idx, kv.chunk_key)
                self._write(PENDING_SUB, meta.pending_idx, sub)
                self._write(PENDING_TS, meta.pending_idx, now)
                self._write(PENDING_WAITERS, meta.pending_idx, me)
                meta.record_reply = 1
                self._count(COALESCE_STATS, CoStat.FIRST, meta)
        elif (meta.has_waiter == 1 and same_chunk and mine and slot_mask
                and (slot_sub & M32 == 0 or slot_sub & M32 == kv.generation)):
            # DATA or NACK from a writer answering the slot's owner.
            over = kv.opcode == OP_NACK or (kv.frag_index + 1) & 0xFFFF == kv.frag_count
            if over:
                self._write(PENDING_WAITERS, meta.pending_idx, 0)  # the answer is over
            if slot_mask != me:
                if not over:
                    self._write(PENDING_TS, meta.pending_idx, now)
                meta.release = 1
                meta.release_mask = slot_mask
                meta.release_dst = meta.waiter_id
                meta.mcast_grp = coalesce_group(slot_mask)  # the highest waiter id's group
                self._count(COALESCE_STATS, CoStat.RELEASE, meta)
            # Its owner alone waits: forwarded as any packet, nothing else done.


class CoalesceEgress(Control):
    """``control CoalesceEgress``: each release replica gets its waiter's address and request id."""

    def apply(self, pkt: Packet, meta: Meta) -> None:
        """``CoalesceEgress.apply``: prune and rewrite release replicas; record a waiting GET's reply."""
        kv = pkt.kv
        if meta.release == 1:
            assert kv is not None and pkt.udp is not None and pkt.ipv4 is not None
            rid = meta.egress_rid
            if rid >= MAX_WAITERS or not meta.release_mask & (1 << (rid & 0xFF)):
                mark_to_drop(meta)
                self._count(EGRESS_STATS, EgStat.REPLICA_PRUNED, meta)
                return
            res = self.state.lookup(WAITER_EGRESS, (rid,), meta.packet_length)
            if not res.hit:
                mark_to_drop(meta)
                self._count(EGRESS_STATS, EgStat.NO_WAITER_ENTRY, meta)
                return
            if res.action == REWRITE_WAITER:
                pkt.ipv4.dst = res.params["addr"]
                pkt.eth_dst = res.params["mac"]
            if rid != meta.release_dst:
                # Another waiter's copy: its own request id and port (the owner's leaves as sent).
                reply = self._read(PENDING_REPLY, (meta.pending_idx * MAX_WAITERS + rid) & M32)
                kv.request_id = reply >> 16
                pkt.udp[1] = reply & 0xFFFF
                kv.flags |= FLAG_COALESCED
                pkt.udp[3] = 0
            self._count(WAITER_REPLICAS, rid, meta)
            self._count(EGRESS_STATS, EgStat.REPLICA_SENT, meta)
        elif meta.record_reply == 1:
            assert kv is not None and pkt.udp is not None
            self._write(PENDING_REPLY, (meta.pending_idx * MAX_WAITERS + meta.waiter_id) & M32,
                        (kv.request_id << 16) | pkt.udp[0])
            self._count(EGRESS_STATS, EgStat.REPLY_RECORDED, meta)
            if meta.absorb == 1:
                mark_to_drop(meta)
