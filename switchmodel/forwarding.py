"""IPv4 routes and ARP (p4/include/forwarding.p4, ``MyIngress.fwd``)."""

from __future__ import annotations

from kvpool.contract import ARP_FLOOD, ARP_FORWARD, ARP_UNICAST, DROP_NO_ROUTE, IPV4_FORWARD, IPV4_ROUTE
from kvpool.contract import DropReason as Drop
from switchmodel.parser import ARP_TPA, Meta, Packet
from switchmodel.v1model import Control


class Forwarding(Control):
    """``control Forwarding``: sets the egress port (and next-hop MAC), a flood group, or a drop reason."""

    def apply(self, pkt: Packet, meta: Meta) -> None:
        """``Forwarding.apply``: IPv4 by longest prefix, ARP by target address, anything else dropped."""
        if pkt.ipv4 is not None:
            res = self.state.lookup(IPV4_ROUTE, (pkt.ipv4.dst,), meta.packet_length)
            if res.action == IPV4_FORWARD:
                meta.egress_spec = res.params["port"]
                pkt.eth_dst = res.params["dst_mac"]
            elif res.action == DROP_NO_ROUTE:
                meta.drop_reason = Drop.NO_ROUTE
        elif pkt.arp is not None:
            (tpa,) = ARP_TPA.unpack_from(pkt.arp, 24)
            res = self.state.lookup(ARP_FORWARD, (tpa,), meta.packet_length)
            if res.action == ARP_UNICAST:
                meta.egress_spec = res.params["port"]
            elif res.action == ARP_FLOOD:
                meta.mcast_grp = res.params["mcast_grp"]
                meta.flood = 1
            elif res.action == DROP_NO_ROUTE:
                meta.drop_reason = Drop.NO_ROUTE
        else:
            meta.drop_reason = Drop.UNHANDLED
