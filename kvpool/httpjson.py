"""Compatibility names for kvpool's HTTP modules, until every importer uses them directly.

The shared types live in ``kvpool.http_api``, the server in ``kvpool.http_server``, the
client in ``kvpool.http_client``.
"""

from __future__ import annotations

from kvpool.http_api import (
    MAX_HEAD,
    MAX_JSON_DEPTH,
    ApiCounters,
    ApiError,
    ApiUnreachableError,
    Auth,
    Request,
    Response,
    Route,
    Router,
    is_remote,
)
from kvpool.http_client import JsonClient, Reply, check_url
from kvpool.http_server import ApiServer

__all__ = ["MAX_HEAD", "MAX_JSON_DEPTH", "ApiCounters", "ApiError", "ApiServer", "ApiUnreachableError", "Auth",
           "JsonClient", "Reply", "Request", "Response", "Route", "Router", "check_url", "is_remote"]
