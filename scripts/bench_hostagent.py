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
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from hostagent import envelope
from hostagent.fragment import Reassembler, empty_records, fragment_checks, fragment_into
from hostagent.holder import Holder
from hostagent.serialize import Quant, deserialize, header_len, serialize, serialize_into, serialized_size, tensor_bytes
from hostagent.tiers import HostTier, TieredStore
from kvpool import wire

MIB = 1 << 20


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

# A plain Python UDP blast, the yardstick for the agents' goodput: the receiver counts
# bytes with recv_into into one buffer, the sender loops sendto over memoryview slices of
# one preallocated buffer.  Both get the same socket buffers as the agents (forced past
# rmem_max when root) and run as separate processes, like the two agents.
_RAW_RECEIVER = r"""
import json, socket, sys, time
L, size = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for force, plain in ((33, socket.SO_RCVBUF), (32, socket.SO_SNDBUF)):
    try: s.setsockopt(socket.SOL_SOCKET, force, size)
    except OSError: s.setsockopt(socket.SOL_SOCKET, plain, size)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
buf = memoryview(bytearray(L))
recv = s.recv_into
s.settimeout(30.0)
n = nbytes = 0
first = last = 0.0
try:
    nbytes += recv(buf); n += 1; first = last = time.perf_counter()
    s.settimeout(0.5)  # the blast is over once the socket stays quiet this long
    while True:
        nbytes += recv(buf); n += 1; last = time.perf_counter()
except (socket.timeout, TimeoutError):
    pass
print(json.dumps({"packets": n, "bytes": nbytes, "seconds": last - first}), flush=True)
"""

_RAW_SENDER = r"""
import socket, sys
L, size, port, count = (int(a) for a in sys.argv[1:5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try: s.setsockopt(socket.SOL_SOCKET, 32, size)
except OSError: s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
ring = 1024
view = memoryview(bytearray(L * ring))
addr = ("127.0.0.1", port)
sendto = s.sendto
for i in range(count):
    off = (i % ring) * L
    sendto(view[off:off + L], addr)
"""


def _raw_udp_blast(count: int, sock_buf: int) -> dict[str, float]:
    """Blast ``count`` datagrams of ``DATA_DATAGRAM_LEN`` bytes between two processes; what arrived."""
    import json
    import subprocess

    dlen = wire.DATA_DATAGRAM_LEN
    recv = subprocess.Popen([sys.executable, "-c", _RAW_RECEIVER, str(dlen), str(sock_buf)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout is not None
        port = int(recv.stdout.readline())
        subprocess.run([sys.executable, "-c", _RAW_SENDER, str(dlen), str(sock_buf), str(port), str(count)],
                       check=True, timeout=300)
        out: dict[str, float] = json.loads(recv.stdout.readline())
        recv.wait(30)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    return out


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
    body_fetch_bps: list[float] = []
    body_publish_bps: list[float] = []
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-") as tmp:
        holder = spawn_agent(Path(tmp) / "holder", "--log-level", "WARNING")
        requester = spawn_agent(Path(tmp) / "requester", "--log-level", "WARNING")
        try:
            hc, rc = AgentClient(holder.api_url), AgentClient(requester.api_url)
            hc.publish_chunks(keys, blobs)
            for rep in range(-1, reps):  # rep -1: untimed warm-up (page faults, first allocations)
                t0 = time.perf_counter()
                got = rc.prefetch(keys, holder.udp_address, timeout=300)
                wall = time.perf_counter() - t0
                if got["found"] != count:
                    raise RuntimeError(f"goodput: fetched {got['found']}/{count} chunks: {got['stopped']}")
                for k in keys:  # forget them, so the next rep crosses the network again
                    rc.delete_chunk(k)
                raw = _raw_udp_blast(frags, sock_buf)
                if rep < 0:
                    continue
                agent_bps.append(total / float(got["seconds"]))
                api_bps.append(total / wall)
                raw_bps.append(raw["bytes"] / raw["seconds"] if raw["seconds"] > 0 else float("nan"))
                raw_loss.append(1 - raw["packets"] / frags)
                _progress(f"goodput rep {rep}: agents {agent_bps[-1] / 1e6:.0f} MB/s, "
                          f"raw UDP {raw_bps[-1] / 1e6:.0f} MB/s")
            # The API's own bodies (megabytes each): a bundle of the holder's chunks out of its DRAM tier
            # through /v1/fetch, and the same bytes in through /v1/publish; no UDP involved.
            for rep in range(-1, reps):
                t0 = time.perf_counter()
                _, got_blobs, _ = hc.fetch_chunks(keys)
                t1 = time.perf_counter()
                hc.publish_chunks(keys, blobs)
                t2 = time.perf_counter()
                if len(got_blobs) != count:
                    raise RuntimeError(f"goodput: /v1/fetch answered {len(got_blobs)}/{count} chunks")
                if rep >= 0:
                    body_fetch_bps.append(total / (t1 - t0))
                    body_publish_bps.append(total / (t2 - t1))
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
    for name, series in (("HTTP API bodies: /v1/fetch bundle of held chunks", body_fetch_bps),
                         ("HTTP API bodies: /v1/publish bundle", body_publish_bps)):
        sec.rows.append([name, f"{max(series) / 1e6:.0f}", f"{statistics.median(series) / 1e6:.0f}", "-"])
    sec.notes = [
        "agents: two kvpool-agent processes; /v1/prefetch on the requester fetches every chunk from the",
        "holder with windowed range GETs and stores it in its DRAM tier; goodput = chunk bytes / the",
        "requester's own transfer time.  raw: a sender process loops sendto() of 1440-byte datagrams as",
        "fast as it can to a receiver process that counts them (same count, same socket buffers); its",
        "rate counts all 1440 bytes of each datagram, the agents only the 1408 chunk bytes.",
        "HTTP API bodies: the holder's own chunks through AgentClient, /v1/fetch (a bundle out of its DRAM",
        "tier) and /v1/publish (the same bytes in): the API's body path alone, no UDP.",
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
        "api_fetch_body_mbps": statistics.median(body_fetch_bps) / 1e6,
        "api_publish_body_mbps": statistics.median(body_publish_bps) / 1e6,
        "goodput_vs_raw_udp": headline,  # the section's headline, printed last
    }
    return sec


SECTIONS: dict[str, SectionFn] = {
    "fragment": bench_fragment_reassemble,
    "serialize": bench_serialize,
    "pipeline": bench_pipeline,
    "goodput": bench_goodput,
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
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated sections to run, from {', '.join(SECTIONS)} (default all)")
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
    for sec in results:
        _print_section(sec)
    print(f"\nload average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
          "background load inflates every step, compare ratios of one run only")
    print()
    for sec in results:
        for name, value in sec.summary.items():
            print(f"{name}={value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
