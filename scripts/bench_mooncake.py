"""Mooncake Store over TCP on loopback: put/get throughput, and N clients pulling one hot object.

Starts its own mooncake_master and one store node (mooncake_client) unless --master and
--metadata name a running pool. Part 1 times one client writing then reading --count
values of --size-kib each through the raw library calls and through MooncakeBackend in
both modes; the ratio column compares each to the raw call in the same run. Part 2 is
the Mooncake-alone incast baseline: N reader processes all fetch the same hot object at
once, and the table gives the aggregate rate and the time until every reader has it.

    .venv/bin/python scripts/bench_mooncake.py                 # 1 MiB values, 1/2/4 readers
    .venv/bin/python scripts/bench_mooncake.py --size-kib 4096 --readers 1 8

For a run across Mininet hosts (the Mooncake-alone baseline of the side-by-side), start a
pool on the holder (``python -m hostagent.mooncake_master --host IP``), then
``--publish`` once and ``--pull --local-hostname HOST_IP --start-at T`` on every reader
host; each prints one JSON line with its (start, end) wall-clock time per get.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from multiprocessing.synchronize import Barrier
from typing import Any

import numpy as np

from hostagent.backend import BackendError
from hostagent.mooncake_backend import MooncakeBackend, store_key
from hostagent.mooncake_master import MasterConfig, MooncakeMaster, MooncakeProcessError, MooncakeStoreNode

HOT_KEY = 0x407_0000_0000


def timed(fn: Callable[[int], object], count: int) -> float:
    """Seconds to call ``fn(i)`` for i in range(count)."""
    start = time.perf_counter()
    for i in range(count):
        fn(i)
    return time.perf_counter() - start


def single_client(master: str, metadata: str, size: int, count: int, rounds: int) -> list[tuple[str, float, float]]:
    """(path, put MB/s, get MB/s) for the raw library and MooncakeBackend, best of ``rounds``.

    The paths take turns within each round, in a rotating order, after one unrecorded
    warm-up round, so a busy machine slows them alike and the ratios stay meaningful.
    """
    from mooncake.store import MooncakeDistributedStore

    # As MooncakeBackend does: advertise loopback, not the first non-loopback interface.
    os.environ["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"
    values = [os.urandom(size) for _ in range(min(count, 8))]
    buffer_bytes = max(64 << 20, 2 * size)
    raw: Any = MooncakeDistributedStore()
    if raw.setup("127.0.0.1", metadata, 0, buffer_bytes, "tcp", "", master) != 0:
        raise RuntimeError("raw mooncake client setup failed")
    zero_copy = MooncakeBackend(master, metadata, zero_copy=True, local_buffer_bytes=buffer_bytes)
    plain = MooncakeBackend(master, metadata, zero_copy=False, local_buffer_bytes=buffer_bytes)

    def raw_round(r: int) -> tuple[float, float]:
        put_s = timed(lambda i: raw.upsert(f"bench/raw/{r}/{i}", values[i % 8]), count)
        get_s = timed(lambda i: raw.get(f"bench/raw/{r}/{i}"), count)
        raw.remove_by_regex(f"^bench/raw/{r}/", True)
        return put_s, get_s

    def backend_round(b: MooncakeBackend, r: int) -> tuple[float, float]:
        base = (1 << 48) * (r + 1) + (1 << 40) * b.zero_copy
        put_s = timed(lambda i: b.put(base + i, values[i % 8]), count)
        get_s = timed(lambda i: b.get(base + i), count)
        for i in range(count):
            b.delete(base + i)
        return put_s, get_s

    paths: list[tuple[str, Callable[[int], tuple[float, float]]]] = [
        ("raw upsert/get", raw_round),
        ("backend zero-copy", lambda r: backend_round(zero_copy, r)),
        ("backend plain", lambda r: backend_round(plain, r)),
    ]
    best = {name: (float("inf"), float("inf")) for name, _ in paths}
    try:
        for r in range(rounds + 1):
            # Rotate the order each round so that no path always runs first or last.
            for name, fn in paths[r % len(paths) :] + paths[: r % len(paths)]:
                put_s, get_s = fn(r)
                if r > 0:
                    best[name] = (min(best[name][0], put_s), min(best[name][1], get_s))
    finally:
        zero_copy.close()
        plain.close()
        raw.close()
    total = size * count / 1e6
    return [(name, total / put_s, total / get_s) for name, (put_s, get_s) in best.items()]


def hot_value(size: int) -> bytes:
    """The hot object's bytes: the same in every process, so each reader can check them."""
    return np.random.default_rng(0x407).bytes(size)


def pull(b: MooncakeBackend, size: int, repeats: int) -> list[tuple[float, float]]:
    """Fetch the hot object ``repeats`` times; (start, end) wall-clock times of each get."""
    want = hot_value(size)
    times = []
    for _ in range(repeats):
        t0 = time.time()
        got = b.get(HOT_KEY)
        times.append((t0, time.time()))
        if got != want:
            raise RuntimeError(f"hot object wrong: {'missing' if got is None else f'{len(got)} bytes, differ'}")
    return times


def _reader(master: str, metadata: str, size: int, repeats: int, barrier: Barrier, out: Any) -> None:
    """One reader process: wait for the others, fetch the hot object ``repeats`` times."""
    try:
        with MooncakeBackend(master, metadata, local_buffer_bytes=max(64 << 20, 2 * size)) as b:
            barrier.wait()
            out.put(("ok", pull(b, size, repeats)))
    except Exception as exc:
        out.put(("error", str(exc)))


