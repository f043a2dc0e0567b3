"""One inference node reading a prefix straight from Mooncake Store: the baseline's client.

Runs inside a Mininet host (``python -m bmv2_topologies.mooncake_reader``), connects to
the pool as a pure client (no DRAM lent) advertising the host's address, prints
``{"ready": ...}`` and then answers commands on stdin, one JSON line each:

- ``{"go": T}``: at wall-clock time ``T`` (``time.time()``; hosts share the kernel
  clock) get every key in prefix order, as an engine loading a cached prefix does, and
  print ``{"start": T0, "end": T1, "digests": [...]}`` (blake2b-128 of each value, so the
  caller checks the bytes without shipping them back) or ``{"error": "..."}``;
- ``{"quit": true}`` or end of input: disconnect and exit 0.

The keys are kvpool chunk keys; each is read from the store object ``kvpool/<key hex>``,
where a holder agent with a Mooncake backend published it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

from hostagent.backend import BackendError


def digest(data: bytes | memoryview) -> str:
    """The check value of one chunk (the same function on both sides)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _say(obj: object) -> None:
    print(json.dumps(obj), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Serve ``go`` commands until ``quit``; 1 if the pool cannot be reached."""
    ap = argparse.ArgumentParser(prog="python -m bmv2_topologies.mooncake_reader",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--master", required=True, help="Mooncake master RPC address host:port")
    ap.add_argument("--metadata", required=True, help="its HTTP metadata URL")
    ap.add_argument("--local-hostname", required=True, help="this host's address")
    ap.add_argument("--keys", required=True, help="comma-separated chunk keys (hex), in prefix order")
    args = ap.parse_args(argv)
    try:
        keys = [int(k, 16) for k in args.keys.split(",")]
    except ValueError:
        ap.error(f"--keys: not comma-separated hex: {args.keys!r}")

    # Optional: the Mooncake wheel loads its native library; --help and bad arguments must not need it.
    from hostagent.mooncake_backend import MooncakeBackend

    try:
        store = MooncakeBackend(args.master, args.metadata, local_hostname=args.local_hostname,
                                local_buffer_bytes=64 << 20)
    except BackendError as exc:
        print(f"mooncake_reader: {exc}", file=sys.stderr)
        return 1
    with store:
        _say({"ready": args.local_hostname})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("quit"):
                break
            time.sleep(max(0.0, float(cmd["go"]) - time.time()))
            t0 = time.time()
            digests: list[str] = []
            try:
                for key in keys:
                    value = store.get(key)
                    if value is None:
                        raise BackendError(f"chunk {key:#018x} is not in the store")
                    digests.append(digest(value))
            except BackendError as exc:
                _say({"error": str(exc)})
                continue
            _say({"start": t0, "end": time.time(), "digests": digests})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
