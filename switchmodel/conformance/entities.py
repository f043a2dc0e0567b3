"""Entities built from a P4Info alone, and read answers decoded back to text with the shared codec.

The probe never names a table or action of its own: it fills every match field and action
parameter from a seed, so the same calls exist for any program the P4Info describes.
"""

from __future__ import annotations

from typing import Any

from p4.v1 import p4runtime_pb2

from kvpool.p4rt import codec
from kvpool.p4rt.p4info import P4Info, TableInfo
from switchmodel.conformance.client import Client

# ---------------------------------------------------------------------------------------------
# Building entities from the P4Info
# ---------------------------------------------------------------------------------------------


def _update(utype: int, **entity: Any) -> Any:
    u = p4runtime_pb2.Update(type=utype)
    for kind, msg in entity.items():
        getattr(u.entity, kind).CopyFrom(msg)
    return u


def _fill_match(t: TableInfo, seed: int, out: Any) -> None:
    """A valid, distinct match for ``seed`` >= 1 on every key field (full-length lpm, full-mask ternary)."""
    for f in t.match_fields:
        value = codec.encode_int(seed % (1 << f.bitwidth) or 1, f.bitwidth)
        m = out.match.add(field_id=f.id)
        if f.match_type == "exact":
            m.exact.value = value
        elif f.match_type == "lpm":
            m.lpm.value, m.lpm.prefix_len = value, f.bitwidth
        elif f.match_type == "ternary":
            m.ternary.value, m.ternary.mask = value, codec.encode_int((1 << f.bitwidth) - 1, f.bitwidth)
        elif f.match_type == "range":
            m.range.low = m.range.high = value
        else:
            m.optional.value = value
    if t.needs_priority:
        out.priority = 10


def _actions_in_scope(p4info: P4Info, t: TableInfo, excluded_scope: str) -> list[int]:
    """Ids of the table's actions usable outside ``excluded_scope``, those with parameters first."""
    ids = [r.action_id for r in t.action_refs if r.scope != excluded_scope]
    return sorted(ids, key=lambda a: (not p4info.action(a).params, ids.index(a)))


def _fill_action(p4info: P4Info, action_id: int, value: int, out: Any) -> None:
    action = p4info.action(action_id)
    out.action_id = action.id
    for p in action.params:
        out.params.add(param_id=p.id, value=codec.encode_int(value % (1 << p.bitwidth), p.bitwidth))


def _entry(p4info: P4Info, t: TableInfo, seed: int, action_id: int | None, value: int = 1) -> Any:
    te = p4runtime_pb2.TableEntry(table_id=t.id)
    _fill_match(t, seed, te)
    if action_id is not None:
        _fill_action(p4info, action_id, value, te.action.action)
    return te


def _default(p4info: P4Info, t: TableInfo, action_id: int | None, value: int = 1) -> Any:
    te = p4runtime_pb2.TableEntry(table_id=t.id, is_default_action=True)
    if action_id is not None:
        _fill_action(p4info, action_id, value, te.action.action)
    return te


# ---------------------------------------------------------------------------------------------
# Reading answers back as text
# ---------------------------------------------------------------------------------------------


def _describe_entity(p4info: P4Info, e: Any) -> str:
    kind = e.WhichOneof("entity")
    if kind == "table_entry":
        te = e.table_entry
        _, entry = codec.decode_table_entry(p4info, te, require_exact=not te.is_default_action)
        params = ",".join(f"{k}={v:#x}" for k, v in sorted(entry.action.params.items()))
        where = "default" if te.is_default_action else "{" + codec.describe_match(
            {k: codec.match_value(m) for k, m in entry.match.items()}) + "}"
        prio = f" prio {entry.priority}" if entry.priority else ""
        return f"{where}{prio} -> {entry.action.action}({params})"
    if kind == "counter_entry":
        _, index, value = codec.decode_counter_entry(p4info, e.counter_entry)
        return f"[{index}]={value.packets}/{value.bytes}"
    if kind == "packet_replication_engine_entry":
        gid, replicas = codec.decode_multicast_group(e.packet_replication_engine_entry)
        return f"group {gid}: " + " ".join(f"{p}.{r}" for p, r in sorted(replicas))
    if kind == "digest_entry":
        info, config = codec.decode_digest_entry(p4info, e.digest_entry)
        return f"{info.name}: {config.max_timeout_ns}/{config.max_list_size}/{config.ack_timeout_ns}"
    return str(kind)


def _read_answer(p4info: P4Info, client: Client, *entities: Any, summary: bool = False) -> str:
    code, got = client.read(*entities)
    if code != "OK":
        return code
    if summary:  # many cells: count them and the non-zero ones
        texts = [_describe_entity(p4info, e) for e in got]
        nonzero = [t for t in texts if not t.endswith("=0/0")]
        return f"OK {len(texts)} entities, non-zero: {' '.join(nonzero) or 'none'}"
    return f"OK {len(got)}: " + "; ".join(sorted(_describe_entity(p4info, e) for e in got))