def hot_object(master: str, metadata: str, size: int, readers: int, repeats: int) -> tuple[float, float, float]:
    """(aggregate MB/s, p50 ms per get, ms until the last reader's first copy) for N readers."""
    ctx = mp.get_context("spawn")  # no fork of a process that holds a Mooncake client
    barrier = ctx.Barrier(readers)
    out = ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(master, metadata, size, repeats, barrier, out)) for _ in range(readers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    errors = [r[1] for r in results if r[0] != "ok"]
    if errors:
        raise RuntimeError(f"reader failed: {errors[0]}")
    spans = [t for r in results for t in r[1]]
    start = min(t0 for t0, _ in spans)
    end = max(t1 for _, t1 in spans)
    first_done = max(r[1][0][1] for r in results)  # every reader holds one copy
    lat = [(t1 - t0) * 1e3 for t0, t1 in spans]
    return size * len(spans) / (end - start) / 1e6, statistics.median(lat), (first_done - start) * 1e3


def publish_or_pull(args: argparse.Namespace, size: int) -> int:
    """One side of a multi-host run: write the hot object, or fetch it and print timings."""
    try:
        with MooncakeBackend(
            args.master, args.metadata, local_hostname=args.local_hostname, local_buffer_bytes=max(64 << 20, 2 * size)
        ) as b:
            if args.publish:
                b.put(HOT_KEY, hot_value(size))
                print(json.dumps({"published": store_key(HOT_KEY), "size": size}), flush=True)
                return 0
            if args.start_at is not None:
                time.sleep(max(0.0, args.start_at - time.time()))
            gets = pull(b, size, args.repeats)
    except (BackendError, RuntimeError) as exc:
        print(f"bench_mooncake: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"host": args.local_hostname, "size": size, "gets": gets}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run both parts and print the tables."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--size-kib", type=int, default=1024, help="value size in KiB (default 1024)")
    ap.add_argument("--count", type=int, default=64, help="values per round in part 1 (default 64)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds in part 1, best kept (default 5)")
    ap.add_argument("--readers", type=int, nargs="+", default=[1, 2, 4], help="reader counts in part 2")
    ap.add_argument("--repeats", type=int, default=20, help="gets of the hot object per reader (default 20)")
    ap.add_argument("--segment-mib", type=int, default=512, help="store node DRAM when starting a pool")
    ap.add_argument("--master", help="RPC address of a running master (host:port)")
    ap.add_argument("--metadata", help="its HTTP metadata URL (http://host:port/metadata)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--publish", action="store_true", help="only write the hot object to --master's pool")
    mode.add_argument("--pull", action="store_true", help="only fetch it --repeats times and print one JSON line")
    ap.add_argument("--local-hostname", default="127.0.0.1", help="this client's address (a Mininet host's IP)")
    ap.add_argument("--start-at", type=float, help="with --pull: time.time() to start at, to line up hosts")
    args = ap.parse_args(argv)
    if (args.publish or args.pull) and args.master is None:
        ap.error("--publish and --pull need --master and --metadata")
    if args.size_kib <= 0 or args.count <= 0 or args.rounds <= 0 or args.repeats <= 0 or min(args.readers) <= 0:
        ap.error("sizes and counts must be positive")
    if (args.master is None) != (args.metadata is None):
        ap.error("--master and --metadata go together")
    size = args.size_kib << 10
    if size * args.count * 2 > args.segment_mib << 20 and args.master is None:
        ap.error(f"--segment-mib {args.segment_mib} too small for {args.count} values of {args.size_kib} KiB")

    if args.publish or args.pull:
        return publish_or_pull(args, size)

    with ExitStack() as stack:
        if args.master is None:
            try:
                pool = stack.enter_context(MooncakeMaster(MasterConfig()))
                stack.enter_context(MooncakeStoreNode(pool, args.segment_mib << 20))
            except MooncakeProcessError as exc:
                print(f"bench_mooncake: {exc}", file=sys.stderr)
                return 1
            master, metadata = pool.rpc_address, pool.metadata_url
        else:
            master, metadata = args.master, args.metadata
        print(f"pool: master {master}, metadata {metadata}; values of {args.size_kib} KiB over TCP", flush=True)

        rows = single_client(master, metadata, size, args.count, args.rounds)
        raw_put, raw_get = rows[0][1], rows[0][2]
        print(f"\n{'path':20s} {'put MB/s':>9s} {'get MB/s':>9s} {'put/raw':>8s} {'get/raw':>8s}")
        for name, put, get in rows:
            print(f"{name:20s} {put:9.1f} {get:9.1f} {put / raw_put:8.2f} {get / raw_get:8.2f}")

        with MooncakeBackend(master, metadata, local_buffer_bytes=max(64 << 20, 2 * size)) as writer:
            writer.put(HOT_KEY, hot_value(size))
            print(f"\nhot object {store_key(HOT_KEY)}: N readers fetch it {args.repeats} times each, at once")
            head = f"{'readers':>7s} {'aggr MB/s':>10s} {'p50 ms/get':>11s} {'all have 1 copy, ms':>20s}"
            print(f"{head} {'vs 1 reader':>12s}")
            base = None
            for n in args.readers:
                aggr, p50, first_all = hot_object(master, metadata, size, n, args.repeats)
                base = base or first_all
                print(f"{n:7d} {aggr:10.1f} {p50:11.3f} {first_all:20.2f} {first_all / base:12.2f}", flush=True)
            writer.delete(HOT_KEY)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
