"""A ChunkBackend on a real Mooncake Store: kvpool's remote DRAM tier.

The holder agent reads serialized chunks from here and serves them as kvpool packets. The
store decides what stays in its DRAM (lease, high-watermark eviction); kvpool decides what
is hot and what the switch holds (docs/guide/mooncake.md). A chunk the store no longer has is a
miss (``get`` returns None), never stale bytes.

The ``mooncake`` extension has no type stubs; everything it is asked goes through
``_Store`` below, the only place that touches it untyped. Every call runs on one worker
thread with a deadline: the library releases the GIL while it waits, but some calls block
far longer than a holder may (``setup`` against a dead master takes about 90 s, each call
after the master dies about 4 s), so a late call raises ``BackendError`` instead. ``setup``
itself holds the GIL, so instead the master is probed before it.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from hostagent.backend import BackendError
from hostagent.mooncake_master import MIN_SEGMENT_BYTES

if TYPE_CHECKING:
    from hostagent.mooncake_master import MooncakeMaster

T = TypeVar("T")

KEY_PREFIX = "kvpool/"

# mooncake-store/include/types.h, ErrorCode: the ones a holder can meet.
OK = 0
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
REPLICA_IS_NOT_READY = -703
OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706
REPLICA_IS_GONE = -712
TRANSFER_FAIL = -800
RPC_FAIL = -900
ERROR_NAMES: dict[int, str] = {
    -1: "INTERNAL_ERROR",
    -10: "BUFFER_OVERFLOW",
    -101: "SEGMENT_NOT_FOUND",
    -103: "CLIENT_NOT_FOUND",
    NO_AVAILABLE_HANDLE: "NO_AVAILABLE_HANDLE (store full, nothing evictable)",
    -400: "INVALID_KEY",
    -500: "WRITE_FAIL",
    INVALID_PARAMS: "INVALID_PARAMS",
    -601: "ILLEGAL_CLIENT",
    -700: "INVALID_WRITE",
    -701: "INVALID_READ",
    -702: "INVALID_REPLICA",
    REPLICA_IS_NOT_READY: "REPLICA_IS_NOT_READY",
    OBJECT_NOT_FOUND: "OBJECT_NOT_FOUND",
    -705: "OBJECT_ALREADY_EXISTS",
    OBJECT_HAS_LEASE: "OBJECT_HAS_LEASE",
    -707: "LEASE_EXPIRED",
    -710: "REPLICA_NOT_FOUND",
    REPLICA_IS_GONE: "REPLICA_IS_GONE",
    TRANSFER_FAIL: "TRANSFER_FAIL (store node unreachable?)",
    RPC_FAIL: "RPC_FAIL (master unreachable?)",
}
# Read results that mean "the store does not have this chunk (any more)": the holder NACKs.
_MISSING = frozenset({OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY, REPLICA_IS_GONE})


def error_name(code: int) -> str:
    """Readable name of a Mooncake error code."""
    return f"{ERROR_NAMES.get(code, 'error')} ({code})"


def store_key(key: int) -> str:
    """The Mooncake object key of a 64-bit chunk key."""
    if not 0 <= key < 1 << 64:
        raise ValueError(f"chunk key must be an unsigned 64-bit integer, got {key}")
    return f"{KEY_PREFIX}{key:016x}"


def _probe(address: str, what: str, timeout: float) -> None:
    """BackendError unless ``host:port`` accepts a TCP connection within ``timeout``."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise BackendError(f"mooncake: {what} address {address!r} is not host:port")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise BackendError(f"mooncake: {what} at {address} unreachable ({exc}); is mooncake_master running?") from exc


