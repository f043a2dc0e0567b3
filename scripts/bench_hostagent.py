"""Host-agent data-path benchmark: how close fragmentation and reassembly get to a memcpy.

Every figure is a ratio against a plain numpy copy of the same bytes measured in the
same run, so machines and noise cancel out.  The script is a list of sections
(``SECTIONS``); each returns a table and ``name=value`` summary lines, printed at the
end so a harness can grep them.  Add a section by writing a function with the
``SectionFn`` signature and listing it in ``SECTIONS``.

Run ``python scripts/bench_hostagent.py --help``.
"""

from __future__ import annotations

import argparse
import os
import runpy
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from hostagent import envelope
from hostagent.fragment import Reassembler, empty_records, fragment_checks, fragment_into
from hostagent.holder import Holder
from hostagent.serialize import Quant, deserialize, header_len, serialize, serialize_into, serialized_size, tensor_bytes
from hostagent.tiers import HostTier, TieredStore
from kvpool import wire
from kvpool.report import save_table

MIB = 1 << 20
REFS: dict[str, Any] = runpy.run_path(str(Path(__file__).with_name("bench_refs.py")))
"""Same-run yardsticks (``scripts/bench_refs.py``): Mooncake's own get, HTTP bodies over a plain socket."""
BEFORE_REV = "51f67d3b6cf47220ec45e9ef6eb2fc227395d07a"
"""main before issue 46: the agent's API on the hand-written server and client (``kvpool/httpjson.py``)."""


