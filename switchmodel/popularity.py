"""Count-min sketch, Bloom filter and hot-chunk digest (p4/include/popularity.p4, ``MyIngress.popularity``).

Every index comes from :func:`sketch_indices` and :func:`bloom_indices`, which compute what
the program's ``hash`` calls do through :mod:`switchmodel.hashes`;
``tests/switchmodel/test_model_vs_build.py`` checks them against the calculations in the compiled
``p4/build/kvpool.json``.
"""

from __future__ import annotations

from typing import Final

from kvpool.contract import (
    BLOOM_BITS,
    BLOOM_ROWS,
    BLOOM_SALT,
    FLAG_RETRANSMIT,
    HOT_CHUNK,
    POPULARITY_CONFIG,
    POPULARITY_STATS,
    SET_POPULARITY,
    SKETCH_COLS,
    SKETCH_COUNT_MAX,
    SKETCH_ROWS,
    SKETCH_SALT,
)
from kvpool.contract import PopularityStat as PopStat
from switchmodel import hashes
from switchmodel.parser import Kv, Meta, Packet
from switchmodel.v1model import Control

_SKETCH_SALT: Final = SKETCH_SALT.to_bytes(4, "big")
_BLOOM_SALT: Final = BLOOM_SALT.to_bytes(4, "big")


def sketch_indices(kv: Kv) -> tuple[int, int, int]:
    """Cells of the three sketch rows: crc32({chunk_key}), crc16({chunk_key}), crc32({chunk_key, SKETCH_SALT})."""
    key8 = kv.chunk_key.to_bytes(8, "big")
    return (hashes.crc32(key8) % SKETCH_COLS, hashes.crc16(key8) % SKETCH_COLS,
            hashes.crc32(key8 + _SKETCH_SALT) % SKETCH_COLS)


def bloom_indices(kv: Kv) -> tuple[int, int]:
    """Cells of the two Bloom rows: crc32({BLOOM_SALT, chunk_key}), crc16({BLOOM_SALT, chunk_key})."""
    bloom_in = _BLOOM_SALT + kv.chunk_key.to_bytes(8, "big")
    return hashes.crc32(bloom_in) % BLOOM_BITS, hashes.crc16(bloom_in) % BLOOM_BITS


def next_count(cell: int, tag: int) -> int:
    """``next_count`` of popularity.p4: the cell's count this epoch plus one, saturating."""
    count = cell & SKETCH_COUNT_MAX if (cell >> 24) & 0xFF == tag else 0
    if count != SKETCH_COUNT_MAX:
        count += 1
    return count


class Popularity(Control):
    """``control Popularity``: one count per fetch of a chunk outside the pool; digests for hot ones."""

    def apply(self, pkt: Packet, meta: Meta) -> None:
        """``Popularity.apply``: count a fetch in the sketch; report a hot chunk once per epoch."""
        kv = pkt.kv
        assert kv is not None
        if not (meta.pool_found == 0 and kv.frag_index == 0 and not kv.flags & FLAG_RETRANSMIT):
            return
        cfg = self.state.lookup(POPULARITY_CONFIG, (), meta.packet_length)
        if cfg.action == SET_POPULARITY:
            meta.hot_threshold = cfg.params["threshold"]
            meta.cur_epoch = cfg.params["epoch"]
        tag = 0x80 | (meta.cur_epoch & 0x7F)

        idx = sketch_indices(kv)
        counts = []
        for reg, i in zip(SKETCH_ROWS, idx, strict=True):
            cell = self._read(reg, i)
            counts.append(next_count(cell, tag))
        for reg, i, n in zip(SKETCH_ROWS, idx, counts, strict=True):
            self._write(reg, i, (tag << 24) | n)
        self._count(POPULARITY_STATS, PopStat.COUNTED, meta)
        estimate = min(counts)

        if estimate >= meta.hot_threshold:
            b0, b1 = bloom_indices(kv)
            seen0 = self._read(BLOOM_ROWS[0], b0)
            seen1 = self._read(BLOOM_ROWS[1], b1)
            if seen0 == tag and seen1 == tag:
                self._count(POPULARITY_STATS, PopStat.SUPPRESSED, meta)
            else:
                self._write(BLOOM_ROWS[0], b0, tag)
                self._write(BLOOM_ROWS[1], b1, tag)
                # BMv2 hands digests to the learn engine even for packets dropped later.
                self.state.emit_digest(HOT_CHUNK, (kv.chunk_key, estimate, meta.cur_epoch))
                self._count(POPULARITY_STATS, PopStat.REPORTED, meta)