class _Worker:
    """One daemon thread that runs library calls in order, each waited for with a deadline.

    A daemon thread rather than a ThreadPoolExecutor: a call stuck in C++ must not keep
    the interpreter from exiting.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._busy: Future[Any] | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        """Run jobs until the None sentinel."""
        while (job := self._jobs.get()) is not None:
            fn, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

    def call(self, fn: Callable[[], T], timeout: float, what: str) -> T:
        """Run ``fn`` on the worker; BackendError if it does not finish in ``timeout`` seconds."""
        if self._busy is not None and not self._busy.done():
            # An earlier call is still stuck in the library: fail fast rather than queue.
            raise BackendError(f"mooncake: {what} refused, an earlier call is still blocked in the store client")
        fut: Future[T] = Future()
        self._jobs.put((fn, fut))
        try:
            return fut.result(timeout=timeout)
        except FutureTimeout:
            self._busy = fut
            raise BackendError(f"mooncake: {what} timed out after {timeout:g} s (master or store node down?)") from None

    def stop(self) -> None:
        """Let the thread finish after the jobs already queued."""
        self._jobs.put(None)


class _Store:
    """Typed wrapper over ``mooncake.store.MooncakeDistributedStore`` (untyped pybind11)."""

    def __init__(self) -> None:
        # Quieter than glog's default INFO chatter on stderr; the environment can override it.
        os.environ.setdefault("GLOG_minloglevel", "2")
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as exc:
            raise BackendError(
                f"mooncake store client unavailable ({exc}): install mooncake-transfer-engine-non-cuda"
            ) from exc
        self._s: Any = MooncakeDistributedStore()
        self._config: Any = None  # ReplicateConfig of every upsert; None: Mooncake's default

    def prefer_segment(self, segment: str) -> None:
        """Allocate what this client writes on ``segment`` (a store node's ``host:port``) when it has room."""
        from mooncake.store import ReplicateConfig

        config = ReplicateConfig()
        config.preferred_segment = segment
        self._config = config

    def setup(
        self, local_hostname: str, metadata_url: str, segment_bytes: int, local_buffer_bytes: int, master_address: str
    ) -> int:
        """Connect over TCP; returns 0 or a negative code."""
        return int(
            self._s.setup(local_hostname, metadata_url, segment_bytes, local_buffer_bytes, "tcp", "", master_address)
        )

    def register_buffer(self, addr: int, size: int) -> int:
        """Register memory for get_into / put_from."""
        return int(self._s.register_buffer(addr, size))

    def unregister_buffer(self, addr: int) -> int:
        """Unregister memory registered before."""
        return int(self._s.unregister_buffer(addr))

    def upsert(self, key: str, data: bytes | memoryview) -> int:
        """Insert or replace from any buffer (staged through the client's local buffer)."""
        if self._config is None:
            return int(self._s.upsert(key, data))
        return int(self._s.upsert(key, data, self._config))

    def upsert_from(self, key: str, addr: int, size: int) -> int:
        """Insert or replace from registered memory."""
        if self._config is None:
            return int(self._s.upsert_from(key, addr, size))
        return int(self._s.upsert_from(key, addr, size, self._config))

    def get(self, key: str) -> bytes:
        """The value, or b"" when missing or on any error."""
        return bytes(self._s.get(key))

    def get_into(self, key: str, addr: int, size: int) -> int:
        """Read into registered memory; the length or a negative code."""
        return int(self._s.get_into(key, addr, size))

    def get_size(self, key: str) -> int:
        """The value's length or a negative code."""
        return int(self._s.get_size(key))

    def is_exist(self, key: str) -> int:
        """1 present, 0 absent, negative on error."""
        return int(self._s.is_exist(key))

    def remove(self, key: str, force: bool) -> int:
        """Remove; ``force`` ignores the read lease."""
        return int(self._s.remove(key, force))

    def replica_segments(self, key: str) -> list[str]:
        """The segments (``host:port``) holding the key's memory replicas; empty when it has none."""
        return [str(r.get_memory_descriptor().buffer_descriptor.transport_endpoint)
                for r in self._s.get_replica_desc(key) if r.is_memory_replica()]

    def hostname(self) -> str:
        """This client's segment name (host:port)."""
        return str(self._s.get_hostname())

    def close(self) -> int:
        """Unmount and disconnect."""
        return int(self._s.close())


class MooncakeBackend:
    """Serialized chunks in a Mooncake Store, reached over TCP (hostagent.backend.ChunkBackend).

    ``segment_bytes`` > 0 also contributes that much of this process's DRAM to the pool
    (the process becomes a store node as well); 0 makes a pure client of the pool held by
    ``mooncake_client`` store nodes. ``zero_copy`` reads and writes through a registered
    buffer of this process (``get_into`` / ``upsert_from``), which also lifts the
    ``local_buffer_bytes`` limit on value size; otherwise the plain ``get`` / ``upsert``.
    ``preferred_segment`` (a store node's segment name, ``host:port``) is where this client's
    writes are allocated while it has room: a holder keeps what it publishes on its own
    host's store node, and reads it back without crossing the network.
    """

    name = "mooncake"

    def __init__(
        self,
        master_address: str,
        metadata_url: str,
        *,
        local_hostname: str = "127.0.0.1",
        segment_bytes: int = 0,
        local_buffer_bytes: int = 32 << 20,
        zero_copy: bool = True,
        call_timeout: float = 10.0,
        setup_timeout: float = 15.0,
        full_retry_s: float = 1.0,
        preferred_segment: str | None = None,
    ) -> None:
        if segment_bytes < 0 or local_buffer_bytes < 0 or call_timeout <= 0 or setup_timeout <= 0 or full_retry_s < 0:
            raise ValueError("sizes and full_retry_s must be >= 0, timeouts > 0")
        if 0 < segment_bytes < MIN_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes must be 0 or at least {MIN_SEGMENT_BYTES} (16 MiB), got {segment_bytes}")
        host = local_hostname.split(":")[0]
        if segment_bytes and host in ("", "0.0.0.0"):
            # Peers read a lent segment at the advertised address; a pure client only
            # initiates transfers, so its address is just a name (checked across netns).
            raise ValueError("local_hostname must be an address peers can reach when segment_bytes > 0")
        self.master_address = master_address
        self.metadata_url = metadata_url
        self.zero_copy = zero_copy
        self.call_timeout = call_timeout
        self.full_retry_s = full_retry_s
        self._local_buffer_bytes = local_buffer_bytes
        self._lock = threading.Lock()
        self._closed = False
        self._buf: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        # The transfer engine advertises MC_TCP_BIND_ADDRESS, else the first non-loopback
        # interface: pin it to the address we were given so loopback runs stay on loopback
        # and Mininet runs use the host's own interface.
        os.environ["MC_TCP_BIND_ADDRESS"] = host
        # setup() holds the GIL while it retries a dead master for ~90 s, so no deadline
        # can cut it: check first that the master's two servers accept connections.
        _probe(master_address, "master RPC", min(setup_timeout, 3.0))
        _probe(urllib.parse.urlsplit(metadata_url).netloc, "HTTP metadata server", min(setup_timeout, 3.0))
        self._store = _Store()
        if preferred_segment:
            self._store.prefer_segment(preferred_segment)
        self._worker = _Worker(f"mooncake-{local_hostname}")
        rc = self._worker.call(
            lambda: self._store.setup(local_hostname, metadata_url, segment_bytes, local_buffer_bytes, master_address),
            setup_timeout,
            f"setup with master {master_address}",
        )
        if rc != OK:
            self._worker.stop()
            raise BackendError(
                f"mooncake: setup with master {master_address}, metadata {metadata_url} failed: {error_name(rc)}"
            )
        self.hostname = self._call(self._store.hostname, "get_hostname")

    @classmethod
    def for_master(cls, master: MooncakeMaster, **kwargs: Any) -> MooncakeBackend:
        """A backend connected to a ``MooncakeMaster`` started by this process."""
        return cls(master.rpc_address, master.metadata_url, **kwargs)

    # -- plumbing -----------------------------------------------------------------------
    def _call(self, fn: Callable[[], T], what: str) -> T:
        """Run one library call on the worker with the call deadline."""
        if self._closed:
            raise BackendError("mooncake: backend is closed")
        return self._worker.call(fn, self.call_timeout, what)

    def _buffer(self, size: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The registered buffer, grown to hold ``size`` bytes (runs on the worker)."""
        if self._buf is not None and self._buf.nbytes >= size:
            return self._buf
        if self._buf is not None:
            self._store.unregister_buffer(self._buf.ctypes.data)
        capacity = 1 << max(20, (size - 1).bit_length())
        buf = np.empty(capacity, np.uint8)
        rc = self._store.register_buffer(buf.ctypes.data, capacity)
        if rc != OK:
            self._buf = None
            raise BackendError(f"mooncake: register_buffer of {capacity} bytes failed: {error_name(rc)}")
        self._buf = buf
        return buf

    # -- ChunkBackend ---------------------------------------------------------------------
    def put(self, key: int, data: bytes | memoryview) -> None:
        """Store ``data`` under ``key``, replacing any previous value (Mooncake upsert)."""
        skey = store_key(key)
        view = memoryview(data).cast("B")
        size = view.nbytes
        if size == 0:
            raise BackendError(f"mooncake: chunk {key:#x} is empty; Mooncake cannot store empty values")
        if not self.zero_copy and size > self._local_buffer_bytes:
            raise BackendError(
                f"mooncake: chunk {key:#x} of {size} bytes exceeds local_buffer_bytes {self._local_buffer_bytes}"
            )

        def run() -> int:
            if not self.zero_copy:
                return self._store.upsert(skey, view)
            buf = self._buffer(size)
            buf[:size] = np.frombuffer(view, np.uint8)
            return self._store.upsert_from(skey, buf.ctypes.data, size)

        # A full pool answers NO_AVAILABLE_HANDLE and flags the master's eviction thread,
        # which runs every 10 ms: retry for a while before calling the pool full.
        deadline = time.monotonic() + self.full_retry_s
        while True:
            with self._lock:
                rc = self._call(run, f"put {skey}")
            if rc != NO_AVAILABLE_HANDLE or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        if rc != OK:
            raise BackendError(f"mooncake: put {skey} ({size} bytes) failed: {error_name(rc)}")

    def segments_of(self, key: int) -> list[str]:
        """Which store nodes hold ``key`` (their segment names, ``host:port``); empty when none does."""
        skey = store_key(key)
        with self._lock:
            return self._call(lambda: self._store.replica_segments(skey), f"get_replica_desc {skey}")

    def get(self, key: int) -> bytes | None:
        """The stored bytes, or None when the store does not have them (missing or evicted)."""
        skey = store_key(key)
        with self._lock:
            code, data = self._call(lambda: self._get(skey), f"get {skey}")
        if code in _MISSING:
            return None
        if code != OK:
            raise BackendError(f"mooncake: get {skey} failed: {error_name(code)}")
        return data

    def _get(self, skey: str) -> tuple[int, bytes | None]:
        """(OK, bytes) or (code, None); runs on the worker."""
        if not self.zero_copy:
            data = self._store.get(skey)
            if data:
                return OK, data
            # b"" means missing *or* failed: ask again to tell them apart.
            present = self._store.is_exist(skey)
            if present == 0:
                return OBJECT_NOT_FOUND, None
            return (present if present < 0 else INVALID_PARAMS), None
        buf = self._buffer(1)
        n = self._store.get_into(skey, buf.ctypes.data, buf.nbytes)
        if n == INVALID_PARAMS:
            # Most likely larger than our buffer: grow to its size and read again.
            size = self._store.get_size(skey)
            if size < 0:
                return size, None
            if size <= buf.nbytes:
                return INVALID_PARAMS, None
            buf = self._buffer(size)
            n = self._store.get_into(skey, buf.ctypes.data, buf.nbytes)
        if n < 0:
            return n, None
        return OK, buf[:n].tobytes()

    def delete(self, key: int) -> None:
        """Remove ``key`` now, even while a reader's lease holds it; missing is fine."""
        skey = store_key(key)
        with self._lock:
            rc = self._call(lambda: self._store.remove(skey, True), f"delete {skey}")
        if rc not in (OK, OBJECT_NOT_FOUND):
            raise BackendError(f"mooncake: delete {skey} failed: {error_name(rc)}")

    def contains(self, key: int) -> bool:
        """Whether the store has ``key`` right now (it may be evicted a moment later)."""
        skey = store_key(key)
        with self._lock:
            rc = self._call(lambda: self._store.is_exist(skey), f"is_exist {skey}")
        if rc < 0:
            raise BackendError(f"mooncake: is_exist {skey} failed: {error_name(rc)}")
        return rc == 1

    def close(self) -> None:
        """Disconnect from the store (a segment of this process leaves the pool); idempotent."""
        if self._closed:
            return
        with self._lock:
            try:
                self._call(self._close, "close")
            except BackendError:
                pass  # a dead master cannot be told goodbye; the process-local state is dropped anyway
            finally:
                self._closed = True
                self._worker.stop()

    def _close(self) -> None:
        """Unregister the buffer and close the client; runs on the worker."""
        if self._buf is not None:
            self._store.unregister_buffer(self._buf.ctypes.data)
            self._buf = None
        self._store.close()

    def __enter__(self) -> MooncakeBackend:
        """Use as a context manager."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close on exit."""
        self.close()
