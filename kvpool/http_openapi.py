"""The OpenAPI fields of a ``Router``'s routes that FastAPI cannot know from their shared endpoint.

``kvpool.http_server.build_app`` adds one FastAPI route per ``Route``; these give each its
parameters, request body, security, documented answers and summary.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from kvpool.http_api import OCTETS, TEXT, Auth, Doc, Route


class ErrorAnswer(BaseModel):
    """Every refusal: one line of JSON, with a machine-readable code."""

    error: str
    code: str


_BINARY = {"type": "string", "format": "binary"}


def operation_extra(route: Route) -> dict[str, Any]:
    """The OpenAPI fields FastAPI cannot know from ``dispatch``: parameters, request body, security."""
    doc = route.doc
    extra: dict[str, Any] = {}
    params = [{"name": seg[1:-1], "in": "path", "required": True, "schema": {"type": "string"}}
              for seg in route.segments if seg.startswith("{")]
    params += [{"name": n, "in": "query", "required": False, "schema": {"type": "string"}, "description": d}
               for n, d in doc.query.items()]
    params += [{"name": n, "in": "header", "required": False, "schema": {"type": "string"}, "description": d}
               for n, d in doc.headers.items()]
    if params:
        extra["parameters"] = params
    if doc.body == OCTETS:
        extra["requestBody"] = {"required": True, "content": {"application/octet-stream": {"schema": _BINARY}}}
    elif doc.body is not None:
        extra["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{doc.body.__name__}"}}}}
    if route.auth is Auth.TOKEN:
        extra["security"] = [{"bearer": []}]
    elif route.auth is Auth.LOCAL_TOKEN:  # a caller on another host is known by its address instead
        extra["security"] = [{"bearer": []}, {}]
    return extra


def answers(doc: Doc) -> dict[int | str, dict[str, Any]]:
    """The documented answers: the success (unless a model says it) and the one-line refusals."""
    out: dict[int | str, dict[str, Any]] = {"4XX": {"model": ErrorAnswer, "description": "refused"},
                                            "5XX": {"model": ErrorAnswer, "description": "failed"}}
    ok: dict[str, Any] = {"description": "OK"}
    if doc.answer == OCTETS:
        ok["content"] = {"application/octet-stream": {"schema": _BINARY}}
    elif doc.answer == TEXT:
        ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
    if doc.answer_headers:
        ok["headers"] = {n: {"description": d, "schema": {"type": "string"}} for n, d in doc.answer_headers.items()}
    out[200] = ok
    return out


def summary_of(docstring: str) -> str | None:
    """A handler docstring's first line without its ````METHOD /path``: ```` prefix."""
    line = (docstring.strip().splitlines() or [""])[0]
    if line.startswith("``") and "``: " in line:
        line = line.split("``: ", 1)[1]
    return line.rstrip(".")[:1].upper() + line.rstrip(".")[1:] or None
