"""Mooncake Store alone vs kvpool (plain, multicast, pool) on one Mininet network, N = 2, 4, 8, 16.

Needs root (Mininet). For every N it builds the network (a star, or with --topology
leaf-spine a fabric whose storage hosts sit on one leaf), starts a real Mooncake Store
with one store node per storage host and a kvpool holder fronting it on each, and runs
the same waves of a hot prefix four ways; it prints a table per N, then all of them, and
writes results.json, results.txt and vs_mooncake.png under --out. See
bmv2_topologies/experiment/sidebyside.py.

    sudo .venv/bin/python scripts/bench_vs_mooncake.py                      # N = 2 4 8 16
    sudo .venv/bin/python scripts/bench_vs_mooncake.py --requesters 8 --json
    sudo .venv/bin/python scripts/bench_vs_mooncake.py --topology leaf-spine --requesters 8 --json

With --json the last line is one JSON object; with one N it has, per system (mooncake,
kvpool_plain, kvpool_multicast, kvpool_pool), all_done_p50_ms, all_done_p99_ms and
storage_link_bytes at the top level (and under by_requesters for any N).
"""

from __future__ import annotations

from bmv2_topologies.vs_mooncake import main

if __name__ == "__main__":
    raise SystemExit(main())
