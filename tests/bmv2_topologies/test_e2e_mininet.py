"""End to end in Mininet: real agents in three hosts, the switch target, the controller.

On a star of three requesters: one chunk fetched by all of them at once leaves the holder
once per fragment (coalescing + multicast); once the controller has admitted it, the
answers that cross the switch fill it (or the holder's push does), the next fetches are
answered by the switch, and once filled no GET reaches the holder; every host gets the
holder's exact bytes, which deserialize to the original tensor. Needs root and Mininet.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bmv2_topologies.network import mininet_available

REASON = mininet_available()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(REASON is not None, reason=str(REASON))]


def test_coalesce_then_serve_from_the_switch(tmp_path: Path) -> None:
    import torch

    from bmv2_topologies.experiment.capture import holder_traffic, kvpool_packets
    from bmv2_topologies.experiment.config import DemoConfig
    from bmv2_topologies.experiment.testbed import Testbed
    from bmv2_topologies.experiment.workload import Workload, build_workload
    from hostagent.client import AgentClient
    from hostagent.serialize import deserialize
    from kvpool import wire
    from tests.bmv2_topologies.frozen import run_with_holder_frozen

    cfg = DemoConfig(requesters=3, waves=2, hot_blocks=1, tail_blocks=0, wave_gap_ms=4000, holder_mbps=100,
                     out=tmp_path, modes=("multicast", "pool"))
    workload = build_workload(cfg)
    (key,) = workload.blobs
    frags = wire.fragment_count(len(workload.blobs[key]))
    first_wave = Workload([r for r in workload.requests if r.at_s == 0], workload.blobs, workload.parents,
                          workload.positions)
    assert len(first_wave.requests) == 3

    bed = Testbed(cfg, first_wave)
    with bed.running():
        holder = bed.topo.holders()[0].address
        # 1. Three requesters at once, coalescing on: each fragment leaves the holder once.
        # "At once" is made exact: the holder agent is frozen while the three requesters'
        # first windows of GETs reach the switch (well under their 1 s retransmit timeout),
        # so every duplicate GET finds its fragment pending; after that the multicast
        # answers keep the three in step.
        mc = run_with_holder_frozen(bed, "multicast")
        assert (mc.requests, mc.failed) == (3, 0)
        traffic = holder_traffic(mc.pcaps["h0"], holder, mc.window)
        sent: dict[tuple[int, int], int] = {}
        for (k, i, _dst), n in traffic.data_out.items():
            sent[(k, i)] = sent.get((k, i), 0) + n
        assert sorted(sent) == [(key, i) for i in range(frags)]
        # Without coalescing: 3 * frags (420).  The switch keeps one pending slot per chunk: the
        # first range GET goes to the holder, the other two join its answer and get a copy of
        # every fragment, so each leaves the holder once.  A requester whose GET reached the
        # switch after some fragments passed asks the holder for those again; the holder
        # frozen, none did in any run here, and a scheduler hiccup costs a few, never a copy.
        assert all(n >= 1 for n in sent.values())
        assert sum(sent.values()) <= frags + frags // 4, f"{sum(sent.values())} sends for {frags} fragments"
        # The other requesters' GETs joined the first one's answer in the switch.
        assert mc.coalesced >= 2, mc.coalesced

        # 2. Pool mode, three waves 4 s apart (the first 0.5 s into the window).  The first is
        # coalesced and makes the chunk hot; the controller admits it and every answer that
        # crosses the switch after the admission fills its slot (nothing is pushed).  How much
        # of the first wave that is depends on the target's pace: the model's wave outlasts
        # the admission, BMv2 (1.15.5) answers a 140-fragment wave in ~0.15-0.35 s, before its
        # admission ~0.3 s in.  The second wave asks for the pooled chunk with single GETs with
        # reply room: the switch serves what is filled, and each fragment left unfilled goes to
        # the holder at most once per requester (single GETs are never held in a pending slot:
        # p4/include/coalesce.p4), filling on the way; the third is all hits.
        bed.workload = build_workload(dataclasses.replace(cfg, waves=3))
        assert (len(bed.workload.requests), bed.workload.blobs) == (9, workload.blobs)
        pool = bed.run_mode("pool")
        assert (pool.requests, pool.failed, pool.admitted) == (9, 0, 1)
        traffic = holder_traffic(pool.pcaps["h0"], holder, pool.window)
        assert not [k for k in traffic.data_out if k[2] == "10.0.0.254"]  # no push to the fill sink
        start = pool.window[0] + 0.5 - 0.2

        def sent_in_wave(wave: int) -> tuple[int, dict[int, int], dict[int, int]]:
            """GETs in, DATA sent per fragment, and re-asks (RETRANSMIT GETs) per fragment."""
            lo = start + 4.0 * wave
            window = (lo, lo + 4.0 if wave < 2 else pool.window[1])
            later = holder_traffic(pool.pcaps["h0"], holder, window)
            sent: dict[int, int] = {}
            for (_k, i, _dst), n in later.data_out.items():
                sent[i] = sent.get(i, 0) + n
            # A requester that joined another's answer late re-asks what passed before it
            # joined (RETRANSMIT | COALESCED), as does one whose timer fired on a loaded
            # machine; the holder answers a re-ask once more, to the answer's destination.
            reasked: dict[int, int] = {}
            for p in kvpool_packets(pool.pcaps["h0"], window):
                if p.dst == holder and p.header.opcode == wire.Opcode.GET and p.header.flags & wire.Flag.RETRANSMIT:
                    for i in range(p.header.frag_index, p.header.frag_index + p.header.frag_count):
                        reasked[i] = reasked.get(i, 0) + 1
            return later.gets_in, sent, reasked

        _, again, reasked = sent_in_wave(1)
        # At most once per requester, and once more per re-ask the holder saw.
        assert all(n <= 3 + reasked.get(i, 0) for i, n in again.items()), (again, reasked)
        gets_in, last, _ = sent_in_wave(2)
        assert (gets_in, last) == (0, {})  # every fragment filled: the third wave is all hits
        assert pool.switch_served >= 3 * frags + 3 * (frags - len(again)), (pool.switch_served, len(again))

        # 2b. The same with the holder asked to push each admitted chunk: the push fills what no
        # answer carried past the switch since the admission, and the second wave is all hits.
        bed.workload, bed.cfg = workload, dataclasses.replace(bed.cfg, push_admitted=True)
        pool = bed.run_mode("pool")
        assert (pool.requests, pool.failed, pool.admitted) == (6, 0, 1)
        assert pool.switch_served >= 3 * frags  # all of wave 2 (and wave 1 GETs after the fill)
        traffic = holder_traffic(pool.pcaps["h0"], holder, pool.window)
        to_sink = sum(n for (_k, _i, dst), n in traffic.data_out.items() if dst == "10.0.0.254")
        assert to_sink <= frags  # at most one copy of each fragment
        wave2 = (pool.window[0] + 0.5 + 4.0 - 0.2, pool.window[1])
        later = holder_traffic(pool.pcaps["h0"], holder, wave2)
        assert later.gets_in == 0
        assert not [k for k in later.data_out if k[2] != "10.0.0.254"]

        # 3. Bit-identical: what a requester receives deserializes to the holder's tensor.
        keys, blobs, _ = AgentClient(bed.api("h2")).fetch_chunks([key], f"{holder}:7470", local=False)
        assert keys == [key]
        assert torch.equal(deserialize(bytearray(blobs[0])), deserialize(bytearray(workload.blobs[key])))
