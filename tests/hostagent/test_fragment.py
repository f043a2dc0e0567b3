"""Fragmentation into DATA records and reassembly: wire equality, order, loss, malformed input."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
import torch

from hostagent.fragment import Reassembler, empty_records, fragment, fragment_checks, fragment_into, records_view
from hostagent.serialize import ChecksumError, deserialize, serialize
from kvpool import wire

KEY = 0xDEADBEEF01234567
P = wire.FRAG_PAYLOAD
LENGTHS = [1, P - 1, P, P + 1, 2 * P, 5000, 100_003]


def _chunk(length: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("length", LENGTHS)
def test_records_equal_wire_data_packet(length: int) -> None:
    chunk = _chunk(length)
    recs = fragment(chunk, KEY, generation=7, request_id=0xABCDEF, flags=int(wire.Flag.RETRANSMIT))
    assert recs.dtype == wire.DATA_PACKET_DTYPE
    assert recs.size == wire.fragment_count(length)
    for i in range(recs.size):
        assert recs[i : i + 1].tobytes() == wire.data_packet(KEY, i, chunk, 0xABCDEF, 7, int(wire.Flag.RETRANSMIT))
        assert wire.parse(recs[i : i + 1].tobytes()).frag_index == i


def test_selected_range_for_retransmit() -> None:
    chunk = _chunk(10 * P + 17)
    recs = fragment(chunk, KEY, first=3, count=4)
    assert [int(i) for i in recs["hdr"]["frag_index"]] == [3, 4, 5, 6]
    assert recs[0:1].tobytes() == wire.data_packet(KEY, 3, chunk)
    tail = fragment(chunk, KEY, first=9)
    assert tail.size == 2
    assert tail[1:2].tobytes() == wire.data_packet(KEY, 10, chunk)


@pytest.mark.parametrize(("first", "count"), [(-1, 1), (0, 0), (10, 2), (11, None), (0, 12)])
def test_bad_range_rejected(first: int, count: int | None) -> None:
    with pytest.raises(wire.WireError) as err:
        fragment(_chunk(10 * P + 17), KEY, first=first, count=count)
    assert err.value.reason == "bad_range"


def test_bad_header_values_rejected() -> None:
    chunk = _chunk(100)
    with pytest.raises(wire.WireError, match="generation"):
        fragment(chunk, KEY, generation=1 << 32)
    with pytest.raises(wire.WireError, match="chunk_key"):
        fragment(chunk, -1)
    with pytest.raises(wire.WireError) as err:
        fragment(chunk, KEY, flags=0x8000)
    assert err.value.reason == "bad_flags"
    with pytest.raises(wire.WireError) as err:
        fragment(b"", KEY)
    assert err.value.reason == "bad_length"


def test_fragment_into_preallocated_reuses_buffer() -> None:
    out = empty_records(8)
    out.view(np.uint8)[:] = 0xAA  # stale garbage must be fully overwritten, padding included
    chunk = _chunk(3 * P - 5)
    got = fragment_into(out, chunk, KEY)
    assert got.size == 3
    assert np.shares_memory(got, out)
    assert got.tobytes() == fragment(chunk, KEY).tobytes()
    assert (out[3:].view(np.uint8) == 0xAA).all()  # records past the chunk untouched
    with pytest.raises(ValueError, match="holds 2 records"):
        fragment_into(empty_records(2), chunk, KEY)
    with pytest.raises(ValueError, match="C-contiguous"):
        fragment_into(empty_records(8)[::2], chunk, KEY)
    with pytest.raises(ValueError, match="DATA_PACKET_DTYPE"):
        fragment_into(np.zeros(8, dtype=np.uint8), chunk, KEY)  # type: ignore[arg-type]


def test_fragment_accepts_numpy_and_memoryview() -> None:
    arr = np.arange(4000, dtype=np.float32)  # any dtype: fragmented as its raw bytes
    ref = fragment(arr.tobytes(), KEY).tobytes()
    assert fragment(arr, KEY).tobytes() == ref
    assert fragment(memoryview(arr.tobytes()), KEY).tobytes() == ref


def test_records_view_round_trip() -> None:
    chunk = _chunk(4 * P)
    wire_bytes = bytearray(fragment(chunk, KEY).tobytes())
    recs = records_view(wire_bytes)
    assert recs.size == 4
    r = Reassembler(KEY, len(chunk))
    assert r.add_batch(recs) == 4
    assert bytes(r.data) == chunk
    with pytest.raises(wire.WireError):
        records_view(wire_bytes[:-1])


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("caller_buffer", [False, True])
def test_shuffled_single_adds(length: int, caller_buffer: bool) -> None:
    chunk = _chunk(length, seed=length)
    recs = fragment(chunk, KEY, generation=2)
    r = Reassembler(KEY, length, generation=2, buffer=bytearray(length) if caller_buffer else None)
    order = np.random.default_rng(1).permutation(recs.size)
    for i in order:
        assert not r.complete
        assert r.add(recs[i : i + 1].tobytes()) is True
    assert r.complete and r.received_count == recs.size
    assert bytes(r.data) == chunk


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("caller_buffer", [False, True])
def test_shuffled_batch_with_duplicates(length: int, caller_buffer: bool) -> None:
    chunk = _chunk(length, seed=3)
    recs = fragment(chunk, KEY)
    rng = np.random.default_rng(2)
    # Every fragment once, plus a random third of them again, all shuffled.
    order = np.concatenate([np.arange(recs.size), rng.integers(0, recs.size, recs.size // 3 + 1)])
    rng.shuffle(order)
    buf = bytearray(length) if caller_buffer else None
    r = Reassembler(KEY, length, buffer=buf)
    assert r.add_batch(recs[order]) == recs.size
    assert r.complete and bytes(r.data) == chunk
    assert r.add_batch(recs) == 0  # all duplicates now
    if buf is not None:
        assert bytes(buf) == chunk  # assembled in place, zero-copy for the caller


def test_first_copy_wins_and_duplicates_report_false() -> None:
    chunk = _chunk(3 * P)
    recs = fragment(chunk, KEY)
    forged = recs.copy()
    forged["payload"][1] = 0x55
    r = Reassembler(KEY, len(chunk))
    assert r.add(recs[1:2].tobytes()) is True
    assert r.add(forged[1:2].tobytes()) is False
    assert r.add_batch(forged[[1, 1]]) == 0
    batch = empty_records(4)  # np.concatenate would turn the dtype native-endian
    batch[:2], batch[2:] = recs[[0, 2]], forged[[0, 2]]
    assert r.add_batch(batch) == 2  # first occurrence in the batch is kept
    assert bytes(r.data) == chunk


def test_missing_ranges_for_selective_retransmit() -> None:
    chunk = _chunk(20 * P - 3)
    recs = fragment(chunk, KEY)
    r = Reassembler(KEY, len(chunk))
    assert r.missing_ranges() == [(0, 20)]
    keep = [i for i in range(20) if i not in {0, 1, 5, 9, 10, 11, 19}]
    r.add_batch(recs[keep])
    assert r.missing_ranges() == [(0, 2), (5, 1), (9, 3), (19, 1)]
    assert r.missing_ranges(max_ranges=2) == [(0, 2), (5, 1)]
    with pytest.raises(RuntimeError, match="incomplete"):
        _ = r.data
    # Ask for exactly what is missing, as a holder answering the GETs would send it.
    for start, count in r.missing_ranges():
        r.add_batch(fragment(chunk, KEY, first=start, count=count))
    assert r.missing_ranges() == [] and r.complete
    assert bytes(r.data) == chunk


Mutator = Callable[[npt.NDArray[np.void]], None]


def _set(field: str, value: int) -> Mutator:
    def mutate(rec: npt.NDArray[np.void]) -> None:
        rec["hdr"][field] = value

    return mutate


MALFORMED: list[tuple[str, Mutator, str]] = [
    ("version", _set("version", 1), "bad_version"),
    ("opcode_unknown", _set("opcode", 9), "bad_opcode"),
    ("unknown_flag", _set("flags", 0x4000), "bad_flags"),
    ("status", _set("status", 1), "bad_status"),
    ("wrong_key", _set("chunk_key", KEY ^ 1), "wrong_key"),
    ("wrong_generation", _set("generation", 6), "wrong_generation"),
    ("wrong_chunk_len", _set("chunk_len", 5 * P - 100 + 1), "wrong_length"),
    ("frag_count_mismatch", _set("frag_count", 6), "bad_length"),
    ("index_out_of_range", _set("frag_index", 5), "bad_range"),
    ("index_far_out", _set("frag_index", 0xFFFF), "bad_range"),
    ("payload_len_short", _set("payload_len", P - 1), "bad_length"),
    ("payload_len_zero", _set("payload_len", 0), "bad_length"),
]


@pytest.mark.parametrize(("name", "mutate", "reason"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_single_rejected_without_side_effects(name: str, mutate: Mutator, reason: str) -> None:
    length = 5 * P - 100
    chunk = _chunk(length)
    recs = fragment(chunk, KEY, generation=5)
    r = Reassembler(KEY, length, generation=5)
    r.add(recs[0:1].tobytes())
    before = bytes(r.buffer)
    bad = recs[2:3].copy()
    mutate(bad)
    bad["payload"][:] = 0x77
    with pytest.raises(wire.WireError) as err:
        r.add(bad.tobytes())
    assert err.value.reason == reason
    assert bytes(r.buffer) == before and r.received_count == 1 and r.received.sum() == 1


@pytest.mark.parametrize(("name", "mutate", "reason"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_batch_strict_and_lenient(name: str, mutate: Mutator, reason: str) -> None:
    length = 5 * P - 100
    chunk = _chunk(length)
    recs = fragment(chunk, KEY, generation=5)
    bad = recs.copy()
    mutate(bad[2:3])
    bad["payload"][2] = 0x77
    r = Reassembler(KEY, length, generation=5)
    assert r.add(recs[0:1].tobytes())
    stored = bytes(r.buffer[:P])
    # An in-order run of fragments not yet stored (the optimistic fast path)...
    with pytest.raises(wire.WireError) as err:
        r.add_batch(bad[1:])
    assert err.value.reason == reason
    assert "record 1" in str(err.value)
    assert r.received_count == 1 and r.missing_ranges() == [(1, 4)]  # strict: nothing marked
    # ...and a batch overlapping a stored fragment (the general path).
    with pytest.raises(wire.WireError) as err:
        r.add_batch(bad)
    assert err.value.reason == reason and "record 2" in str(err.value)
    assert r.received_count == 1 and bytes(r.buffer[:P]) == stored
    assert r.add_batch(bad, strict=False) == 3  # fragments 1, 3, 4; 0 is a duplicate
    assert r.rejected == 1 and r.rejected_reasons == {reason: 1}
    assert r.missing_ranges() == [(2, 1)]
    assert r.add(recs[2:3].tobytes())
    assert bytes(r.data) == chunk


def test_bad_records_never_change_stored_fragments() -> None:
    length = 6 * P
    chunk = _chunk(length)
    recs = fragment(chunk, KEY, generation=1)
    r = Reassembler(KEY, length, generation=1)
    assert r.add_batch(recs[[0, 2]]) == 2
    forged = fragment(bytes(length), KEY, generation=2)  # zeros, from a stale generation
    with pytest.raises(wire.WireError):
        r.add_batch(forged)
    assert r.add_batch(forged, strict=False) == 0 and r.rejected == 6
    assert r.rejected_reasons == {"wrong_generation": 6}
    assert bytes(r.buffer[:P]) == chunk[:P] and bytes(r.buffer[2 * P : 3 * P]) == chunk[2 * P : 3 * P]
    # An in-order run whose last record is bad: the good ones are kept, the bad one is not.
    run = recs[3:6].copy()
    run["hdr"]["chunk_key"][2] = KEY + 1
    assert r.add_batch(run, strict=False) == 2
    assert r.missing_ranges() == [(1, 1), (5, 1)]
    assert r.add_batch(recs) == 2
    assert bytes(r.data) == chunk


def test_malformed_datagram_lengths_and_opcodes() -> None:
    chunk = _chunk(3 * P)
    good = fragment(chunk, KEY)[0:1].tobytes()
    r = Reassembler(KEY, len(chunk))
    cases = {
        "truncated": good[:20],
        "bad_length": good[:-1],
    }
    for reason, datagram in cases.items():
        with pytest.raises(wire.WireError) as err:
            r.add(datagram)
        assert err.value.reason == reason
    with pytest.raises(wire.WireError) as err:
        r.add(wire.get_packet(KEY, 0))
    assert err.value.reason == "bad_opcode"
    with pytest.raises(wire.WireError) as err:
        r.add(good + b"\0")
    assert err.value.reason == "bad_length"
    assert r.received_count == 0


def test_batch_with_get_header_rejected() -> None:
    chunk = _chunk(2 * P)
    recs = fragment(chunk, KEY)
    recs["hdr"]["opcode"][1] = int(wire.Opcode.GET)
    r = Reassembler(KEY, len(chunk))
    with pytest.raises(wire.WireError):
        r.add_batch(recs)
    assert r.add_batch(recs, strict=False) == 1 and r.rejected == 1


def test_never_writes_outside_caller_buffer() -> None:
    length = 3 * P + 10
    chunk = _chunk(length)
    backing = bytearray(b"\xee" * (length + 4 * P))  # room for padded rows, which must stay unused
    view = memoryview(backing)[:length]
    r = Reassembler(KEY, length, buffer=view)
    r.add_batch(fragment(chunk, KEY)[::-1].copy())
    assert bytes(backing[:length]) == chunk
    assert backing[length:] == b"\xee" * (4 * P)


def test_buffer_checks() -> None:
    with pytest.raises(ValueError, match="cannot hold"):
        Reassembler(KEY, 3 * P, buffer=bytearray(3 * P - 1))
    with pytest.raises(ValueError, match="writable"):
        Reassembler(KEY, 10, buffer=bytes(10))
    with pytest.raises(wire.WireError):
        Reassembler(KEY, 0)
    with pytest.raises(wire.WireError):
        Reassembler(KEY, wire.MAX_CHUNK_LEN + 1)


def test_batch_input_checks() -> None:
    r = Reassembler(KEY, 10)
    assert r.add_batch(empty_records(0)) == 0
    with pytest.raises(ValueError, match="DATA_PACKET_DTYPE"):
        r.add_batch(np.zeros(3, dtype=np.uint8))  # type: ignore[arg-type]


def test_non_contiguous_batch_is_validated_too() -> None:
    chunk = _chunk(6 * P)
    recs = fragment(chunk, KEY)
    r = Reassembler(KEY, len(chunk))
    assert r.add_batch(recs[::2]) == 3
    assert r.add_batch(recs[1::2]) == 3
    assert bytes(r.data) == chunk
    bad = fragment(chunk, KEY, generation=1)
    r2 = Reassembler(KEY, len(chunk))
    with pytest.raises(wire.WireError) as err:
        r2.add_batch(bad[::2])
    assert err.value.reason == "wrong_generation"


def test_corrupted_payload_caught_by_checksum_after_reassembly() -> None:
    tensor = torch.randn(2, 2, 4, 16, 32).to(torch.bfloat16)
    blob = serialize(tensor)
    recs = fragment(blob, KEY)
    assert recs.size > 3
    recs["payload"][2, 100] ^= 0x10  # a bit flipped in flight; the header stays valid
    r = Reassembler(KEY, len(blob))
    assert r.add_batch(recs) == recs.size and r.complete
    with pytest.raises(ChecksumError):
        deserialize(r.data)
    # The intact copy reassembles into the same tensor, built on the reassembly buffer.
    clean = Reassembler(KEY, len(blob))
    clean.add_batch(fragment(blob, KEY)[::-1].copy())
    back = deserialize(clean.data)
    assert back.dtype == torch.bfloat16 and torch.equal(back, tensor)


def test_reset_for_a_new_generation() -> None:
    old, new = _chunk(3 * P, seed=1), _chunk(3 * P, seed=2)
    r = Reassembler(KEY, len(old), generation=1)
    r.add_batch(fragment(old, KEY, generation=1)[:2])
    r.reset(generation=2)
    assert r.received_count == 0 and r.missing_ranges() == [(0, 3)]
    with pytest.raises(wire.WireError) as err:
        r.add_batch(fragment(old, KEY, generation=1))
    assert err.value.reason == "wrong_generation"
    assert r.add_batch(fragment(new, KEY, generation=2)) == 3
    assert bytes(r.data) == new
    r.reset()
    assert r.generation == 2 and not r.complete
    with pytest.raises(wire.WireError):
        r.reset(generation=1 << 32)


@pytest.mark.parametrize("length", [3 * P, 3 * P - 7])
def test_vectorised_validation_agrees_with_per_packet(length: int) -> None:
    """Random header corruptions: add_batch accepts exactly what add accepts."""
    chunk = _chunk(length)
    rng = np.random.default_rng(length)
    base = fragment(chunk, KEY, generation=9)
    trials = 600
    batch = empty_records(trials)
    batch[:] = base[rng.integers(0, base.size, trials)]
    raw = batch.view(np.uint8).reshape(trials, wire.DATA_DATAGRAM_LEN)
    # One or two random header bytes per record get random values.
    for hits in (1, 2):
        rows = rng.integers(0, trials, trials * hits // 2)
        raw[rows, rng.integers(0, wire.HEADER_LEN, rows.size)] = rng.integers(0, 256, rows.size)
    one_by_one = Reassembler(KEY, length, generation=9)
    accepted = 0
    reasons: Counter[str] = Counter()
    for i in range(trials):
        try:
            one_by_one.add(batch[i : i + 1].tobytes())
            accepted += 1
        except wire.WireError as err:
            reasons[err.reason] += 1
    assert 50 < accepted < trials - 50  # both outcomes well represented
    r = Reassembler(KEY, length, generation=9)
    assert r.add_batch(batch, strict=False) == one_by_one.received_count == r.received_count
    assert r.rejected == trials - accepted
    assert r.rejected_reasons == reasons
    assert np.array_equal(r.received, one_by_one.received)
    for i in map(int, np.flatnonzero(r.received)):  # the same first copy of each fragment was kept
        n = wire.expected_payload_len(length, i)
        assert bytes(r.buffer[i * P : i * P + n]) == bytes(one_by_one.buffer[i * P : i * P + n])


@pytest.mark.parametrize("order", [[0, 2, 1, 3, 4], [1, 2, 4, 3], [0, 1, 2, 3, 3], [0, 0, 1, 2, 3]])
def test_run_that_looks_in_order_but_is_not(order: list[int]) -> None:
    """Batches that start like an in-order run but swap or repeat fragments land correctly."""
    chunk = _chunk(5 * P - 9)
    recs = fragment(chunk, KEY)
    r = Reassembler(KEY, len(chunk))
    assert r.add_batch(recs[order]) == len(set(order))
    assert r.missing_ranges() == [(i, 1) for i in range(5) if i not in order]
    r.add_batch(recs)
    assert bytes(r.data) == chunk


def test_strided_buffers_refused() -> None:
    with pytest.raises(ValueError, match="C-contiguous"):
        Reassembler(KEY, 100, buffer=np.zeros(400, dtype=np.uint8)[::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        fragment(np.zeros(400, dtype=np.uint8)[::2], KEY)


@pytest.mark.parametrize("length", LENGTHS)
def test_checks_given_or_computed_are_the_same(length: int) -> None:
    chunk = _chunk(length)
    checks = fragment_checks(chunk, KEY, generation=3)
    assert checks.shape == (wire.fragment_count(length),)
    with_checks = fragment(chunk, KEY, generation=3, checks=checks)
    assert with_checks.tobytes() == fragment(chunk, KEY, generation=3).tobytes()
    assert [int(c) for c in with_checks["hdr"]["check"]] == [int(c) for c in checks]
    part = fragment_checks(chunk, KEY, generation=3, first=checks.size - 1, count=1)
    assert int(part[0]) == int(checks[-1])
    with pytest.raises(ValueError, match="checks for"):
        fragment(chunk, KEY, generation=3, checks=checks[:-1] if checks.size > 1 else np.zeros(2, np.uint64))


@pytest.mark.parametrize("length", [1, P, 1024 * P, 1024 * P + 1, 2049 * P + 7])
def test_checks_are_the_wires_one_by_one_over_any_range(length: int) -> None:
    """The block-wise checks equal ``wire.fragment_check`` per fragment, across block edges and tails."""
    chunk = _chunk(length)
    total = wire.fragment_count(length)
    data = bytes(chunk)
    want = [wire.fragment_check(KEY, 9, i, total, length, data[i * P : (i + 1) * P]) for i in range(total)]
    assert [int(c) for c in fragment_checks(chunk, KEY, generation=9)] == want
    first, count = total // 3, max(1, total // 2)
    assert [int(c) for c in fragment_checks(chunk, KEY, generation=9, first=first, count=count)] == \
        want[first : first + count]


def test_bad_fragments_finds_exactly_the_damaged_ones_and_forget_unstores_them() -> None:
    chunk = _chunk(20 * P + 5)
    recs = fragment(chunk, KEY, generation=2, flags=int(wire.Flag.SWITCH_SERVED))
    recs["payload"][3, 17] ^= 0x40  # a flipped payload bit: the header still validates
    recs["payload"][20, 4] ^= 0x01  # the tail fragment's valid bytes too
    recs["payload"][5, P - 1] ^= 0xFF  # a full fragment's last byte
    r = Reassembler(KEY, len(chunk), generation=2)
    assert r.add_batch(recs[:10]) == 10 and r.add_batch(recs[10:][::-1].copy()) == 11
    assert r.complete and [int(i) for i in r.bad_fragments()] == [3, 5, 20]
    assert all(r.flags & wire.Flag.SWITCH_SERVED)
    assert r.forget([3, 5, 20, 5]) == 3 and r.received_count == 18 and not r.complete
    assert r.missing_ranges() == [(3, 1), (5, 1), (20, 1)]
    good = fragment(chunk, KEY, generation=2)
    assert r.add_batch(good[[3, 5, 20]]) == 3
    assert r.complete and r.bad_fragments().size == 0 and bytes(r.data) == chunk
    with pytest.raises(IndexError):
        r.forget([21])


def test_a_wrong_check_under_a_right_payload_is_found_too() -> None:
    chunk = _chunk(3 * P)
    recs = fragment(chunk, KEY)
    recs["hdr"]["check"][1] ^= 1
    r = Reassembler(KEY, len(chunk))
    r.add_batch(recs)
    assert [int(i) for i in r.bad_fragments()] == [1]



def _valid_alone(length: int, record: npt.NDArray[np.void]) -> bool:
    """Whether the per-packet path (``add``) accepts this one record into a fresh reassembler."""
    try:
        Reassembler(KEY, length, generation=9).add(record.tobytes())
    except wire.WireError:
        return False
    return True


@pytest.mark.parametrize("length", [3 * P, 3 * P - 7])
@pytest.mark.parametrize("start", [0, 1])
@pytest.mark.parametrize("caller_buffer", [False, True])
def test_in_order_run_accepts_exactly_what_add_accepts(length: int, start: int, caller_buffer: bool) -> None:
    """Every single-bit header corruption of every record of an in-order run (the batch fast path):
    ``add_batch`` stores exactly what ``add`` stores record by record, with the same checks and flags,
    and strict mode stores nothing of a batch with an invalid record."""
    chunk = _chunk(length)
    base = fragment(chunk, KEY, generation=9, request_id=0x1234, flags=int(wire.Flag.COALESCED))
    n = base.size
    outcomes: Counter[str] = Counter()
    for k in range(start, n):
        for offset in range(wire.HEADER_LEN):
            for bit in (0x01, 0x80):
                where = f"record {k}, header byte {offset}, bit {bit:#x}"
                recs = base.copy()
                recs.view(np.uint8)[k * wire.DATA_DATAGRAM_LEN + offset] ^= bit
                one_by_one = Reassembler(KEY, length, generation=9)
                buf = np.zeros(length, dtype=np.uint8) if caller_buffer else None
                r = Reassembler(KEY, length, generation=9, buffer=buf)
                for i in range(start):  # an earlier batch stored the run's predecessors
                    one_by_one.add(base[i : i + 1].tobytes())
                r.add_batch(base[:start])
                for i in range(start, n):
                    with contextlib.suppress(wire.WireError):
                        one_by_one.add(recs[i : i + 1].tobytes())
                if _valid_alone(length, recs[k : k + 1]):
                    r.add_batch(recs[start:])
                    outcomes["valid"] += 1
                else:
                    with pytest.raises(wire.WireError):
                        r.add_batch(recs[start:])
                    assert r.received_count == start, where  # strict: nothing of the batch stored
                    assert r.add_batch(recs[start:], strict=False) == n - start - 1, where
                    outcomes["invalid"] += 1
                assert np.array_equal(r.received, one_by_one.received), where
                for i in map(int, np.flatnonzero(r.received)):
                    assert int(r.checks[i]) == int(one_by_one.checks[i]), where
                    assert int(r.flags[i]) == int(one_by_one.flags[i]), where
                    lo, hi = i * P, i * P + wire.expected_payload_len(length, i)
                    assert bytes(r.buffer[lo:hi]) == bytes(one_by_one.buffer[lo:hi]), where
    # Both outcomes well represented: request_id, check and the known flags may vary, the rest may not.
    assert outcomes["valid"] >= 20 * (n - start) and outcomes["invalid"] >= 40 * (n - start)


@pytest.mark.parametrize("length", [1, P, 3 * P, 3 * P - 7])
@pytest.mark.parametrize("caller_buffer", [False, True])
def test_intact_in_order_runs_take_the_fast_path(length: int, caller_buffer: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """In-order runs of valid records are validated as a run, never record by record (the hot path)."""
    chunk = _chunk(length)
    recs = fragment(chunk, KEY, generation=4, request_id=7, flags=int(wire.Flag.SWITCH_SERVED))
    r = Reassembler(KEY, length, generation=4, buffer=np.empty(length, np.uint8) if caller_buffer else None)

    def per_record(*_: object) -> None:
        raise AssertionError("an intact in-order run took the per-record path")

    monkeypatch.setattr(Reassembler, "_invalid", per_record)
    half = max(1, recs.size // 2)
    assert r.add_batch(recs[:half]) == half
    assert r.add_batch(recs[half:]) == recs.size - half
    assert r.complete and bytes(r.data) == chunk
    assert [int(c) for c in r.checks] == [int(c) for c in recs["hdr"]["check"]]
    assert all(r.flags == int(wire.Flag.SWITCH_SERVED))


@pytest.mark.parametrize("length", [3 * P, 3 * P - 7])
@pytest.mark.parametrize("start", [0, 1])
def test_add_run_stores_a_whole_valid_run_or_nothing(length: int, start: int) -> None:
    """Every single-bit header corruption of every record of an in-order run: ``add_run`` stores the
    whole run exactly when every record is one ``add`` accepts, still in order, and all carry the same
    flags (and then what ``add`` stores), else nothing at all, and ``add_batch`` sorts it out as always."""
    chunk = _chunk(length)
    flags = int(wire.Flag.COALESCED)
    base = fragment(chunk, KEY, generation=9, request_id=0x1234, flags=flags)
    n = base.size
    outcomes: Counter[str] = Counter()
    for k in range(start, n):
        for offset in range(wire.HEADER_LEN):
            for bit in (0x01, 0x80):
                where = f"record {k}, header byte {offset}, bit {bit:#x}"
                recs = base.copy()
                recs.view(np.uint8)[k * wire.DATA_DATAGRAM_LEN + offset] ^= bit
                r = Reassembler(KEY, length, generation=9)
                one_by_one = Reassembler(KEY, length, generation=9)
                r.add_batch(base[:start])
                for i in range(start):
                    one_by_one.add(base[i : i + 1].tobytes())
                stored_before = bytes(r.buffer[: start * P])
                for i in range(start, n):
                    with contextlib.suppress(wire.WireError):
                        one_by_one.add(recs[i : i + 1].tobytes())
                same_flags = len(set(recs["hdr"]["flags"][start:].tolist())) == 1
                in_order = recs["hdr"]["frag_index"][start:].tolist() == list(range(start, n))
                got = r.add_run(recs[start:])
                if _valid_alone(length, recs[k : k + 1]) and same_flags and in_order:
                    assert got == int(recs["hdr"]["flags"][start]), where
                    outcomes["stored"] += 1
                else:
                    assert got == -1, where
                    assert r.received_count == start and bytes(r.buffer[: start * P]) == stored_before, where
                    r.add_batch(recs[start:], strict=False)
                    outcomes["left"] += 1
                assert np.array_equal(r.received, one_by_one.received), where
                for i in map(int, np.flatnonzero(r.received)):
                    assert int(r.checks[i]) == int(one_by_one.checks[i]), where
                    assert int(r.flags[i]) == int(one_by_one.flags[i]), where
                    lo, hi = i * P, i * P + wire.expected_payload_len(length, i)
                    assert bytes(r.buffer[lo:hi]) == bytes(one_by_one.buffer[lo:hi]), where
    assert outcomes["stored"] >= 20 * (n - start) and outcomes["left"] >= 40 * (n - start)


def test_add_run_leaves_everything_but_the_common_case() -> None:
    length = 6 * P - 5
    chunk = _chunk(length)
    recs = fragment(chunk, KEY, generation=3, request_id=5)
    r = Reassembler(KEY, length, generation=3)
    assert r.add_run(recs[:0]) == -1
    assert r.add_run(recs[[1, 0]]) == -1  # out of order
    assert r.add_run(recs[[2, 2]]) == -1  # a duplicate inside the run
    mixed = recs[3:5].copy()
    mixed["hdr"]["flags"][1] = int(wire.Flag.SWITCH_SERVED)
    assert r.add_run(mixed) == -1  # valid records, flags not all the same
    assert r.received_count == 0
    assert r.add_run(recs[2:4]) == 0
    assert r.add_run(recs[3:5]) == -1  # overlaps stored fragment 3
    assert r.received_count == 2
    assert r.add_run(recs[4:]) == 0 and r.add_run(recs[:2]) == 0
    assert r.complete and bytes(r.data) == chunk
    with pytest.raises(ValueError, match="DATA_PACKET_DTYPE"):
        r.add_run(np.zeros(3, np.uint8))


def test_own_buffer_from_alloc() -> None:
    length = 3 * P - 7
    chunk = _chunk(length)
    sizes: list[int] = []

    def alloc(nbytes: int) -> npt.NDArray[np.uint8]:
        sizes.append(nbytes)
        return np.empty(nbytes, np.uint8)

    r = Reassembler(KEY, length, alloc=alloc)
    assert sizes == [3 * P]  # padded to whole fragments, like a buffer of its own
    assert r.add_run(fragment(chunk, KEY)) == 0 and bytes(r.data) == chunk
    with pytest.raises(ValueError, match="alloc"):
        Reassembler(KEY, length, alloc=lambda n: np.empty(n - 1, np.uint8))
