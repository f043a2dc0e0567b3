"""P4Runtime driver: the controller's connection to one switch (BMv2 or the model).

Callers speak names (tables, match fields, actions, parameters, counters, digests from the
P4Info) and plain values (ints, IP/MAC strings); the driver encodes them to the widths the
P4Info gives and ships batched P4Runtime writes. It keeps the *intended* state (entries,
default actions, multicast groups, digest config) and, after a dropped channel or a
restarted switch, reconnects (with backoff, for ever), pushes the pipeline if the switch
lost it and makes the switch match the intended state again (read, diff, write).
:meth:`P4RuntimeSwitch.health` says whether the switch is up, down since when, resyncing,
and the last error.

One module per concern: :mod:`.errors` (what fails and how), :mod:`.entities` (entries,
digests, packet-ins, the intended state), :mod:`.session` (channel, stream, arbitration,
reconnects, switch instances), :mod:`.writes`, :mod:`.reads`, and :mod:`.switch`
(:class:`P4RuntimeSwitch`: pipeline push and resync). This package is the public import
path: everything a caller needs is re-exported here.

Typical use::

    sw = P4RuntimeSwitch("127.0.0.1:9559", p4info="p4/build/kvpool.p4info.txtpb",
                         device_config="p4/build/kvpool.json")
    sw.connect()                      # arbitration + pipeline push + resync
    sw.insert_entries([Entry("MyIngress.fwd", {"hdr.ipv4.dstAddr": "10.0.0.2"},
                             "MyIngress.forward", {"port": 2})])
    sw.set_multicast_group(7, [(1, 0), (2, 1)])
    sw.configure_digest("hot_key_digest_t", max_list_size=16)
    digest = sw.digests.get(timeout=1)  # acked automatically
"""

from controller.p4runtime.entities import Digest, Entry, PacketIn
from controller.p4runtime.errors import (
    NoPipelineError,
    NotMasterError,
    P4RuntimeCallError,
    P4RuntimeError,
    SwitchUnreachableError,
    UpdateError,
    WriteError,
)
from controller.p4runtime.session import NONCE_BITS, channel_options, make_cookie, pipeline_id
from controller.p4runtime.switch import P4RuntimeSwitch, connected

# The value types both ends exchange live in the codec: one definition for the driver and the switch.
from kvpool.p4rt.codec import CounterValue, DigestConfig

__all__ = [
    "NONCE_BITS",
    "CounterValue",
    "Digest",
    "DigestConfig",
    "Entry",
    "NoPipelineError",
    "NotMasterError",
    "P4RuntimeCallError",
    "P4RuntimeError",
    "P4RuntimeSwitch",
    "PacketIn",
    "SwitchUnreachableError",
    "UpdateError",
    "WriteError",
    "channel_options",
    "connected",
    "make_cookie",
    "pipeline_id",
]