@dataclass
class Section:
    """One benchmark section's output: a table and its summary ``name=value`` lines."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


SectionFn = Callable[[argparse.Namespace], Section]


def _timed(steps: dict[str, Callable[[], object]], reps: int) -> dict[str, list[float]]:
    """Wall times of each step over ``reps`` rounds, the steps interleaved within a round.

    Interleaving puts every step under the same background load, so the ratios hold on
    a busy machine; one untimed warm-up round first takes page faults and cold caches.
    """
    for fn in steps.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(reps):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def _row(name: str, times: list[float], nbytes: int, base: float) -> list[str]:
    """Table row: best and median time, best GB/s, and best time relative to the base."""
    best, med = min(times), statistics.median(times)
    return [name, f"{best * 1e3:9.2f}", f"{med * 1e3:9.2f}", f"{nbytes / best / 1e9:7.2f}", f"{best / base:6.2f}x"]


_COLUMNS = ["step", "best ms", "median ms", "GB/s", "vs memcpy"]


def _progress(msg: str) -> None:
    """Progress to stderr so stdout stays a clean table."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _chunk_set(args: argparse.Namespace) -> tuple[list[npt.NDArray[np.uint8]], int]:
    """``--mib`` MiB as serialized chunks of ``--chunk-kib`` KiB each (random bytes in a uint8 tensor).

    Serialized, as agents carry them: a receiver checks such a chunk as a whole with the
    checksum it carries.
    """
    chunk_len = args.chunk_kib * 1024
    count = max(1, args.mib * MIB // chunk_len)
    gen = torch.Generator().manual_seed(0)
    numel = chunk_len - header_len(1)
    chunks = []
    for _ in range(count):
        blob = serialize(torch.randint(0, 256, (numel,), dtype=torch.uint8, generator=gen))
        arr = np.empty(chunk_len, dtype=np.uint8)  # numpy's own (aligned) memory, as memcpy's source
        arr[:] = np.frombuffer(blob, dtype=np.uint8)
        chunks.append(arr)
    return chunks, chunk_len


def bench_fragment_reassemble(args: argparse.Namespace) -> Section:
    """Answer every chunk as DATA records, then reassemble and verify them all, vs memcpy."""
    chunks, chunk_len = _chunk_set(args)
    n_frag = wire.fragment_count(chunk_len)
    total = len(chunks) * chunk_len
    _progress(f"fragment/reassemble: {len(chunks)} chunks x {chunk_len} B, {args.reps} reps")
    count = len(chunks)
    built = [empty_records(n_frag) for _ in chunks]
    # Caller-provided, chunk-sized receive buffers, as a receiver reassembling in place.
    dests = [np.empty(chunk_len, dtype=np.uint8) for _ in chunks]
    copies = [np.empty(chunk_len, dtype=np.uint8) for _ in chunks]
    # The holder a transport answers GETs from, over an agent's DRAM tier holding the same
    # chunks (handed over, not copied), with room to keep the records of all of them.
    store = TieredStore([HostTier(2 * total)])
    for i, c in enumerate(chunks):
        store.put(i + 1, c.data, generation=1, copy=False)
    holder = Holder(store, max_fragments_per_get=n_frag,
                    record_cache_bytes=2 * count * n_frag * wire.DATA_DATAGRAM_LEN)
    answers: list[npt.NDArray[np.void]] = [built[i] for i in range(count)]
    rid = [0]

    def memcpy(i: int) -> None:
        np.copyto(copies[i], chunks[i])

    # A holder computes every fragment's check once per chunk and generation and keeps them
    # (hostagent.holder); building an answer then copies them into the headers.
    checks = [fragment_checks(c, i + 1, generation=1) for i, c in enumerate(chunks)]

    def build(i: int) -> None:
        fragment_into(built[i], chunks[i], i + 1, generation=1, checks=checks[i])

    def answer(i: int) -> None:
        # What the transport does for a GET of the whole chunk: the holder answers from the
        # records it keeps, this GET's request id and flags written in.
        out = holder.serve(i + 1, 0, n_frag, request_id=rid[0], flags=0)
        assert not isinstance(out, wire.Status)
        answers[i] = out

    def reasm(i: int) -> None:
        # What the transport does for a chunk: reassemble, then check it before handing it out.
        r = Reassembler(i + 1, chunk_len, generation=1, buffer=dests[i])
        r.add_batch(answers[i])
        if not r.complete:
            raise RuntimeError(f"chunk {i} incomplete after its full batch")
        if not envelope.verify(r.buffer):
            raise RuntimeError(f"chunk {i} failed its checksum")

    steps = {"memcpy": memcpy, "answer": answer, "reassemble": reasm, "build": build}
    # ns[step][rep, chunk]: each step runs over all chunks in a loop of its own (so each
    # sees the cache state a real sender or receiver would), the steps alternate per rep.
    ns = {name: np.zeros((args.reps, count), dtype=np.int64) for name in steps}
    for rep in range(-1, args.reps):  # rep -1 is an untimed warm-up (page faults, kept records built)
        rid[0] = rep + 2
        for name, step in steps.items():
            for i in range(count):
                t0 = time.perf_counter_ns()
                step(i)
                if rep >= 0:
                    ns[name][rep, i] = time.perf_counter_ns() - t0
    # Once per chunk at a holder (and at a receiver only after a failed chunk check): timed
    # on its own, after the steps above, so it does not change the caches they see.
    ns["checks"] = np.zeros((args.reps, count), dtype=np.int64)
    for rep in range(args.reps):
        for i in range(count):
            t0 = time.perf_counter_ns()
            fragment_checks(chunks[i], i + 1, generation=1)
            ns["checks"][rep, i] = time.perf_counter_ns() - t0
    # The benchmark must not be measuring a broken pipeline.
    if holder.records_built != count:
        raise RuntimeError(f"the holder built records {holder.records_built} times for {count} chunks")
    for i, (src, dst) in enumerate(zip(chunks, dests, strict=True)):
        if not np.array_equal(src, dst):
            raise RuntimeError("reassembled bytes differ from the source")
        answer_rid0 = answers[i].copy()
        answer_rid0["hdr"]["request_id"] = 0
        if answer_rid0.tobytes() != built[i].tobytes() or not (answers[i]["hdr"]["request_id"] == rid[0]).all():
            raise RuntimeError(f"chunk {i}: the holder's answer differs from fragment_into's records")
    rounds = {name: list(a.sum(axis=1) / 1e9) for name, a in ns.items()}
    t_copy = rounds["memcpy"]
    t_both = [f + r for f, r in zip(rounds["answer"], rounds["reassemble"], strict=True)]
    t_cold = [f + r for f, r in zip(rounds["build"], rounds["reassemble"], strict=True)]
    # Per-chunk best: the sum over chunks of each chunk's fastest rep.  On a shared machine
    # this filters out preemptions that hit a whole round, for every step alike.
    floor = {name: float(a.min(axis=0).sum()) / 1e9 for name, a in ns.items()}
    floor["answer + reassemble"] = floor["answer"] + floor["reassemble"]
    floor["build + reassemble"] = floor["build"] + floor["reassemble"]
    rounds["answer + reassemble"], rounds["build + reassemble"] = t_both, t_cold
    base = min(t_copy)
    sec = Section(f"fragment + reassemble, {total / MIB:.0f} MiB as {count} chunks of "
                  f"{chunk_len} B ({n_frag} DATA records of {wire.DATA_DATAGRAM_LEN} B each)",
                  ["step", "best round ms", "median round ms", "per-chunk best ms", "GB/s", "vs memcpy"])
    labels = {"memcpy": "memcpy (np.copyto, same bytes)",
              "answer": "Holder.serve from kept records",
              "reassemble": "Reassembler.add_batch + chunk check",
              "answer + reassemble": "answer + reassemble (headline)",
              "build": "fragment_into (not kept: builds them)",
              "build + reassemble": "fragment_into + reassemble",
              "checks": "fragment_checks (once per chunk)"}
    for name, label in labels.items():
        best = floor[name]
        times = rounds[name]
        sec.rows.append([label, f"{min(times) * 1e3:.2f}", f"{statistics.median(times) * 1e3:.2f}",
                         f"{best * 1e3:.2f}", f"{total / best / 1e9:.2f}", f"{best / floor['memcpy']:.2f}x"])
    headline = floor["answer + reassemble"] / floor["memcpy"]
    cold = floor["build + reassemble"] / floor["memcpy"]
    sec.notes = [
        "per chunk: the holder answers a GET for the whole chunk from the DATA records it keeps",
        "(hostagent.holder: built once per chunk content and generation, each answer a view with",
        "its request id and flags written in); a new Reassembler checks all records with",
        "array-wide compares and copies the payloads into a caller buffer, then the chunk is checked",
        "as a whole (one xxh3 pass, hostagent.envelope): one copy and one hash pass against",
        "memcpy's one copy.  fragment_into is what a chunk whose records are not kept costs (its",
        "first answer, or one over the holder's record budget): a second copy.  fragment_checks",
        "(one xxh3 call per fragment) runs once per chunk and generation at a holder, and at a",
        "receiver only for a chunk that failed its whole check.  Steps alternate per rep.",
        f"(answer + reassemble) / memcpy: best rounds {min(t_both) / base:.2f}, median round "
        f"{statistics.median(b / c for b, c in zip(t_both, t_copy, strict=True)):.2f}, "
        f"per-chunk best {headline:.2f} (headline); not kept: {cold:.2f}",
    ]
    sec.summary = {
        "fragment_checks_vs_memcpy": floor["checks"] / floor["memcpy"],
        "memcpy_gbps": total / floor["memcpy"] / 1e9,
        "fragment_gbps": total / floor["answer"] / 1e9,
        "reassemble_gbps": total / floor["reassemble"] / 1e9,
        "fragment_reassemble_vs_memcpy_best_round": min(t_both) / base,
        "fragment_reassemble_vs_memcpy_median_round": statistics.median(
            b / c for b, c in zip(t_both, t_copy, strict=True)),
        "fragment_not_kept_reassemble_vs_memcpy": cold,
        "fragment_reassemble_vs_memcpy": headline,
    }
    return sec


def bench_serialize(args: argparse.Namespace) -> Section:
    """Serialize / deserialize bf16 chunk tensors (checksum included), raw and int8, vs memcpy."""
    # bf16 chunks shaped like a block of a small model: [layers, 2, kv_heads, tokens, head_dim].
    layers, heads, dim = 24, 2, 64
    per_token = layers * 2 * heads * dim * 2
    tokens = max(1, args.chunk_kib * 1024 // per_token)
    count = max(1, args.mib * MIB // (tokens * per_token))
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(layers, 2, heads, tokens, dim, generator=g).to(torch.bfloat16) for _ in range(count)]
    total = count * tokens * per_token
    _progress(f"serialize: {count} bf16 chunks [{layers}, 2, {heads}, {tokens}, {dim}], {args.reps} reps")
    blobs = [bytearray(serialized_size(t)) for t in tensors]
    qblobs = [bytearray(serialized_size(t, Quant.INT8)) for t in tensors]
    # The baseline copies the same bytes with numpy, like the other sections.
    srcs = [np.frombuffer(tensor_bytes(t), dtype=np.uint8) for t in tensors]
    copies = [np.empty_like(a) for a in srcs]

    def memcpy() -> None:
        for src, dst in zip(srcs, copies, strict=True):
            np.copyto(dst, src)

    def ser() -> None:
        for t, b in zip(tensors, blobs, strict=True):
            serialize_into(t, b)

    def de() -> None:
        for b in blobs:
            deserialize(b)  # checksum verified; tensor built on the blob without a copy

    def qser() -> None:
        for t, b in zip(tensors, qblobs, strict=True):
            serialize_into(t, b, Quant.INT8)

    def qde() -> None:
        for b in qblobs:
            deserialize(b)

    times = _timed({"memcpy": memcpy, "ser": ser, "de": de}, args.reps)
    t_copy, t_ser, t_de = times["memcpy"], times["ser"], times["de"]
    # int8 is an order of magnitude slower: fewer reps keep the run short.
    qtimes = _timed({"qser": qser, "qde": qde}, max(1, args.reps // 5))
    t_qser, t_qde = qtimes["qser"], qtimes["qde"]
    for t, b in zip(tensors, blobs, strict=True):
        if not torch.equal(deserialize(b), t):
            raise RuntimeError("serialize round trip is not exact")
    base = min(t_copy)
    qsize = sum(len(b) for b in qblobs)
    sec = Section(f"serialize, {total / MIB:.0f} MiB of bf16 chunk tensors ({count} x {tokens} tokens)", _COLUMNS)
    sec.rows = [
        _row("memcpy (np.copyto, same bytes)", t_copy, total, base),
        _row("serialize_into (copy + xxh3)", t_ser, total, base),
        _row("deserialize (xxh3, zero-copy)", t_de, total, base),
        _row("serialize_into int8", t_qser, total, base),
        _row("deserialize int8 -> bf16", t_qde, total, base),
    ]
    sec.notes = [f"int8 blobs are {qsize / total:.3f} of the bf16 bytes (one float32 scale per head_dim row)"]
    sec.summary = {
        "serialize_vs_memcpy": min(t_ser) / base,
        "deserialize_vs_memcpy": min(t_de) / base,
        "int8_size_ratio": qsize / total,
    }
    return sec


def bench_pipeline(args: argparse.Namespace) -> Section:
    """The whole in-memory path of a chunk: tensor -> blob -> DATA records -> blob -> tensor."""
    layers, heads, dim = 24, 2, 64  # bf16 blocks shaped like Qwen2.5-0.5B's, as in "serialize"
    per_token = layers * 2 * heads * dim * 2
    tokens = max(1, args.chunk_kib * 1024 // per_token)
    count = max(1, args.mib * MIB // (tokens * per_token))
    g = torch.Generator().manual_seed(1)
    tensors = [torch.randn(layers, 2, heads, tokens, dim, generator=g).to(torch.bfloat16) for _ in range(count)]
    total = count * tokens * per_token
    blob_len = serialized_size(tensors[0])
    _progress(f"pipeline: {count} bf16 chunks of {blob_len} B, {args.reps} reps")
    # Everything preallocated, as a long-running agent would keep it.
    blobs = [np.empty(blob_len, dtype=np.uint8) for _ in tensors]
    records = [empty_records(wire.fragment_count(blob_len)) for _ in tensors]
    recv = [np.empty(blob_len, dtype=np.uint8) for _ in tensors]
    srcs = [np.frombuffer(tensor_bytes(t), dtype=np.uint8) for t in tensors]
    copies = [np.empty_like(a) for a in srcs]
    out: list[torch.Tensor] = []

    def memcpy() -> None:
        for src, dst in zip(srcs, copies, strict=True):
            np.copyto(dst, src)

    def pipeline() -> None:
        out.clear()
        for i, t in enumerate(tensors):
            serialize_into(t, blobs[i])
            fragment_into(records[i], blobs[i], i + 1)
            r = Reassembler(i + 1, blob_len, buffer=recv[i])
            r.add_batch(records[i])
            out.append(deserialize(r.data))  # checksum verified, tensor built on recv[i]

    times = _timed({"memcpy": memcpy, "pipeline": pipeline}, args.reps)
    for t, back in zip(tensors, out, strict=True):
        if not torch.equal(t, back):
            raise RuntimeError("pipeline round trip is not exact")
    base = min(times["memcpy"])
    sec = Section(f"pipeline, {total / MIB:.0f} MiB of bf16 chunk tensors ({count} x {tokens} tokens)", _COLUMNS)
    sec.rows = [
        _row("memcpy (np.copyto, same bytes)", times["memcpy"], total, base),
        _row("serialize+fragment+reassemble+deserialize", times["pipeline"], total, base),
    ]
    sec.notes = ["per chunk: serialize_into (copy + xxh3) -> fragment_into (copy) -> add_batch (copy) -> "
                 "deserialize (xxh3, no copy); three copies and two checksum passes against one memcpy"]
    sec.summary = {"pipeline_vs_memcpy": min(times["pipeline"]) / base}
    return sec


# ------------------------------------------------------------------ goodput (helper B)

# Plain Python UDP blasts, the yardsticks for the agents' goodput.  Per datagram: the sender
# loops sendto over memoryview slices of one preallocated buffer, the receiver recv_into one
# buffer.  Segmented (the host's limit for this wire format): the sender hands the kernel up
# to ``segs`` datagrams per sendto with UDP GSO (``UDP_SEGMENT``), the receiver takes
# coalesced buffers with UDP GRO and splits them by the segment size its cmsg gives.  The
# datagrams are the same 1448-byte ones either way.  Both ends get the same socket buffers as
# the agents (forced past rmem_max when root) and run as separate processes, like two agents.
_UDP_BLAST = Path(__file__).with_name("udp_blast.py")


def _udp_blast(count: int, sock_buf: int, *, gso: bool = False, flows: int = 1) -> dict[str, float]:
    """``scripts/udp_blast.py``: ``count`` DATA-sized datagrams per flow between processes, GSO+GRO or one
    call per datagram, ``flows`` pairs at once; packets, bytes and seconds received, all flows together."""
    import json
    import subprocess

    cmd = [sys.executable, str(_UDP_BLAST), "--count", str(count), "--size", str(wire.DATA_DATAGRAM_LEN),
           "--sock-buf", str(sock_buf), "--flows", str(flows), *(["--gso"] if gso else [])]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout
    got: dict[str, float] = json.loads(out.splitlines()[-1])
    return got


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_goodput(args: argparse.Namespace) -> Section:
    """Chunks from a holder agent to a requester agent over UDP on loopback, vs a raw UDP blast."""
    import tempfile
    from pathlib import Path

    from hostagent.client import AgentClient
    from hostagent.daemon import AgentConfig, spawn_agent

    chunk_len = args.chunk_kib * 1024
    count = max(1, args.mib * MIB // chunk_len)
    total = count * chunk_len
    frags = count * wire.fragment_count(chunk_len)
    reps = max(3, args.reps // 2)  # paired reps; the median tames a busy machine
    sock_buf = AgentConfig().sock_buf_bytes
    # Serialized chunks of exactly chunk_len bytes, as agents carry them (checked as a whole).
    blobs = [c.tobytes() for c in _chunk_set(args)[0]]
    keys = [0x6B76_0000_0000_0000 + i for i in range(count)]
    _progress(f"goodput: {count} chunks x {chunk_len} B through two kvpool-agent processes, {reps} reps")
    agent_bps: list[float] = []
    api_bps: list[float] = []
    raw_bps: list[float] = []
    raw_loss: list[float] = []
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-") as tmp:
        holder = spawn_agent(Path(tmp) / "holder", "--log-level", "WARNING", *args.agent_args.split())
        requester = spawn_agent(Path(tmp) / "requester", "--log-level", "WARNING", *args.agent_args.split())
        try:
            hc, rc = AgentClient(holder.api_url, timeout=600), AgentClient(requester.api_url, timeout=600)
            hc.publish_chunks(keys, blobs)
            for rep in range(-1, reps):  # rep -1: untimed warm-up (page faults, first allocations)
                t0 = time.perf_counter()
                got = rc.prefetch(keys, holder.udp_address, timeout=300)
                wall = time.perf_counter() - t0
                if got["found"] != count:
                    raise RuntimeError(f"goodput: fetched {got['found']}/{count} chunks: {got['stopped']}")
                for k in keys:  # forget them, so the next rep crosses the network again
                    rc.delete_chunk(k)
                raw = _udp_blast(frags, sock_buf)
                if rep < 0:
                    continue
                agent_bps.append(total / float(got["seconds"]))
                api_bps.append(total / wall)
                raw_bps.append(raw["bytes"] / raw["seconds"] if raw["seconds"] > 0 else float("nan"))
                raw_loss.append(1 - raw["packets"] / frags)
                _progress(f"goodput rep {rep}: agents {agent_bps[-1] / 1e6:.0f} MB/s, "
                          f"raw UDP {raw_bps[-1] / 1e6:.0f} MB/s")
            # Fetched chunks must be the published bytes (spot check one end to end).
            rc.fetch_chunks(keys[:1], holder.udp_address)
            if rc.get_chunk(keys[0]) != blobs[0]:
                raise RuntimeError("goodput: fetched chunk differs from the published one")
            tstats = rc.stats()["transport"]
        finally:
            holder.stop()
            requester.stop()
    ratios = [a / r for a, r in zip(agent_bps, raw_bps, strict=True)]
    headline = statistics.median(ratios)
    sec = Section(f"goodput: {total / MIB:.0f} MiB as {count} chunks of {chunk_len} B, holder agent -> requester "
                  f"agent over UDP on 127.0.0.1 ({frags} DATA datagrams of {wire.DATA_DATAGRAM_LEN} B per rep)",
                  ["path", "best MB/s", "median MB/s", "median vs raw UDP"])
    med_raw = statistics.median(raw_bps)
    for name, series in (("raw UDP blast (Python sendto -> recv_into)", raw_bps),
                         ("kvpool agents, UDP transfer (agent-timed)", agent_bps),
                         ("kvpool agents, through the HTTP API", api_bps)):
        sec.rows.append([name, f"{max(series) / 1e6:.0f}", f"{statistics.median(series) / 1e6:.0f}",
                         f"{statistics.median(series) / med_raw:.2f}"])
    sec.notes = [
        "agents: two kvpool-agent processes; /v1/prefetch on the requester fetches every chunk from the",
        "holder with windowed range GETs and stores it in its DRAM tier; goodput = chunk bytes / the",
        "requester's own transfer time.  raw: a sender process loops sendto() of 1440-byte datagrams as",
        "fast as it can to a receiver process that counts them (same count, same socket buffers); its",
        "rate counts all 1440 bytes of each datagram, the agents only the 1408 chunk bytes.",
        f"raw blast loss: median {statistics.median(raw_loss) * 100:.1f}% (it has no flow control); agents: "
        f"{tstats['retransmit_gets']} retransmit GETs, {tstats['drops_total']} drops, "
        f"{tstats['duplicates']} duplicate fragments over all reps",
        f"goodput/raw per rep (paired, same load): {', '.join(f'{r:.2f}' for r in ratios)}",
        f"goodput_vs_raw_udp={headline:.3f} (median of the paired ratios; target >= 0.6)",
    ]
    sec.summary = {
        "raw_udp_mbps": med_raw / 1e6,
        "agent_goodput_mbps": statistics.median(agent_bps) / 1e6,
        "api_goodput_mbps": statistics.median(api_bps) / 1e6,
        "goodput_vs_raw_udp": headline,  # the section's headline, printed last
    }
    return sec


def _fetch_at_once(clients: list[Any], fetch: Callable[[Any], object]) -> float:
    """Run ``fetch(client)`` for every client in threads released together; seconds until the last is done."""
    import threading

    errors: list[BaseException] = []
    barrier = threading.Barrier(len(clients) + 1)

    def one(client: Any) -> None:
        barrier.wait()
        try:
            fetch(client)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return wall


def bench_limit(args: argparse.Namespace) -> Section:
    """Agent-to-agent fetch against the host's limits: GSO+GRO blast, per-datagram blast, Mooncake TCP get.

    Per rep, paired under the same load: one requester agent fetches every chunk from the
    holder agent, a segmented blast and a per-datagram blast carry the same datagrams, then
    4 requester agents fetch them at once and 4 segmented blasts run at once.  Mooncake
    Store's get of the same bytes runs after, in rounds of its own.
    """
    import tempfile
    from pathlib import Path

    from hostagent.client import AgentClient
    from hostagent.daemon import AgentConfig, spawn_agent

    chunk_len = args.chunk_kib * 1024
    count = max(1, args.mib * MIB // chunk_len)
    total = count * chunk_len
    frags = count * wire.fragment_count(chunk_len)
    reps = max(3, args.reps // 2)
    flows = 4
    sock_buf = AgentConfig().sock_buf_bytes
    blobs = [c.tobytes() for c in _chunk_set(args)[0]]
    keys = [0x6B76_1000_0000_0000 + i for i in range(count)]
    _progress(f"limit: {count} chunks x {chunk_len} B; 1 and {flows} requester agents vs GSO/per-datagram "
              f"blasts, {reps} reps")
    series: dict[str, list[float]] = {n: [] for n in ("fetch", "gso", "udp", "fetch4", "gso4")}
    holder_cpu = 0.0
    holder_bytes = 0
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-") as tmp:
        holder = spawn_agent(Path(tmp) / "holder", "--log-level", "WARNING", *args.agent_args.split())
        requesters = []
        try:
            for i in range(flows):
                requesters.append(spawn_agent(Path(tmp) / f"requester{i}", "--log-level", "WARNING",
                                              *args.agent_args.split()))
            hc = AgentClient(holder.api_url, timeout=600)
            rcs = [AgentClient(r.api_url, timeout=600) for r in requesters]
            hc.publish_chunks(keys, blobs)

            def fetch_all(rc: AgentClient) -> dict[str, Any]:
                got = rc.prefetch(keys, holder.udp_address, timeout=300)
                if got["found"] != count:
                    raise RuntimeError(f"limit: fetched {got['found']}/{count} chunks: {got['stopped']}")
                return got

            def forget(rc: AgentClient) -> None:
                for k in keys:  # so the next rep crosses the network again
                    rc.delete_chunk(k)

            for rep in range(-1, reps):  # rep -1: untimed warm-up (page faults, records built)
                cpu0 = _proc_cpu_s(holder.pid)
                got = fetch_all(rcs[0])
                cpu1 = _proc_cpu_s(holder.pid)
                forget(rcs[0])
                gso = _udp_blast(frags, sock_buf, gso=True)
                udp = _udp_blast(frags, sock_buf)
                # Four requesters at once, released together; wall time from release to the last done.
                wall4 = _fetch_at_once(rcs, fetch_all)
                for rc in rcs:
                    forget(rc)
                gso4 = _udp_blast(frags, sock_buf, gso=True, flows=flows)
                if rep < 0:
                    continue
                holder_cpu += cpu1 - cpu0
                holder_bytes += total
                series["fetch"].append(total / float(got["seconds"]))
                series["gso"].append(gso["bytes"] / gso["seconds"] if gso["seconds"] > 0 else float("nan"))
                series["udp"].append(udp["bytes"] / udp["seconds"] if udp["seconds"] > 0 else float("nan"))
                series["fetch4"].append(flows * total / wall4)
                series["gso4"].append(gso4["bytes"] / gso4["seconds"] if gso4["seconds"] > 0 else float("nan"))
                _progress("limit rep {}: {}".format(rep, ", ".join(f"{n} {v[-1] / 1e6:.0f} MB/s"
                                                                   for n, v in series.items())))
            # Fetched chunks must be the published bytes (spot check one end to end).
            rcs[0].fetch_chunks(keys[:1], holder.udp_address)
            if rcs[0].get_chunk(keys[0]) != blobs[0]:
                raise RuntimeError("limit: fetched chunk differs from the published one")
            hstats = hc.stats()["transport"]
        finally:
            holder.stop()
            for r in requesters:
                r.stop()
    _progress("limit: Mooncake Store TCP get of the same bytes")
    mooncake, why_not = REFS["mooncake_get_mbps"](blobs, reps)
    med = {n: statistics.median(v) for n, v in series.items()}

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(series[a], series[b], strict=True))

    sec = Section(f"limit: {total / MIB:.0f} MiB as {count} chunks of {chunk_len} B on 127.0.0.1 "
                  f"({frags} DATA datagrams of {wire.DATA_DATAGRAM_LEN} B per flow)",
                  ["path", "best MB/s", "median MB/s", "fetch / it (paired median)"])
    labels = {"gso": "GSO+GRO blast, 1 flow (44 datagrams per send)",
              "udp": "per-datagram blast, 1 flow (sendto -> recv_into)",
              "fetch": "agent fetch, 1 flow (agent-timed)",
              "gso4": f"GSO+GRO blast, {flows} flows (aggregate)",
              "fetch4": f"agent fetch, {flows} requesters from 1 holder (aggregate, wall)"}
    against = {"gso": paired("fetch", "gso"), "udp": paired("fetch", "udp"), "gso4": paired("fetch4", "gso4")}
    for name, label in labels.items():
        v = series[name]
        sec.rows.append([label, f"{max(v) / 1e6:.0f}", f"{med[name] / 1e6:.0f}",
                         f"{against[name]:.3f}" if name in against else ""])
    if mooncake:
        sec.rows.append(["Mooncake Store TCP get, 1 client (raw get)", f"{max(mooncake) / 1e6:.0f}",
                         f"{statistics.median(mooncake) / 1e6:.0f}",
                         f"{med['fetch'] / statistics.median(mooncake):.3f}"])
    cpu_per_gib = holder_cpu / (holder_bytes / (1 << 30)) if holder_bytes else float("nan")
    sec.notes = [
        "blasts count every byte of each 1448-byte datagram, agents only the 1408 chunk bytes; blasts have",
        "no flow control (their loss is not retransmitted), the agents deliver every byte, checked.",
        f"{flows}-requester fetch: {flows} agent processes fetch the same chunks from one holder at once;",
        "aggregate = their bytes / wall time from release to the last done (HTTP included).",
        f"holder CPU (its process, all threads, /proc) over the 1-flow fetches: {cpu_per_gib:.3f} s per GiB "
        f"served; holder sent {hstats['datagrams_sent']} datagrams in {hstats.get('send_calls', 'n/a')} send calls "
        f"(UDP offload: {hstats.get('udp_offload', 'n/a')}); agent flags: {args.agent_args or 'none'}",
    ]
    if not mooncake:
        sec.notes.append(f"fetch_vs_mooncake_tcp skipped: {why_not}")
    sec.summary = {
        "gso_blast_mbps": med["gso"] / 1e6,
        "gso4_blast_mbps": med["gso4"] / 1e6,
        "udp_blast_mbps": med["udp"] / 1e6,
        "fetch_mbps": med["fetch"] / 1e6,
        "fetch4_mbps": med["fetch4"] / 1e6,
        "fetch_vs_gso_blast": against["gso"],
        "fetch4_vs_gso_blast": against["gso4"],
        "fetch_vs_udp_blast": against["udp"],
        "holder_cpu_s_per_gib": cpu_per_gib,
    }
    if mooncake:
        sec.summary["mooncake_get_mbps"] = statistics.median(mooncake) / 1e6
        sec.summary["fetch_vs_mooncake_tcp"] = med["fetch"] / statistics.median(mooncake)
    return sec


# ------------------------------------------------------------------ API bodies


def bench_api(args: argparse.Namespace) -> Section:
    """The agent's HTTP API bodies (one bundle per call) against a plain-socket HTTP peer and the API before."""
    import tempfile

    chunk_len = args.chunk_kib * 1024
    count = max(1, args.mib * MIB // chunk_len)
    total = count * chunk_len
    reps = max(3, args.reps)
    names = ["raw", "api"] + (["before"] if args.before != "none" else [])
    secs: dict[tuple[str, str], list[float]] = {(n, op): [] for n in names for op in ("fetch", "publish")}
    secs[("api", "fetch_into")] = []  # this tree's fetch into the caller's buffer, next to its plain fetch
    why_not = ""
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-") as tmp:
        if "before" in names and (why_not := REFS["tree_at"](args.before, Path(tmp))):
            names.remove("before")
        _progress(f"api: {count} chunks x {chunk_len} B per bundle; {', '.join(names)}; {reps} reps")
        sides = {n: REFS["BodiesSide"]("raw" if n == "raw" else "agent", count, chunk_len,
                                       *([Path(tmp)] if n == "before" else [])) for n in names}
        try:
            for rep in range(-1, reps):  # rep -1: untimed warm-up; sides take turns, in turn first
                for op in ("fetch_into", "fetch", "publish") if rep % 2 else ("fetch", "fetch_into", "publish"):
                    for n in names[rep % len(names):] + names[: rep % len(names)]:
                        if (n, op) in secs:
                            dt = sides[n].seconds(op)
                            secs[(n, op)].extend([dt] if rep >= 0 else [])
        finally:
            for side in sides.values():
                side.close()
    sec = Section(f"api: HTTP bodies of {total / MIB:.0f} MiB ({count} chunks of {chunk_len} B) on 127.0.0.1, "
                  "one bundle per call", ["path", "best MB/s", "median MB/s", "median vs raw HTTP"])
    for op, what in (("fetch", "/v1/fetch of held chunks"), ("publish", "/v1/publish")):
        for n in names:
            rates = [total / t for t in secs[(n, op)]]
            paired = [r / t for r, t in zip(secs[("raw", op)], secs[(n, op)], strict=True)]
            label = {"raw": "plain-socket HTTP peer", "api": "agent API now",
                     "before": f"agent API at {args.before[:7]}"}[n]
            sec.rows.append([f"{op}: {label}" if n == "raw" else f"{what}: {label}", f"{max(rates) / 1e6:.0f}",
                             f"{statistics.median(rates) / 1e6:.0f}", f"{statistics.median(paired):.2f}"])
            sec.summary[f"{n}_http_{op}_mbps" if n == "raw" else f"{n}_{op}_body_mbps"] = statistics.median(rates) / 1e6
        for n in names[1:]:
            sec.summary[f"{n}_{op}_vs_raw_http"] = statistics.median(
                [r / t for r, t in zip(secs[("raw", op)], secs[(n, op)], strict=True)])
        if "before" in names:
            sec.summary[f"api_{op}_vs_before"] = statistics.median(
                [b / t for b, t in zip(secs[("before", op)], secs[("api", op)], strict=True)])
    into = secs[("api", "fetch_into")]
    paired = [r / t for r, t in zip(secs[("raw", "fetch")], into, strict=True)]
    sec.rows.insert(len(names), ["/v1/fetch into a kept buffer (fetch_chunks_into)", f"{total / min(into) / 1e6:.0f}",
                                 f"{total / statistics.median(into) / 1e6:.0f}", f"{statistics.median(paired):.2f}"])
    sec.summary["api_fetch_into_body_mbps"] = total / statistics.median(into) / 1e6
    sec.summary["api_fetch_into_vs_raw_http"] = statistics.median(paired)
    sec.summary["api_fetch_into_vs_fetch"] = statistics.median(
        [f / t for f, t in zip(secs[("api", "fetch")], into, strict=True)])
    sec.notes = [
        "Each path is a client process: the agent's through AgentClient (fetch: the bundle out of the",
        "agent's DRAM tier, each chunk returned as bytes; fetch into a kept buffer: the same, each chunk",
        "received into one staging tensor and returned as a view of it; publish: the same bytes in), the raw peer a",
        "plain socket (sendall of the parts, recv_into one reused buffer: kernel copies only, the floor).",
        "Paths take turns per rep; ratios are medians of per-rep pairs.  'before' is the API of main",
        "before issue 46 (hand-written server and http.client), its hostagent/ and kvpool/ from git.",
    ]
    if why_not:
        sec.notes.append(f"before: skipped ({why_not})")
    return sec


SECTIONS: dict[str, SectionFn] = {
    "fragment": bench_fragment_reassemble,
    "serialize": bench_serialize,
    "pipeline": bench_pipeline,
    "goodput": bench_goodput,
    "api": bench_api,
    "limit": bench_limit,
}
"""Sections in run order; the fragment section's summary comes last in the output."""


def _print_section(sec: Section) -> None:
    """Print one section as an aligned table with its notes."""
    widths = [max(len(c), *(len(r[i]) for r in sec.rows)) for i, c in enumerate(sec.columns)]
    print(f"\n## {sec.title}")
    print("  ".join(c.ljust(w) for c, w in zip(sec.columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in sec.rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    for note in sec.notes:
        print(f"  {note}")


def build_parser() -> argparse.ArgumentParser:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--mib", type=int, default=64, help="MiB of chunk data per round (default 64)")
    p.add_argument("--chunk-kib", type=int, default=1024, help="size of one chunk in KiB (default 1024)")
    p.add_argument("--reps", type=int, default=15,
                   help="timed repetitions per step, best and median shown (default 15)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: the copies here are single-threaded too)")
    p.add_argument("--agent-args", default="",
                   help="extra kvpool-agent flags for the goodput and limit sections, e.g. --no-udp-offload")
    p.add_argument("--before", default=BEFORE_REV,
                   help="git revision whose agent API the api section also runs, or 'none' (default: main "
                        "before issue 46, the hand-written HTTP server and client)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated sections to run, from {', '.join(SECTIONS)} (default all)")
    p.add_argument("--save", action="store_true",
                   help="write each section's table to results/bench-hostagent-SECTION.json")
    p.add_argument("--machine", help="a description of the machine for --save (default: CPUs and arch)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the selected sections, print their tables, then every summary line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.mib <= 0 or args.chunk_kib <= 0 or args.reps <= 0:
        parser.error("--mib, --chunk-kib and --reps must be positive")
    if args.chunk_kib * 1024 > wire.MAX_CHUNK_LEN:
        parser.error(f"--chunk-kib too large: a chunk is at most {wire.MAX_CHUNK_LEN} bytes")
    # Run in an order that ends with the headline section, so its line is among the last.
    ordered = [n for n in SECTIONS if n in names and n != "fragment"] + (["fragment"] if "fragment" in names else [])
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, args.threads))
    try:
        results = [SECTIONS[n](args) for n in ordered]
    finally:
        torch.set_num_threads(threads)  # main() may be called in-process (tests)
    root = Path(__file__).resolve().parent.parent
    for name, sec in zip(ordered, results, strict=True):
        _print_section(sec)
        if args.save:
            saved = save_table(root, f"bench-hostagent-{name}", "scripts/bench_hostagent.py",
                               sys.argv[1:] if argv is None else argv, sec.title, sec.columns, sec.rows, sec.notes,
                               args.machine, sec.summary)
            print(f"  saved: {saved}")
    print(f"\nload average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
          "background load inflates every step, compare ratios of one run only")
    print()
    for sec in results:
        for name, value in sec.summary.items():
            print(f"{name}={value:.3f}")
        if sec.title.startswith("limit") and "fetch_vs_mooncake_tcp" not in sec.summary:
            print("fetch_vs_mooncake_tcp=skipped (" + sec.notes[-1].split(": ", 1)[-1] + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
