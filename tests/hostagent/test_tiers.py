"""Local tiers: LRU demotion instead of dropping, drops only from the lowest tier, promotion on access."""

from __future__ import annotations

import pytest
import torch

from hostagent.backend import MemoryBackend
from hostagent.tiers import BackendTier, GpuTier, HostTier, TieredStore, TierError, default_store


def _two_tiers(top: int = 100, bottom: int = 200) -> TieredStore:
    return TieredStore([HostTier(top, name="fast"), HostTier(bottom, name="slow")])


def _tier(stats: dict[str, object], name: str) -> dict[str, int]:
    tiers = stats["tiers"]
    assert isinstance(tiers, list)
    return next(t for t in tiers if t["name"] == name)


def test_full_tier_demotes_lru_instead_of_dropping() -> None:
    s = _two_tiers()
    for k in range(3):
        s.put(k, bytes([k]) * 40)
    # 120 bytes do not fit the 100-byte top tier: the least recently used chunk (0) moves down.
    assert [s.tier_of(k) for k in range(3)] == ["slow", "fast", "fast"]
    st = s.stats()
    assert st["dropped"] == 0 and st["chunks"] == 3
    assert _tier(st, "fast")["used_bytes"] == 80 and _tier(st, "slow")["used_bytes"] == 40
    assert _tier(st, "fast")["demoted_out"] == 1 and _tier(st, "slow")["demoted_in"] == 1


def test_access_refreshes_lru_order() -> None:
    s = _two_tiers()
    s.put(1, bytes(40))
    s.put(2, bytes(40))
    assert s.get(1) == bytes(40)  # 1 is now most recent, so 2 is the victim
    s.put(3, bytes(40))
    assert s.tier_of(2) == "slow" and s.tier_of(1) == "fast" and s.tier_of(3) == "fast"


def test_promotion_on_access_demotes_the_new_lru() -> None:
    s = _two_tiers()
    for k in range(3):
        s.put(k, bytes([k]) * 40)
    assert s.lookup(0) == (bytes([0]) * 40, 0)
    assert s.tier_of(0) == "fast" and s.tier_of(1) == "slow"
    st = s.stats()
    assert _tier(st, "slow")["promoted_out"] == 1 and _tier(st, "slow")["hits"] == 1


def test_drop_only_from_lowest_tier_and_counted() -> None:
    s = _two_tiers(top=100, bottom=100)
    for k in range(6):
        s.put(k, bytes(40))
    st = s.stats()
    # 240 bytes into 200 bytes: the two oldest chunks fall out of the bottom tier.
    assert st["dropped"] == 2 and st["dropped_bytes"] == 80 and st["drop_tier"] == "slow"
    assert s.get(0) is None and s.get(1) is None
    assert all(s.get(k) == bytes(40) for k in range(2, 6))
    assert st["misses"] == 0 and s.stats()["misses"] == 2


def test_generation_and_replace_and_delete() -> None:
    s = _two_tiers()
    s.put(7, b"a" * 10, generation=1)
    s.put(7, b"b" * 20, generation=2)
    assert s.lookup(7) == (b"b" * 20, 2) and s.generation(7) == 2
    assert _tier(s.stats(), "fast")["used_bytes"] == 20
    assert s.delete(7) and not s.delete(7) and 7 not in s and len(s) == 0


def test_oversize_chunk_skips_small_tier_or_fails() -> None:
    s = _two_tiers(top=10, bottom=100)
    s.put(1, bytes(50))
    assert s.tier_of(1) == "slow"
    with pytest.raises(TierError, match="larger than every tier"):
        s.put(2, bytes(500))


def test_backend_tier_below_dram_never_drops() -> None:
    backend = MemoryBackend()
    s = TieredStore([HostTier(100), BackendTier(backend)])
    for k in range(10):
        s.put(k, bytes([k]) * 30)
    st = s.stats()
    assert st["dropped"] == 0 and st["drop_tier"] == "memory"
    assert backend.used_bytes == 7 * 30
    assert s.get(0) == bytes([0]) * 30 and s.tier_of(0) == "dram"


