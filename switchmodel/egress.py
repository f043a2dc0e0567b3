"""MyEgress (p4/include/egress.p4): per-replica work after the packet replication engine."""

from __future__ import annotations

from switchmodel.coalesce import CoalesceEgress
from switchmodel.parser import Meta, Packet
from switchmodel.v1model import Externs, mark_to_drop


class Egress:
    """``control MyEgress``: a flooded copy never returns to its ingress port; the rest is coalescing."""

    def __init__(self, ext: Externs) -> None:
        self.coalesce = CoalesceEgress(ext)

    def apply(self, pkt: Packet, meta: Meta) -> None:
        """``MyEgress.apply``."""
        if meta.flood == 1 and meta.egress_port == meta.ingress_port:
            mark_to_drop(meta)
        else:
            self.coalesce.apply(pkt, meta)
