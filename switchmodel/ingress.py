"""MyIngress (p4/include/ingress.p4): the order of the concerns and the accounting of every drop.

1. parser error -> ``PARSE_ERROR``; IPv4 checksum error -> ``BAD_CHECKSUM``;
2. IPv4: :class:`~switchmodel.safety.Safety` (source guard; kvpool header checks, writers);
3. :class:`~switchmodel.pool.Pool`;
4. GET not served that did not come from a fabric port: :class:`~switchmodel.popularity.Popularity`;
   range GET not served, or DATA/NACK from a writer: :class:`~switchmodel.coalesce.Coalesce`;
5. absorbed GET -> egress; otherwise TTL and, unless released by multicast (to more than its addressee),
   :class:`~switchmodel.forwarding.Forwarding`;
6. a drop reason set -> counted in ``drop_reason``, ``mark_to_drop``.
"""

from __future__ import annotations

from kvpool.contract import DROP_REASON, OP_DATA, OP_GET, OP_NACK
from kvpool.contract import DropReason as Drop
from switchmodel.coalesce import Coalesce
from switchmodel.forwarding import Forwarding
from switchmodel.parser import Meta, Packet
from switchmodel.pool import Pool
from switchmodel.popularity import Popularity
from switchmodel.safety import Safety
from switchmodel.v1model import Externs, mark_to_drop


class Ingress:
    """``control MyIngress``: its controls in the order the P4 program applies them."""

    def __init__(self, ext: Externs) -> None:
        self._count = ext.count
        self.safety = Safety(ext)
        self.pool = Pool(ext)
        self.popularity = Popularity(ext)
        self.coalesce = Coalesce(ext)
        self.fwd = Forwarding(ext)

    def apply(self, pkt: Packet, meta: Meta, checksum_error: bool) -> None:
        """``MyIngress.apply``; ``checksum_error`` is ``standard_metadata.checksum_error``."""
        kv = pkt.kv
        if pkt.parser_error:
            meta.drop_reason = Drop.PARSE_ERROR
        elif checksum_error:
            meta.drop_reason = Drop.BAD_CHECKSUM
        elif pkt.ipv4 is not None:
            self.safety.apply(pkt, meta)

        if meta.drop_reason == Drop.NONE and kv is not None:
            self.pool.apply(pkt, meta)
            if meta.drop_reason == Drop.NONE and meta.served == 0:
                is_get = kv.opcode == OP_GET
                # Single-fragment GETs (the pool's) are never held for another's answer: theirs come
                # from a pool and the holder out of order, and an early last fragment ends a slot.
                range_get = is_get and kv.frag_count > 1
                response = (kv.opcode in (OP_DATA, OP_NACK)) and meta.is_writer == 1
                if is_get and meta.from_fabric == 0:
                    self.popularity.apply(pkt, meta)
                if range_get or response:
                    self.coalesce.apply(pkt, meta)

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
                    self.fwd.apply(pkt, meta)

        if meta.drop_reason != Drop.NONE:
            self._count(DROP_REASON, meta.drop_reason, meta)
            mark_to_drop(meta)
