"""The model's data plane as ``kvpool-switch`` runs it: pipeline + ports from CLI options.

``--interface 1@s1-eth1 --interface 2@s1-eth2`` (or ``-i``) binds switch ports to Linux
interfaces like simple_switch's ``-i``; the pipeline runs every frame read from them
against the switch state the P4Runtime server writes.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from switchmodel.pipeline import KvpoolPipeline
from switchmodel.ports import PortError, PortIO, PortSpec, check_unique, disable_offloads
from switchmodel.state import SwitchState

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the packet-I/O options on ``parser``."""
    parser.add_argument("-i", "--interface", action="append", default=[], metavar="PORT@IFNAME",
                        help="bind switch port PORT to Linux interface IFNAME (repeat per port), "
                             "like simple_switch's -i; e.g. -i 1@s1-eth1 -i 2@s1-eth2")
    parser.add_argument("--keep-offloads", action="store_true",
                        help="leave checksum/segmentation offloads on the interfaces as they are "
                             "(default: turn them off, as BMv2 setups must)")


def port_specs(args: argparse.Namespace) -> list[PortSpec]:
    """The ``--interface`` options as port specs; ``ValueError`` with a one-line message if bad."""
    specs = [PortSpec.parse(text) for text in args.interface]
    check_unique(specs)
    return specs


@dataclass
class DataPlane:
    """A running pipeline and, if any interfaces were given, its port loop."""

    pipeline: KvpoolPipeline
    ports: PortIO | None

    def stop(self) -> None:
        """Stop the port loop and close the sockets."""
        if self.ports is not None:
            self.ports.close()


def start(state: SwitchState, specs: Sequence[PortSpec], keep_offloads: bool = False) -> DataPlane:
    """Build the pipeline on ``state`` and start forwarding between ``specs``; ``PortError`` if one fails."""
    pipeline = KvpoolPipeline(state)
    if not specs:
        return DataPlane(pipeline, None)
    if not keep_offloads:
        for spec in specs:
            disable_offloads(spec.ifname)
    ports = PortIO(specs, pipeline)
    try:
        ports.open()
    except PortError:
        ports.close()
        raise
    ports.start()
    log.info("forwarding between %s", ", ".join(f"{s.port}@{s.ifname}" for s in specs))
    return DataPlane(pipeline, ports)
