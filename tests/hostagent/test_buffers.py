"""Recycled reassembly buffers: a slot comes back only once nothing views it."""

from __future__ import annotations

import gc
import itertools
import threading

import numpy as np

from hostagent.buffers import PAGE, BufferPool
from hostagent.fragment import Reassembler, fragment
from kvpool import wire


def test_a_buffer_is_reused_only_after_its_last_view_is_gone() -> None:
    pool = BufferPool(slab_bytes=4 * PAGE)
    a = pool.take(PAGE + 1)
    assert a.dtype == np.uint8 and a.shape == (PAGE + 1,) and a.flags.writeable
    a[:] = 7
    view, mv = a[5:9], a.data[100:]
    address = a.__array_interface__["data"][0]
    del a
    gc.collect()
    b = pool.take(PAGE + 1)
    assert b.__array_interface__["data"][0] != address  # still viewed: not handed out again
    del b, view
    gc.collect()
    assert mv[0] == 7
    del mv
    c = pool.take(2 * PAGE)  # same size class (whole pages), back from the free list
    assert c.__array_interface__["data"][0] == address and pool.reused >= 1


def test_slabs_are_carved_and_mapped_once() -> None:
    pool = BufferPool(slab_bytes=10 * PAGE)
    held = [pool.take(3 * PAGE) for _ in range(6)]
    assert pool.mapped_bytes == 2 * 9 * PAGE  # 3 buffers per slab
    starts = sorted(b.__array_interface__["data"][0] for b in held)
    assert all(hi - lo >= 3 * PAGE for lo, hi in itertools.pairwise(starts))
    held.clear()
    assert pool.free_bytes() == 6 * 3 * PAGE
    assert pool.take(PAGE).size == PAGE  # another size class: a slab of its own
    assert pool.mapped_bytes == 2 * 9 * PAGE + 10 * PAGE


def test_free_buffers_past_the_spare_give_their_pages_back() -> None:
    pool = BufferPool(slab_bytes=4 * PAGE, spare_bytes=2 * PAGE)
    held = [pool.take(PAGE) for _ in range(4)]
    for b in held:
        b[:] = 1
    del b
    held.clear()
    assert pool.released == 2  # two kept with their pages, two dropped (they read as zeros again)
    again = [pool.take(PAGE) for _ in range(4)]
    assert sorted(int(b[0]) for b in again) == [0, 0, 1, 1]


def test_reassembled_chunks_land_in_recycled_buffers() -> None:
    pool = BufferPool(slab_bytes=1 << 20)
    chunk = bytes(range(256)) * 40
    recs = fragment(chunk, 0x42)
    r = Reassembler(0x42, len(chunk), alloc=pool.take)
    assert r.add_batch(recs) == recs.size
    data = r.data
    del r
    assert bytes(data) == chunk  # the caller's view keeps the buffer
    assert pool.free_bytes() == pool.mapped_bytes - pool.size_class(wire.fragment_count(len(chunk)) * wire.FRAG_PAYLOAD)
    del data
    assert pool.free_bytes() == pool.mapped_bytes


def test_views_dropped_on_other_threads() -> None:
    pool = BufferPool(slab_bytes=64 * PAGE)
    bufs = [pool.take(PAGE) for _ in range(64)]
    threads = [threading.Thread(target=bufs[i::4].clear) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    del bufs
    assert pool.free_bytes() == 64 * PAGE
    assert len({b.__array_interface__["data"][0] for b in [pool.take(PAGE) for _ in range(64)]}) == 64
