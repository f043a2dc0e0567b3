"""P4Runtime driver: the controller's connection to one switch (BMv2 or the model).

Callers speak names (tables, match fields, actions, parameters, counters, digests from the
P4Info) and plain values (ints, IP/MAC strings); the driver encodes them to the widths the
P4Info gives and ships batched P4Runtime writes. It keeps the *intended* state (entries,
default actions, multicast groups, digest config) and, after a dropped channel or a
restarted switch, reconnects (with backoff, for ever), pushes the pipeline if the switch
lost it and makes the switch match the intended state again (read, diff, write).

Every failure is a :class:`P4RuntimeError` naming the switch and the gRPC code:
:class:`SwitchUnreachableError` (no answer, or the connection dropped during the call:
its answer is discarded), :class:`NotMasterError`, :class:`NoPipelineError` (the switch
runs no pipeline: it restarted), :class:`WriteError` (updates the switch rejected) and
:class:`P4RuntimeCallError` (anything else). A caller that keeps running through a
switch's trouble catches the base class.

Switch instances: the pipeline cookie is the pipeline's 40-bit hash plus a nonce drawn at
each push. On every (re)connect the driver reads the switch's cookie: none (a restarted
switch), another pipeline's, or ours with another nonce (someone else pushed it, maybe
after a restart) means a new instance, counted in :attr:`P4RuntimeSwitch.instance` so
that the owner can reset what it keeps about the switch's registers and counters; ours
with our nonce is the instance we knew. :meth:`P4RuntimeSwitch.health` says whether the
switch is up, down since when, resyncing, and the last error.

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

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from kvpool import contract
from kvpool.p4rt import codec

# The value types both ends exchange live in the codec: one definition for the driver and the switch.
from kvpool.p4rt.codec import CodecError, EntryKey, MatchValue, TableEntry, Value
from kvpool.p4rt.codec import CounterValue as CounterValue
from kvpool.p4rt.codec import DigestConfig as DigestConfig
from kvpool.p4rt.p4info import P4Info, P4InfoError, TableInfo

log = logging.getLogger(__name__)

_UPDATE_NAMES = {v: k for k, v in p4runtime_pb2.Update.Type.items()}


class P4RuntimeError(Exception):
    """A P4Runtime call to a switch failed; ``code`` is the gRPC status name, ``address`` the switch."""

    def __init__(self, message: str, code: str = "UNKNOWN", address: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.address = address


class SwitchUnreachableError(P4RuntimeError, ConnectionError):
    """The switch did not answer, or the connection dropped during the call (its answer was discarded)."""


class NotMasterError(P4RuntimeError, PermissionError):
    """This controller lost (or never won) arbitration: another has a higher election id."""


class NoPipelineError(P4RuntimeError):
    """The switch runs no forwarding pipeline (FAILED_PRECONDITION): it restarted and nobody pushed one yet."""


class P4RuntimeCallError(P4RuntimeError):
    """The switch refused a call for another reason (the message has the gRPC code and details)."""


@dataclass(frozen=True)
class UpdateError:
    """Why the switch rejected one update of a batch."""

    index: int
    update: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"#{self.index} {self.update}: {self.code}: {self.message}"


class WriteError(P4RuntimeError, RuntimeError):
    """The switch rejected some updates of a write; ``errors`` has one UpdateError per rejected update."""

    def __init__(self, address: str, total: int, errors: list[UpdateError]) -> None:
        self.errors = errors
        lines = "\n  ".join(str(e) for e in errors)
        super().__init__(f"switch {address} rejected {len(errors)} of {total} update(s):\n  {lines}",
                         errors[0].code if errors else "UNKNOWN", address)

    @property
    def codes(self) -> list[str]:
        """Status code names of the rejected updates, in batch order."""
        return [e.code for e in self.errors]


@dataclass(frozen=True)
class Entry:
    """A table entry by names: table, match field -> value, action and its parameters, priority."""

    table: str
    match: Mapping[str, MatchValue]
    action: str = ""
    params: Mapping[str, Value] = field(default_factory=dict)
    priority: int = 0

    def describe(self) -> str:
        """One-line text form for error messages."""
        match = codec.describe_match(self.match)
        return f"{self.table} {{{match}}}" + (f" prio {self.priority}" if self.priority else "")


@dataclass(frozen=True)
class Digest:
    """One DigestList from the switch: digest name, list id and the items (member name -> value)."""

    name: str
    list_id: int
    items: list[dict[str, int]]
    timestamp_ns: int


@dataclass(frozen=True)
class PacketIn:
    """A packet sent to the controller, with its ``packet_in`` header fields by name."""

    payload: bytes
    metadata: dict[str, int]


# Normalized, hashable identity of a table entry: (table, the codec's entry key).
_Key = tuple[str, EntryKey]


@dataclass(frozen=True)
class _Update:
    """One update to send: its type, how to fill a p4.v1.Update in place, a text for errors.

    Filling in place avoids a copy per update: the protobuf runtime here is the pure-Python
    one (protobuf < 3.21 has no C++ wheel for Python 3.11), where copies dominate batch cost.
    """

    type: int
    fill: Callable[[Any], None]
    desc: str


def _prebuilt(update: Any, desc: str) -> _Update:
    return _Update(int(update.type), lambda target: target.CopyFrom(update), desc)


@dataclass
class _Intended:
    """What the controller wants on the switch; replayed after a reconnect."""

    entries: dict[_Key, Entry] = field(default_factory=dict)
    defaults: dict[str, tuple[str, dict[str, int]]] = field(default_factory=dict)
    groups: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    digests: dict[str, DigestConfig] = field(default_factory=dict)


#: Low bits of a pipeline cookie: a nonce drawn at each push (the high 40 bits name the pipeline).
NONCE_BITS = 23


def pipeline_id(p4info: bytes, device_config: bytes) -> int:
    """40-bit hash naming a pipeline (P4Info + device config): the high bits of every cookie we push."""
    return int.from_bytes(hashlib.blake2b(p4info + b"\0" + device_config, digest_size=5).digest(), "big")


def make_cookie(pipeline: int, nonce: int | None = None) -> int:
    """A pipeline cookie: ``pipeline`` (40 bits) and a push nonce (random when None); below 2**63."""
    if nonce is None:
        nonce = secrets.randbits(NONCE_BITS)
    return (pipeline << NONCE_BITS) | (nonce & ((1 << NONCE_BITS) - 1))


def channel_options(max_backoff_s: float) -> list[tuple[str, int]]:
    """gRPC channel arguments for a switch connection: big messages, and reconnects at the driver's pace.

    gRPC's own defaults retry a refused connect after 1 s, then 1.6x longer each time (up to
    120 s), and share one subchannel (and its backoff) among a process's channels to the same
    address. A switch down for 6 s was then found 3-4 s after it listened again, one down for
    9 s only after ``channel_ready_future`` gave up (10 s) and a fresh channel tried. Here a
    channel of its own retries after 0.1 s, backs off to at most ``max_backoff_s`` and gives
    up a hung connect attempt after 1 s, so the driver sees a restarted switch within about
    ``max_backoff_s`` of its listening however long it was away.
    """
    max_ms = max(100, int(max_backoff_s * 1000))
    return [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20),
            ("grpc.use_local_subchannel_pool", 1), ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 1000), ("grpc.max_reconnect_backoff_ms", max_ms)]


class P4RuntimeSwitch:
    """A P4Runtime client for one switch, addressed by P4Info names (see the module docstring).

    ``wait_ready_s`` bounds how long a call waits for a reconnect in progress (default
    ``timeout_s``; 0 fails at once). With ``defer_writes`` a write made while the switch is
    down, or one the connection drops, only changes the intended state, which the resync
    after the reconnect applies: the owner keeps going through a switch's restart.
    """

    def __init__(
        self,
        address: str,
        p4info: str | Path | P4Info,
        device_config: str | Path | bytes | None = None,
        device_id: int = 1,
        election_id: tuple[int, int] = (0, 1),
        timeout_s: float = 5.0,
        reconnect: bool = True,
        batch_size: int = 512,
        on_digest: Callable[[Digest], None] | None = None,
        wait_ready_s: float | None = None,
        defer_writes: bool = False,
        max_backoff_s: float = 2.0,
        check_interval_s: float = 2.0,
    ) -> None:
        self.address = address
        self.p4info = p4info if isinstance(p4info, P4Info) else P4Info.load(p4info)
        if device_config is None:
            self.device_config = b""
        elif isinstance(device_config, bytes):
            self.device_config = device_config
        else:
            self.device_config = Path(device_config).read_bytes()
        self.device_id = device_id
        self.election_id = election_id
        self.timeout_s = timeout_s
        self.reconnect = reconnect
        self.batch_size = batch_size
        self.on_digest = on_digest
        self.wait_ready_s = timeout_s if wait_ready_s is None else wait_ready_s
        self.defer_writes = defer_writes
        self.max_backoff_s = max_backoff_s
        self.check_interval_s = check_interval_s
        #: Digest lists received (already acked to the switch), oldest first.
        self.digests: queue.Queue[Digest] = queue.Queue()
        #: PacketIns received, oldest first.
        self.packet_ins: queue.Queue[PacketIn] = queue.Queue()
        #: Reconnects performed (each followed by a resync).
        self.reconnects = 0
        #: Switch instances seen: bumped when the switch runs no pipeline, another one, or ours
        #: pushed by someone else (a restart); its registers and counters started from zero.
        self.instance = 0
        #: Whether the first connect found this pipeline already running (a warm switch).
        self.adopted = False
        self.pipeline_id = pipeline_id(self.p4info.message.SerializeToString(deterministic=True),
                                       self.device_config)
        #: The cookie of the pipeline instance this driver knows (pushed or adopted).
        self.cookie = make_cookie(self.pipeline_id)
        self._intended = _Intended()
        self._lock = threading.RLock()  # guards the intended state and serialises writes with resync
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._requests: queue.Queue[Any] | None = None
        self._arbitration: queue.Queue[Any] = queue.Queue()
        self._connected = threading.Event()  # stream up and arbitration answered
        self._ready = threading.Event()  # connected and resynced: callers may use the switch
        self._resync_thread: int | None = None
        self._lost = threading.Event()
        self._closed = threading.Event()
        self._is_master = False
        self._promoted = threading.Event()  # became master after being a backup: resync due
        self._manage = True  # resync (pipeline + state) on connect, reconnect and promotion
        self._watcher: threading.Thread | None = None
        self._session = 0  # bumped at every successful open: a call spans one session or fails
        self._ever_connected = False
        self._down_since: float | None = time.time()
        self._last_error: str | None = None
        self._resyncing = False
        self._pending = False  # intended state changed while the switch was down

    @classmethod
    def for_kvpool(cls, address: str, **kwargs: Any) -> P4RuntimeSwitch:
        """A driver for the kvpool program, with P4Info and BMv2 JSON from p4/build/."""
        if not contract.P4INFO_PATH.exists():
            raise FileNotFoundError(f"{contract.P4INFO_PATH} is missing: compile p4/ with `make -C p4`")
        json_path = contract.BMV2_JSON_PATH
        return cls(address, contract.P4INFO_PATH, json_path if json_path.exists() else None, **kwargs)

    # --- connection ------------------------------------------------------------------------------

    @property
    def is_master(self) -> bool:
        """True while this controller holds mastership of the switch."""
        return self._is_master and self._connected.is_set()

    @property
    def connected(self) -> bool:
        """True while the stream channel to the switch is up."""
        return self._connected.is_set()

    @property
    def ready(self) -> bool:
        """True while the switch is connected and resynced: calls go through now."""
        return self._ready.is_set()

    def health(self) -> dict[str, Any]:
        """For status: state (up, backup, resyncing, connecting, down), down since, last error, counts."""
        if self._ready.is_set():
            state = "up" if self._is_master or not self._manage else "backup"
        elif self._resyncing:
            state = "resyncing"
        elif self._connected.is_set():
            state = "connecting"
        else:
            state = "down"
        return {"state": state, "down_since": None if state in ("up", "backup") else self._down_since,
                "last_error": self._last_error, "reconnects": self.reconnects, "instance": self.instance,
                "adopted": self.adopted}

    def runs_our_pipeline(self, cookie: int | None) -> bool:
        """True when ``cookie`` names this driver's pipeline (whoever pushed it)."""
        return cookie is not None and cookie >> NONCE_BITS == self.pipeline_id

    def connect(self, push_pipeline: bool = True, retry_in_background: bool = False) -> P4RuntimeSwitch:
        """Open the channel, win arbitration, push the pipeline if needed and resync; returns self.

        Raises SwitchUnreachableError when the switch does not answer within ``timeout_s`` and
        NotMasterError when a controller with a higher election id holds the switch. With
        ``retry_in_background`` an unreachable switch is retried for ever by the watcher
        (the error is still raised, so the caller can say so).
        """
        self._closed.clear()
        self._manage = push_pipeline
        try:
            self._open()
        except NotMasterError:
            self._ready.set()  # a backup may still read, and is resynced if promoted
            self._start_watcher()
            raise
        except SwitchUnreachableError as e:
            self._note_error(e)
            if retry_in_background and self.reconnect:
                self._lost.set()
                self._start_watcher()
            raise
        if push_pipeline:
            self._resync_as_owner(mark_ready=True)
        else:
            self._ready.set()
            self._down_since = None
        self._start_watcher()
        return self

    def _start_watcher(self) -> None:
        if self.reconnect and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name=f"p4rt-watch-{self.address}", daemon=True)
            self._watcher.start()

    def _note_error(self, e: BaseException) -> None:
        self._last_error = str(e).splitlines()[0] if str(e) else type(e).__name__

    def _mark_lost(self, why: str) -> None:
        """The session is gone (stream dropped, or the switch does not know us): reconnect."""
        if self._connected.is_set() or self._ready.is_set():
            log.warning("switch %s: connection lost (%s)", self.address, why)
        self._last_error = why
        self._connected.clear()
        self._ready.clear()
        self._is_master = False
        if self._down_since is None:
            self._down_since = time.time()
        self._lost.set()

    def _open(self) -> None:
        self._teardown()
        channel = grpc.insecure_channel(self.address, options=channel_options(self.max_backoff_s))
        try:
            grpc.channel_ready_future(channel).result(timeout=self.timeout_s)
        except grpc.FutureTimeoutError:
            channel.close()
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address} did not answer within "
                                         f"{self.timeout_s:.1f} s (is simple_switch_grpc or kvpool-switch running "
                                         "there?)", "UNAVAILABLE", self.address) from None
        self._channel = channel
        self._stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
        requests: queue.Queue[Any] = queue.Queue()
        self._requests = requests
        self._arbitration = queue.Queue()

        def request_iter() -> Iterator[Any]:
            while True:
                msg = requests.get()
                if msg is None:
                    return
                yield msg

        stream = self._stub.StreamChannel(request_iter())
        threading.Thread(target=self._receive, args=(stream, requests), name=f"p4rt-recv-{self.address}",
                         daemon=True).start()
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = self.device_id
        req.arbitration.election_id.high, req.arbitration.election_id.low = self.election_id
        requests.put(req)
        try:
            reply = self._arbitration.get(timeout=self.timeout_s)
        except queue.Empty:
            self._teardown()
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address}: no arbitration reply within "
                                         f"{self.timeout_s:.1f} s", "DEADLINE_EXCEEDED", self.address) from None
        if reply is None:
            self._teardown()
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address} closed the stream before "
                                         "arbitration", "UNAVAILABLE", self.address)
        if isinstance(reply, grpc.RpcError):
            self._teardown()
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address} refused the stream: "
                                         f"{reply.code().name}: {reply.details()}", reply.code().name, self.address)
        self._session += 1
        self._lost.clear()
        self._connected.set()
        if not self._is_master:
            raise NotMasterError(f"switch {self.address}: election id {self.election_id} is not the highest "
                                 f"({reply.arbitration.status.message}); this controller is a backup",
                                 "PERMISSION_DENIED", self.address)

    def _receive(self, stream: Any, requests: queue.Queue[Any]) -> None:
        try:
            for msg in stream:
                kind = msg.WhichOneof("update")
                if kind == "arbitration":
                    was_master = self._is_master
                    self._is_master = msg.arbitration.status.code == code_pb2.OK
                    if self._is_master and not was_master and self._connected.is_set():
                        self._promoted.set()
                    self._arbitration.put(msg)
                elif kind == "digest":
                    self._handle_digest(msg.digest, requests)
                elif kind == "packet":
                    self._handle_packet_in(msg.packet)
                elif kind == "error":
                    log.warning("switch %s stream error: %s", self.address, msg.error.message)
        except grpc.RpcError as e:
            if not self._connected.is_set():
                self._arbitration.put(e)
            elif not self._closed.is_set():
                self._last_error = f"stream channel dropped ({e.code().name})"
        finally:
            self._arbitration.put(None)  # unblocks a connect waiting for its arbitration reply
            if self._requests is requests and not self._closed.is_set():
                self._mark_lost(self._last_error or "stream channel ended")

    def _handle_digest(self, msg: Any, requests: queue.Queue[Any]) -> None:
        try:
            info, items = codec.decode_digest_list(self.p4info, msg)
        except P4InfoError:
            log.warning("switch %s sent a digest with unknown id %d", self.address, msg.digest_id)
            return
        digest = Digest(info.name, int(msg.list_id), items, int(msg.timestamp))
        if self.on_digest is not None:
            try:
                self.on_digest(digest)
            except Exception:  # the callback's bug must not kill the stream
                log.exception("digest callback failed")
        else:
            self.digests.put(digest)
        ack = p4runtime_pb2.StreamMessageRequest()
        ack.digest_ack.digest_id = info.id
        ack.digest_ack.list_id = msg.list_id
        requests.put(ack)

    def _handle_packet_in(self, msg: Any) -> None:
        try:
            meta = codec.decode_packet_metadata(self.p4info, "packet_in", msg.metadata)
        except CodecError as e:  # the switch runs another program than our P4Info says
            log.warning("switch %s sent a packet-in this P4Info cannot read (%s); dropped", self.address, e)
            return
        self.packet_ins.put(PacketIn(bytes(msg.payload), meta))

    def _watch(self) -> None:
        """Reconnect + resync after a dropped channel (backoff, for ever); resync on promotion or a new instance."""
        delay = 0.1
        failures = 0
        next_check = time.monotonic() + self.check_interval_s
        while not self._closed.is_set():
            if self._promoted.is_set() and self._connected.is_set() and self._manage:
                self._promoted.clear()
                try:
                    self._resync_as_owner(mark_ready=True)
                    log.info("switch %s: promoted to master and resynced", self.address)
                except Exception as e:  # keep watching; the next promotion or reconnect retries
                    self._note_error(e)
                    log.warning("switch %s: resync after promotion failed: %s", self.address, e)
            if not self._lost.wait(timeout=0.1) or self._closed.is_set():
                if self._manage and self._ready.is_set() and time.monotonic() >= next_check:
                    next_check = time.monotonic() + self.check_interval_s
                    self._check_instance()
                continue
            try:
                self._open()
                if self._manage:
                    self._resync_as_owner(mark_ready=True)
                else:
                    self._ready.set()
                    self._down_since = None
                self.reconnects += 1
                log.info("switch %s: reconnected and resynced (instance %d)", self.address, self.instance)
                delay, failures = 0.1, 0
            except NotMasterError:
                # Connected as a backup: usable for reads; a promotion triggers the resync.
                self._ready.set()
                self.reconnects += 1
                log.info("switch %s: reconnected as backup", self.address)
            except Exception as e:  # anything else: the switch is not usable yet, try again later
                self._note_error(e)
                failures += 1
                # Say it once loudly, then quietly: a switch down for minutes must not flood the log.
                (log.warning if failures == 1 else log.debug)(
                    "switch %s: reconnect failed (%s); retrying in %.1f s", self.address,
                    str(e).splitlines()[0], delay)
                self._connected.clear()
                self._lost.set()
                # Jitter keeps many controllers (or switches) from retrying in lockstep.
                self._closed.wait(delay * random.uniform(0.8, 1.2))
                delay = min(self.max_backoff_s, delay * 2)

    def _check_instance(self) -> None:
        """Resync when the switch runs another pipeline instance than ours (pushed by someone else)."""
        # Under the lock: a push of ours in flight (clean_slate) changes the switch's cookie
        # before ours is updated, and BMv2 answers "none" while it loads the new program; read
        # then, either looked like someone else's push (a spurious resync and a new instance).
        with self._lock:
            try:
                cookie = self.switch_cookie()
            except P4RuntimeError as e:
                self._note_error(e)
                return
            ours = self.cookie
        if cookie == ours:
            return
        log.warning("switch %s: runs pipeline cookie %s, not ours (%#x): someone else pushed it; resyncing",
                    self.address, "none" if cookie is None else f"{cookie:#x}", ours)
        try:
            self._resync_as_owner(mark_ready=True)
        except Exception as e:
            self._note_error(e)
            self._mark_lost(f"resync after a foreign pipeline push failed: {self._last_error}")

    def wait_connected(self, timeout_s: float | None = None) -> bool:
        """Block until the switch is connected and resynced (after a reconnect); False on timeout."""
        return self._ready.wait(self.timeout_s if timeout_s is None else timeout_s)

    def _resync_as_owner(self, mark_ready: bool = False) -> None:
        """Resync holding the lock; ``mark_ready`` opens the switch to callers before the lock is released.

        Setting ready inside the lock is what makes deferred writes safe: a writer that sees
        the switch not ready (under the lock) knows a resync has still to run and will apply
        its change to the intended state.
        """
        with self._lock:
            self._resync_thread = threading.get_ident()
            self._resyncing = True
            try:
                self.resync()
                if mark_ready:
                    self._pending = False
                    self._ready.set()
                    self._down_since = None
            finally:
                self._resyncing = False
                self._resync_thread = None

    def _teardown(self) -> None:
        self._connected.clear()
        self._ready.clear()
        requests, self._requests = self._requests, None
        if requests is not None:
            requests.put(None)
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def close(self) -> None:
        """Close the stream and channel and stop reconnecting."""
        self._closed.set()
        self._lost.set()
        self._teardown()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
            self._watcher = None

    def __enter__(self) -> P4RuntimeSwitch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- RPC plumbing ----------------------------------------------------------------------------

    def _wait_ready(self) -> None:
        """Wait (outside the lock) for a reconnect + resync in progress, up to ``wait_ready_s``."""
        if self._resync_thread == threading.get_ident() or self._ready.is_set():
            return
        if self.wait_ready_s <= 0 or not self._ready.wait(self.wait_ready_s):
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address} is not connected"
                                         + (f" (waited {self.wait_ready_s:.1f} s for a reconnect)"
                                            if self.wait_ready_s > 0 else "")
                                         + (f"; last error: {self._last_error}" if self._last_error else ""),
                                         "UNAVAILABLE", self.address)

    def _require(self) -> tuple[Any, int]:
        """(stub, session) for a call made now: resync may use a connected switch, callers need a resynced one."""
        event = self._connected if self._resync_thread == threading.get_ident() else self._ready
        if not event.is_set():
            self._wait_ready()
        stub, session = self._stub, self._session
        if stub is None or not self._connected.is_set():
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address} is not connected", "UNAVAILABLE",
                                         self.address)
        return stub, session

    def _call(self, what: str, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(stub)`` within one session: if the connection dropped meanwhile, the answer is discarded.

        gRPC reconnects a channel by itself, so without this a call could reach a new switch
        process (a restarted switch) and read its empty state as ours.
        """
        stub, session = self._require()
        try:
            result = fn(stub)
        except grpc.RpcError as e:
            raise self._rpc_error(what, e) from None
        if session != self._session or not self._connected.is_set():
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address}: the connection dropped during "
                                         f"{what}; its answer was discarded (the switch may have restarted)",
                                         "UNAVAILABLE", self.address)
        return result

    def _election_msg(self, msg: Any) -> None:
        msg.high, msg.low = self.election_id

    def _rpc_error(self, what: str, e: grpc.RpcError) -> P4RuntimeError:
        code = e.code()
        name = code.name
        details = e.details()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            err: P4RuntimeError = SwitchUnreachableError(f"P4Runtime switch at {self.address} unavailable ({what}): "
                                                         f"{name}: {details}", name, self.address)
            self._mark_lost(f"{what}: {name}")
        elif code == grpc.StatusCode.PERMISSION_DENIED:
            err = NotMasterError(f"switch {self.address} refused {what}: {details}", name, self.address)
            if self._is_master:
                # We hold the primary's stream as far as we know: the switch answering is not the
                # one we arbitrated with (a restarted process behind a silently reconnected channel).
                self._mark_lost(f"{what} refused although this controller is primary (switch restarted?)")
        elif code == grpc.StatusCode.FAILED_PRECONDITION:
            err = NoPipelineError(f"switch {self.address}: {what} failed: the switch runs no pipeline ({details}); "
                                  "it restarted, a resync pushes ours", name, self.address)
            if self._manage:
                self._mark_lost(f"{what}: the switch runs no pipeline")
        else:
            err = P4RuntimeCallError(f"switch {self.address}: {what} failed: {name}: {details}", name, self.address)
        self._note_error(err)
        return err

    # --- pipeline --------------------------------------------------------------------------------

    def _pipeline_config(self, response_type: int) -> Any | None:
        """GetForwardingPipelineConfig's config (``response_type`` of it); None when the switch runs none."""
        req = p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=self.device_id, response_type=response_type)
        stub, session = self._require()
        try:
            resp = stub.GetForwardingPipelineConfig(req, timeout=self.timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return None
            raise self._rpc_error("GetForwardingPipelineConfig", e) from None
        if session != self._session:
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address}: the connection dropped while reading "
                                         "its pipeline config", "UNAVAILABLE", self.address)
        return resp.config

    def switch_cookie(self) -> int | None:
        """Cookie of the pipeline the switch runs; None when it runs none or one set without a cookie."""
        config = self._pipeline_config(p4runtime_pb2.GetForwardingPipelineConfigRequest.COOKIE_ONLY)
        if config is None or not config.HasField("cookie"):
            return None
        return int(config.cookie.cookie)

    def push_pipeline(self) -> None:
        """Push our pipeline (clearing the switch), then write the intended state back onto it."""
        self._wait_ready()
        with self._lock:
            self._push_pipeline()
            if self._intended.entries or self._intended.defaults or self._intended.groups or \
                    self._intended.digests:
                self.resync()

    def _has_pipeline(self) -> bool:
        """Whether the switch runs a pipeline at all (one pushed without a cookie counts)."""
        config = self._pipeline_config(p4runtime_pb2.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE)
        return config is not None and bool(config.HasField("p4info"))

    def _push_pipeline(self) -> None:
        """SetForwardingPipelineConfig(VERIFY_AND_COMMIT) with our P4Info, device config and a fresh cookie."""
        self._clear_multicast_groups()
        cookie = make_cookie(self.pipeline_id)
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        self._election_msg(req.election_id)
        req.config.p4info.CopyFrom(self.p4info.message)
        req.config.p4_device_config = self.device_config
        req.config.cookie.cookie = cookie
        self._call("SetForwardingPipelineConfig",
                   lambda stub: stub.SetForwardingPipelineConfig(req, timeout=max(self.timeout_s, 30.0)))
        self.cookie = cookie
        self.instance += 1  # a push clears the switch: registers and counters start from zero

    def _clear_multicast_groups(self) -> None:
        """Delete every multicast group the switch holds, before a pipeline push.

        A push should clear them, and on BMv2 (1.15.5 with PI) a read after it finds none, but
        BMv2's replication engine keeps the old groups' replicas; the groups written back after
        the push add theirs to the same group ids, so every release reached each waiter once
        more per push (3 copies after two modes of a testbed run; the same as
        p4lang/behavioral-model#891 for clone sessions).  Deleted first, nothing is left behind.
        """
        if not self._has_pipeline():
            return  # nothing pushed yet: no groups either (and a read would fail)
        groups = self.read_multicast_groups()
        if not groups:
            return
        errors = self._write([self._group_update(p4runtime_pb2.Update.DELETE, gid, ()) for gid in sorted(groups)])
        if errors:
            raise WriteError(self.address, len(groups), errors)

    # --- encoding --------------------------------------------------------------------------------

    def _table(self, name: str | int) -> TableInfo:
        return self.p4info.table(name)

    def _normalize(self, entry: Entry) -> tuple[_Key, Entry]:
        """Validate an entry against the P4Info; its identity key and a canonical copy (ints)."""
        t = self._table(entry.table)
        match = codec.user_match(t, entry.match)
        action_name, params = "", {}
        if entry.action:
            call = codec.action_call(self.p4info, entry.action, entry.params)
            action_name, params = call.action, dict(call.params)
        canon = Entry(t.name, {k: codec.match_value(m) for k, m in match.items()}, action_name, params,
                      entry.priority)
        return (t.name, codec.entry_key(t, match, entry.priority)), canon

    def _table_entry_pb(self, key: _Key, entry: Entry, out: Any) -> None:
        t = self._table(entry.table)
        match = dict(key[1][0])
        if entry.action:
            call = codec.action_call(self.p4info, entry.action, entry.params)
            codec.encode_table_entry(self.p4info, t, TableEntry(match, call, entry.priority), out)
        else:  # a DELETE: match and priority identify the entry
            codec.encode_entry_key(t, match, entry.priority, out)

    def _action_pb(self, action_name: str, params: Mapping[str, Value], out: Any) -> None:
        codec.encode_action(self.p4info, codec.action_call(self.p4info, action_name, params), out)

    # --- writes ----------------------------------------------------------------------------------

    def _write(self, updates: Sequence[_Update]) -> list[UpdateError]:
        """Send updates in batches; returns the rejected ones (index into ``updates``).

        A write the switch answered was applied by the switch we arbitrated with, whatever
        happens to the connection afterwards (a restarted process refuses our writes: it has
        no stream from us), so unlike a read it needs no session check.
        """
        stub, _ = self._require()
        errors: list[UpdateError] = []
        for start in range(0, len(updates), self.batch_size):
            chunk = updates[start:start + self.batch_size]
            req = p4runtime_pb2.WriteRequest(device_id=self.device_id)
            self._election_msg(req.election_id)
            for update in chunk:
                update.fill(req.updates.add())
            try:
                stub.Write(req, timeout=max(self.timeout_s, 30.0))
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNKNOWN:
                    raise self._rpc_error("Write", e) from None
                errors.extend(self._batch_errors(e, chunk, start))
        return errors

    @staticmethod
    def _batch_errors(e: grpc.RpcError, chunk: Sequence[_Update], start: int) -> list[UpdateError]:
        status = None
        for key, value in e.trailing_metadata() or ():
            if key == "grpc-status-details-bin":
                status = status_pb2.Status()
                status.ParseFromString(value)
        if status is None or len(status.details) != len(chunk):
            return [UpdateError(start + i, u.desc, "UNKNOWN", str(e.details())) for i, u in enumerate(chunk)]
        out = []
        for i, (detail, u) in enumerate(zip(status.details, chunk, strict=True)):
            err = p4runtime_pb2.Error()
            detail.Unpack(err)
            if err.canonical_code != code_pb2.OK:
                out.append(UpdateError(start + i, u.desc, code_pb2.Code.Name(err.canonical_code), str(err.message)))
        return out

    def write_updates(self, updates: Iterable[Any]) -> list[UpdateError]:
        """Send ``p4.v1.Update`` messages as they are, unchecked; returns the ones the switch rejected.

        For tests and tools that probe what a switch refuses: the updates bypass the P4Info
        checks and the intended state, but go out on this controller's own connection, the
        only one a switch takes writes from while this controller is primary.
        """
        batch = [_prebuilt(u, f"{_UPDATE_NAMES[int(u.type)]} {u.entity.WhichOneof('entity')}") for u in updates]
        return self._write(batch)

    def _entry_update(self, utype: int, key: _Key, entry: Entry) -> _Update:
        def fill(u: Any) -> None:
            u.type = utype
            self._table_entry_pb(key, entry, u.entity.table_entry)

        return _Update(utype, fill, f"{_UPDATE_NAMES[utype]} {entry.describe()}")

    def _deferred(self) -> bool:
        """With the lock held: True when a write should only change the intended state (switch not ready)."""
        return self.defer_writes and not self._ready.is_set() and self._resync_thread != threading.get_ident()

    def _wait_for_write(self) -> None:
        """Before taking the lock for a write: wait for a reconnect, unless writes are deferred meanwhile."""
        if not self.defer_writes:
            self._wait_ready()

    def _send(self, updates: Sequence[_Update], record: Callable[[set[int]], None]) -> None:
        """Write ``updates`` and ``record`` the accepted ones in the intended state (with the lock held).

        ``record`` gets the indexes the switch rejected. With ``defer_writes``, a switch that
        is down, or one that drops the connection, lost its pipeline or does not take our
        writes during the write, records every update: the resync after the reconnect (or
        after winning arbitration back) applies them.
        """
        if self._deferred():
            record(set())
            self._pending = True
            return
        try:
            errors = self._write(updates)
        except (SwitchUnreachableError, NoPipelineError, NotMasterError) as e:
            # NotMasterError too: a restarted switch refuses our writes until we arbitrate again,
            # and a controller that lost mastership writes its intended state when it wins it back.
            if not self.defer_writes:
                raise
            record(set())
            self._pending = True
            log.debug("switch %s: %d update(s) left for the resync (%s)", self.address, len(updates), e)
            return
        record({err.index for err in errors})
        if errors:
            raise WriteError(self.address, len(updates), errors)

    def _write_entries(self, utype: int, entries: Iterable[Entry]) -> None:
        self._wait_for_write()
        with self._lock:
            normalized = [self._normalize(e) for e in entries]
            for _, e in normalized:
                if utype != p4runtime_pb2.Update.DELETE and not e.action:
                    raise ValueError(f"{e.describe()}: an action is required")

            def record(failed: set[int]) -> None:
                for i, (key, e) in enumerate(normalized):
                    if i in failed:
                        continue
                    if utype == p4runtime_pb2.Update.DELETE:
                        self._intended.entries.pop(key, None)
                    else:
                        self._intended.entries[key] = e

            self._send([self._entry_update(utype, k, e) for k, e in normalized], record)

    def insert_entries(self, entries: Iterable[Entry]) -> None:
        """INSERT table entries in batches; WriteError lists the rejected ones (others stay applied)."""
        self._write_entries(p4runtime_pb2.Update.INSERT, entries)

    def modify_entries(self, entries: Iterable[Entry]) -> None:
        """MODIFY the action of existing entries, in batches."""
        self._write_entries(p4runtime_pb2.Update.MODIFY, entries)

    def delete_entries(self, entries: Iterable[Entry]) -> None:
        """DELETE entries (match + priority identify them; the action is ignored), in batches."""
        self._write_entries(p4runtime_pb2.Update.DELETE, entries)

    def insert_entry(self, table: str, match: Mapping[str, MatchValue], action: str,
                     params: Mapping[str, Value] | None = None, priority: int = 0) -> None:
        """INSERT one entry."""
        self.insert_entries([Entry(table, match, action, dict(params or {}), priority)])

    def modify_entry(self, table: str, match: Mapping[str, MatchValue], action: str,
                     params: Mapping[str, Value] | None = None, priority: int = 0) -> None:
        """MODIFY one entry."""
        self.modify_entries([Entry(table, match, action, dict(params or {}), priority)])

    def delete_entry(self, table: str, match: Mapping[str, MatchValue], priority: int = 0) -> None:
        """DELETE one entry."""
        self.delete_entries([Entry(table, match, priority=priority)])

    def set_default_action(self, table: str, action: str, params: Mapping[str, Value] | None = None) -> None:
        """MODIFY a table's default entry."""
        self._wait_for_write()
        with self._lock:
            t = self._table(table)
            call = codec.action_call(self.p4info, action, params)
            u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY)
            codec.encode_default_entry(self.p4info, t, call, u.entity.table_entry)

            def record(failed: set[int]) -> None:
                if not failed:
                    self._intended.defaults[t.name] = (call.action, dict(call.params))

            self._send([_prebuilt(u, f"MODIFY default of {t.name} -> {call.action}")], record)

    # --- multicast -------------------------------------------------------------------------------

    def _group_update(self, utype: int, gid: int, replicas: Sequence[tuple[int, int]]) -> _Update:
        u = p4runtime_pb2.Update(type=utype)
        codec.encode_multicast_group(gid, replicas, u.entity.packet_replication_engine_entry)
        return _prebuilt(u, f"{_UPDATE_NAMES[utype]} multicast group {gid} {list(replicas)}")

    def set_multicast_group(self, group_id: int, replicas: Iterable[tuple[int, int]]) -> None:
        """Create or replace multicast group ``group_id`` with (egress port, replica id) copies."""
        reps = tuple((int(p), int(r)) for p, r in replicas)
        self._wait_for_write()
        with self._lock:
            def record(failed: set[int]) -> None:
                if not failed:
                    self._intended.groups[group_id] = reps

            utype = p4runtime_pb2.Update.MODIFY if group_id in self._intended.groups else p4runtime_pb2.Update.INSERT
            try:
                self._send([self._group_update(utype, group_id, reps)], record)
            except WriteError as e:
                if e.errors[0].code not in ("ALREADY_EXISTS", "NOT_FOUND"):
                    raise
                # The switch disagrees with what we believed; take its word and retry the other way.
                other = p4runtime_pb2.Update.INSERT if utype == p4runtime_pb2.Update.MODIFY else \
                    p4runtime_pb2.Update.MODIFY
                self._send([self._group_update(other, group_id, reps)], record)

    def delete_multicast_group(self, group_id: int) -> None:
        """Delete a multicast group."""
        self._wait_for_write()
        with self._lock:
            def record(failed: set[int]) -> None:
                if not failed:
                    self._intended.groups.pop(group_id, None)

            self._send([self._group_update(p4runtime_pb2.Update.DELETE, group_id, ())], record)

    # --- digests ---------------------------------------------------------------------------------

    def _digest_update(self, utype: int, name: str, config: DigestConfig) -> _Update:
        u = p4runtime_pb2.Update(type=utype)
        codec.encode_digest_entry(self.p4info.digest(name), config, u.entity.digest_entry)
        return _prebuilt(u, f"{_UPDATE_NAMES[utype]} digest {name}")

    def configure_digest(self, name: str, max_timeout_ns: int = 0, max_list_size: int = 1,
                         ack_timeout_ns: int = 1_000_000_000) -> None:
        """Enable (or reconfigure) a digest; its lists arrive in :attr:`digests` or ``on_digest``."""
        info = self.p4info.digest(name)
        config = DigestConfig(max_timeout_ns, max_list_size, ack_timeout_ns)
        self._wait_for_write()
        with self._lock:
            def record(failed: set[int]) -> None:
                if not failed:
                    self._intended.digests[info.name] = config

            utype = p4runtime_pb2.Update.MODIFY if info.name in self._intended.digests else \
                p4runtime_pb2.Update.INSERT
            self._send([self._digest_update(utype, info.name, config)], record)

    # --- reads -----------------------------------------------------------------------------------

    def _read(self, entities: Iterable[Any]) -> list[Any]:
        req = p4runtime_pb2.ReadRequest(device_id=self.device_id)
        for e in entities:
            req.entities.append(e)
        result: list[Any] = self._call("Read", lambda stub: [
            e for resp in stub.Read(req, timeout=max(self.timeout_s, 30.0)) for e in resp.entities])
        return result

    def _decode_entry(self, te: Any) -> Entry:
        # A default entry has no match; any other entry the switch returns has its exact fields.
        t, e = codec.decode_table_entry(self.p4info, te, require_exact=not te.is_default_action)
        return Entry(t.name, {k: codec.match_value(m) for k, m in e.match.items()}, e.action.action,
                     dict(e.action.params), e.priority)

    def read_entries(self, table: str | None = None) -> list[Entry]:
        """Every entry of ``table`` (or of all tables) as the switch holds it."""
        e = p4runtime_pb2.Entity()
        e.table_entry.table_id = self._table(table).id if table else 0
        return [self._decode_entry(x.table_entry) for x in self._read([e])]

    def _read_mutable_entries(self) -> list[Entry]:
        """Entries a controller may change: not in const tables, not marked const (P4 ``entries``)."""
        e = p4runtime_pb2.Entity()
        e.table_entry.table_id = 0
        return [self._decode_entry(x.table_entry) for x in self._read([e])
                if not x.table_entry.is_const and not self._table(int(x.table_entry.table_id)).is_const_table]

    def read_default_action(self, table: str) -> tuple[str, dict[str, int]]:
        """The (action, params) a miss in ``table`` runs on the switch."""
        e = p4runtime_pb2.Entity()
        e.table_entry.table_id = self._table(table).id
        e.table_entry.is_default_action = True
        (got,) = self._read([e])
        entry = self._decode_entry(got.table_entry)
        return entry.action, {k: v for k, v in entry.params.items() if isinstance(v, int)}

    def read_counter(self, name: str, index: int | None = None) -> dict[int, CounterValue]:
        """Cells of an indexed counter: one ``index`` or all of them, index -> value."""
        return self._read_counter(name, [index])

    def read_counter_cells(self, name: str, indices: Iterable[int]) -> dict[int, CounterValue]:
        """The given cells of an indexed counter, in one read: index -> value (``{}`` for none).

        Cheaper than a whole-array read when few cells matter: on the model target a read of
        all 1,024 slot counters every 0.1 s epoch took the switch's CPU from its packets.
        """
        return self._read_counter(name, sorted(set(indices)))

    def _read_counter(self, name: str, indices: Sequence[int | None]) -> dict[int, CounterValue]:
        """One read of ``name``'s cells at ``indices`` (``None``: every cell), index -> value."""
        info = self.p4info.counter(name)
        entities = []
        for index in indices:
            e = p4runtime_pb2.Entity()
            codec.encode_counter_entry(info, index, None, e.counter_entry)
            entities.append(e)
        out = {}
        for x in self._read(entities) if entities else ():
            _, cell, value = codec.decode_counter_entry(self.p4info, x.counter_entry)
            out[cell or 0] = value
        return out

    def read_direct_counters(self, table: str) -> list[tuple[Entry, CounterValue]]:
        """Direct-counter value of every entry of ``table``."""
        e = p4runtime_pb2.Entity()
        e.direct_counter_entry.table_entry.table_id = self._table(table).id
        out = []
        for x in self._read([e]):
            t, match, priority = codec.decode_entry_key(self.p4info, x.direct_counter_entry.table_entry)
            entry = Entry(t.name, {k: codec.match_value(m) for k, m in match.items()}, priority=priority)
            out.append((entry, codec.decode_counter_data(x.direct_counter_entry.data)))
        return out

    def read_multicast_groups(self) -> dict[int, list[tuple[int, int]]]:
        """Every multicast group on the switch: id -> [(egress port, replica id)]."""
        e = p4runtime_pb2.Entity()
        e.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
        out: dict[int, list[tuple[int, int]]] = {}
        for x in self._read([e]):
            gid, replicas = codec.decode_multicast_group(x.packet_replication_engine_entry)
            out[gid] = [(r.port, r.rid) for r in replicas]
        return out

    def read_digest_configs(self) -> dict[str, DigestConfig]:
        """Digests enabled on the switch and their configs.

        One read per digest of the P4Info: BMv2's server refuses a wildcard DigestEntry read
        (UNIMPLEMENTED, "digest_id must be set") and answers NOT_FOUND for one not configured.
        """
        out = {}
        for info in self.p4info.digests:
            entity = p4runtime_pb2.Entity()
            codec.encode_digest_entry(info, None, entity.digest_entry)
            try:
                entities = self._read([entity])
            except P4RuntimeCallError as e:
                if e.code == "NOT_FOUND":
                    continue
                raise
            for x in entities:
                out[info.name] = codec.decode_digest_entry(self.p4info, x.digest_entry)[1]
        return out

    # --- packet-out ------------------------------------------------------------------------------

    def send_packet_out(self, payload: bytes, **metadata: int) -> None:
        """Send a packet through the switch's CPU port with ``packet_out`` header fields by name."""
        req = p4runtime_pb2.StreamMessageRequest()
        req.packet.payload = payload
        codec.encode_packet_metadata(self.p4info, "packet_out", metadata, req.packet.metadata)
        self._require()
        requests = self._requests
        if requests is None:
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address} is not connected")
        requests.put(req)

    # --- resync ----------------------------------------------------------------------------------

    @property
    def intended_entries(self) -> list[Entry]:
        """Entries the controller wants on the switch (what a resync restores)."""
        with self._lock:
            return list(self._intended.entries.values())

    def _attach_instance(self, counts: dict[str, int]) -> None:
        """Find out which instance of the pipeline the switch runs; push ours when it runs none or another.

        The first connect of this driver to a switch already running this pipeline adopts it
        (:attr:`adopted`: a warm switch whose state the owner may keep). Later, a cookie of
        this pipeline with another nonce means someone else pushed it (after a restart, say):
        a new instance, but no push is needed.
        """
        cookie = self.switch_cookie()
        first = not self._ever_connected
        if cookie == self.cookie:
            pass
        elif self.runs_our_pipeline(cookie):
            assert cookie is not None
            self.cookie = cookie
            if first:
                self.adopted = True
                log.info("switch %s already runs this pipeline (cookie %#x): adopting it", self.address, cookie)
            else:
                self.instance += 1
                log.warning("switch %s: pipeline pushed by someone else (cookie %#x): a new instance",
                            self.address, cookie)
        else:
            self._push_pipeline()
            counts["pipeline"] = 1
            if not first:
                log.warning("switch %s ran %s: pushed ours (a new instance: registers and counters start from zero)",
                            self.address, "no pipeline" if cookie is None else f"another pipeline ({cookie:#x})")
        self._ever_connected = True

    def intend(self, entries: Iterable[Entry] = (), *, defaults: Mapping[str, tuple[str, Mapping[str, Value]]]
               | None = None, groups: Mapping[int, Iterable[tuple[int, int]]] | None = None,
               digests: Mapping[str, DigestConfig] | None = None) -> None:
        """Add to the intended state without writing: the next resync makes the switch match.

        Entries, default actions (table -> (action, params)), multicast groups (id ->
        replicas) and digest configs, validated against the P4Info now. For a controller
        that adopts a warm switch: what the switch holds already costs nothing, the rest is
        written by the one resync of :meth:`manage`.
        """
        with self._lock:
            for e in entries:
                key, canon = self._normalize(e)
                if not canon.action:
                    raise ValueError(f"{canon.describe()}: an action is required")
                self._intended.entries[key] = canon
            for table, (action, params) in (defaults or {}).items():
                call = codec.action_call(self.p4info, action, params)
                self._intended.defaults[self._table(table).name] = (call.action, dict(call.params))
            for gid, replicas in (groups or {}).items():
                self._intended.groups[int(gid)] = tuple((int(p), int(r)) for p, r in replicas)
            for name, config in (digests or {}).items():
                self._intended.digests[self.p4info.digest(name).name] = config

    def adopt(self, table: str) -> list[Entry]:
        """Take the entries ``table`` holds on the switch as intended (a warm switch): a resync keeps them.

        For a controller that starts on a switch another controller programmed: call it
        after ``connect(push_pipeline=False)`` and before :meth:`manage`, then continue
        from the entries it returns instead of deleting them.
        """
        got = self.read_entries(table)
        self.intend(got)
        return got

    def manage(self) -> None:
        """Take the switch over after ``connect(push_pipeline=False)``: resync it to the intended state now
        and on every reconnect or promotion (what ``connect()`` does by default).

        The pause between the two lets a restarted controller read back what the switch held
        (its pool entries, their placement ids, ``controller.placement``) and :meth:`adopt`
        or :meth:`intend` what it keeps before the resync replaces the rest. A switch that is
        down, or held by another controller, is resynced when it answers or promotes us.
        """
        self._manage = True
        if self._connected.is_set() and self._is_master:
            self._resync_as_owner(mark_ready=True)

    def resync(self) -> dict[str, int]:
        """Make the switch match the intended state: pipeline, entries, defaults, groups, digests.

        Pushes the pipeline when the switch runs none or another one (see
        :meth:`_attach_instance`), then reads what the switch holds and writes only the
        difference. Returns counts of the updates sent, by kind.
        """
        counts = {"pipeline": 0, "insert": 0, "modify": 0, "delete": 0}
        with self._lock:
            self._attach_instance(counts)
            updates: list[_Update] = []
            # Entries: switch's view keyed the same way as the intended state.
            have: dict[_Key, Entry] = {}
            for e in self._read_mutable_entries():
                key, canon = self._normalize(e)
                have[key] = canon
            want = self._intended.entries
            for key, e in have.items():
                if key not in want:
                    updates.append(self._entry_update(p4runtime_pb2.Update.DELETE, key, e))
                    counts["delete"] += 1
            for key, e in want.items():
                if key not in have:
                    updates.append(self._entry_update(p4runtime_pb2.Update.INSERT, key, e))
                    counts["insert"] += 1
                elif (have[key].action, dict(have[key].params)) != (e.action, dict(e.params)):
                    updates.append(self._entry_update(p4runtime_pb2.Update.MODIFY, key, e))
                    counts["modify"] += 1
            for table, (action, params) in self._intended.defaults.items():
                if self.read_default_action(table) != (action, params):
                    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY)
                    codec.encode_default_entry(self.p4info, self._table(table),
                                               codec.action_call(self.p4info, action, params), u.entity.table_entry)
                    updates.append(_prebuilt(u, f"MODIFY default of {table} -> {action}"))
                    counts["modify"] += 1
            groups = self.read_multicast_groups()
            for gid in groups:
                if gid not in self._intended.groups:
                    updates.append(self._group_update(p4runtime_pb2.Update.DELETE, gid, ()))
                    counts["delete"] += 1
            for gid, want_reps in self._intended.groups.items():
                if gid not in groups:
                    updates.append(self._group_update(p4runtime_pb2.Update.INSERT, gid, want_reps))
                    counts["insert"] += 1
                elif sorted(groups[gid]) != sorted(want_reps):  # replicas are a set (BMv2 reads them reversed)
                    updates.append(self._group_update(p4runtime_pb2.Update.MODIFY, gid, want_reps))
                    counts["modify"] += 1
            digests = self.read_digest_configs()
            for name, config in self._intended.digests.items():
                if name not in digests:
                    updates.append(self._digest_update(p4runtime_pb2.Update.INSERT, name, config))
                    counts["insert"] += 1
                elif digests[name] != config:
                    updates.append(self._digest_update(p4runtime_pb2.Update.MODIFY, name, config))
                    counts["modify"] += 1
            for name in digests:
                if name not in self._intended.digests:
                    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.DELETE)
                    codec.encode_digest_entry(self.p4info.digest(name), None, u.entity.digest_entry)
                    updates.append(_prebuilt(u, f"DELETE digest {name}"))
                    counts["delete"] += 1
            # Deletes first so a full table has room for the inserts.
            updates.sort(key=lambda u: u.type != p4runtime_pb2.Update.DELETE)
            errors = self._write(updates)
            if errors:
                raise WriteError(self.address, len(updates), errors)
        log.info("switch %s resynced: %s", self.address, counts)
        return counts


@contextlib.contextmanager
def connected(address: str, p4info: str | Path | P4Info, device_config: str | Path | bytes | None = None,
              **kwargs: Any) -> Iterator[P4RuntimeSwitch]:
    """``with connected(addr, p4info, json) as sw:`` — a connected switch, closed afterwards."""
    sw = P4RuntimeSwitch(address, p4info, device_config, **kwargs)
    try:
        sw.connect()
        yield sw
    finally:
        sw.close()