def test_backend_that_evicts_on_its_own_is_a_miss() -> None:
    backend = MemoryBackend()
    s = TieredStore([HostTier(10), BackendTier(backend)])
    s.put(1, bytes(8))
    s.put(2, bytes(8))
    backend.delete(1)
    assert s.get(1) is None and 1 not in s


class _CountingBackend(MemoryBackend):
    """A MemoryBackend that counts writes and deletes (each is a store round trip)."""

    def __init__(self) -> None:
        super().__init__()
        self.puts = self.deletes = 0

    def put(self, key: int, data: bytes | memoryview) -> None:
        self.puts += 1
        super().put(key, data)

    def delete(self, key: int) -> None:
        self.deletes += 1
        super().delete(key)


def test_chunk_too_big_for_dram_is_read_in_place_not_rewritten() -> None:
    backend = _CountingBackend()
    s = TieredStore([HostTier(10), BackendTier(backend)])
    s.put(1, bytes(50))
    for _ in range(3):
        assert s.get(1) == bytes(50)
    # Promotion could only put it back where it was: one write, no delete, still in the store.
    assert (backend.puts, backend.deletes) == (1, 0)
    assert s.tier_of(1) == "memory" and _tier(s.stats(), "memory")["hits"] == 3


def test_default_store_without_dram_serves_from_the_backend() -> None:
    backend = _CountingBackend()
    s = default_store(dram_bytes=0, backend=backend)
    assert s.tier_names == ["memory"]
    s.put(7, b"kv" * 100)
    assert s.get(7) == b"kv" * 100 and backend.puts == 1 and backend.deletes == 0
    backend.delete(7)  # the store evicts on its own: the holder must see a miss
    assert s.get(7) is None


def test_default_store_has_gpu_tier_only_with_cuda() -> None:
    s = default_store(dram_bytes=1000, gpu_bytes=1000)
    if torch.cuda.is_available():
        assert s.tier_names == ["gpu", "dram"]
    else:
        assert s.tier_names == ["dram"]
        with pytest.raises(TierError, match="cuda"):
            GpuTier(1000)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_tier_round_trip_and_demotion() -> None:
    s = TieredStore([GpuTier(100), HostTier(1000)])
    s.put(1, b"x" * 60)
    s.put(2, b"y" * 60)
    assert s.tier_of(1) == "dram" and s.get(1) == b"x" * 60 and s.tier_of(1) == "gpu"


def test_put_hands_over_buffers_only_when_asked() -> None:
    s = _two_tiers(top=1000, bottom=1000)
    buf = bytearray(b"abcd")
    s.put(1, memoryview(buf))  # copied by default: later writes to buf do not leak in
    buf[0] = ord("z")
    assert s.get(1) == b"abcd"
    owned = bytearray(b"wxyz")
    s.put(2, memoryview(owned), copy=False)  # handed over: kept as a read-only view, no copy
    view = s.get(2)
    assert isinstance(view, memoryview) and view.readonly and view.tobytes() == b"wxyz"
    s.put(3, bytearray(b"q"), copy=False)  # a bytearray is always copied (it has no read-only view)
    assert s.get(3) == b"q"


def test_listener_sees_every_placement_change_and_a_replay() -> None:
    s = _two_tiers(top=100, bottom=100)
    s.put(1, bytes(60))
    events: list[tuple[int, str | None, int]] = []
    s.set_listener(lambda key, tier, size: events.append((key, tier, size)))
    assert events == [(1, "fast", 60)]  # what was stored before is replayed first
    s.put(2, bytes(60))  # 1 is demoted: it leaves "fast", lands in "slow"
    assert events[1:] == [(2, "fast", 60), (1, None, 60), (1, "slow", 60)]
    s.delete(2)
    assert events[-1] == (2, None, 60)
    s.set_listener(None)
    s.put(3, bytes(10))
    assert len(events) == 5
