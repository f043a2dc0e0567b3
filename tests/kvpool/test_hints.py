"""The hints document (``kvpool.hints``): what the controller sends agents, read back, bad input named."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kvpool import hints as kh
from kvpool.hints import GetPath, Hint, HintError, Hints

HOT, POOLED, COLD = 0x10, 0x20, 0x30


def test_document_round_trips_and_bad_documents_name_the_first_bad_item() -> None:
    hints = Hints({HOT: Hint(GetPath.SINGLE, 5000), POOLED: Hint(GetPath.SERVABLE)}, 15.0, True)
    doc = kh.document(hints)
    assert doc["chunks"][0] == {"key": "0x0000000000000010", "path": "single", "nbytes": 5000}
    assert kh.parse(doc) == Hints(dict(hints.chunks), 15.0, True)
    assert kh.parse({"ttl_s": 1, "chunks": []}) == Hints({}, 1.0, False)  # merge defaults to false
    bad: list[tuple[Mapping[str, Any], str]] = [
        ({"chunks": []}, "ttl_s"),
        ({"ttl_s": 0, "chunks": []}, "ttl_s"),
        ({"ttl_s": True, "chunks": []}, "ttl_s"),
        ({"ttl_s": 1}, "chunks must be a list"),
        ({"ttl_s": 1, "merge": "yes", "chunks": []}, "merge"),
        ({"ttl_s": 1, "chunks": [1]}, r"chunks\[0\] must be an object"),
        ({"ttl_s": 1, "chunks": [{"key": "10", "path": "single"}]}, r"chunks\[0\].key"),
        ({"ttl_s": 1, "chunks": [{"key": "0x" + "f" * 17, "path": "single"}]}, r"chunks\[0\].key"),
        ({"ttl_s": 1, "chunks": [{"key": "0xzz", "path": "single"}]}, r"chunks\[0\].key"),
        ({"ttl_s": 1, "chunks": [{"key": "0x1", "path": "range"}]}, "single or servable"),
        ({"ttl_s": 1, "chunks": [{"key": "0x1", "path": "single", "nbytes": -1}]}, "nbytes"),
    ]
    for doc_bad, why in bad:
        with pytest.raises(HintError, match=why):
            kh.parse(doc_bad)
