"""Host-port source guard, header validation and the writers ACL (p4/include/safety.p4, ``MyIngress.safety``)."""

from __future__ import annotations

from kvpool.contract import (
    ALLOW_WRITER,
    FABRIC_PORT,
    FRAG_PAYLOAD,
    GUARD_SOURCE,
    HOST_GUARD,
    KNOWN_FLAGS,
    KV_UDP_LEN_DATA,
    KV_UDP_LEN_NO_PAYLOAD,
    KVPOOL_VERSION,
    MAX_FRAG_INDEX,
    OP_DATA,
    OP_GET,
    OP_INVALIDATE,
    OP_MAX,
    OP_NACK,
    STATUS_MAX,
    STATUS_OK,
    WRITERS,
)
from kvpool.contract import DropReason as Drop
from switchmodel.parser import Meta, Packet
from switchmodel.v1model import M32, Control


class Safety(Control):
    """``control Safety``: spoofed sources drop, fabric ports are marked; the first failed check names the reason;
    writers get ``is_writer``."""

    def apply(self, pkt: Packet, meta: Meta) -> None:
        """``Safety.apply`` (IPv4 packets): source guard; for kvpool, validation (kvpool.wire's order) and writers."""
        ip = pkt.ipv4
        assert ip is not None
        guard = self.state.lookup(HOST_GUARD, (meta.ingress_port,), meta.packet_length)
        if guard.action == FABRIC_PORT:
            meta.from_fabric = 1
        elif guard.action == GUARD_SOURCE and ip.src != guard.params["addr"]:
            meta.drop_reason = Drop.SPOOFED
            return
        kv = pkt.kv
        if kv is None:
            return
        udp = pkt.udp
        assert udp is not None
        idx = kv.frag_index
        cnt = kv.frag_count
        frag = FRAG_PAYLOAD
        done = (idx * frag) & M32
        rest = (kv.chunk_len - done) & M32

        if kv.version != KVPOOL_VERSION:
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

        # A GET needs no writer: only fills (DATA), releases (DATA, NACK) and INVALIDATE ask.
        if meta.drop_reason == Drop.NONE and kv.opcode != OP_GET:
            res = self.state.lookup(WRITERS, (meta.ingress_port, ip.src), meta.packet_length)
            if res.action == ALLOW_WRITER:
                meta.is_writer = 1
            if kv.opcode == OP_INVALIDATE and meta.is_writer == 0:
                meta.drop_reason = Drop.NOT_WRITER
