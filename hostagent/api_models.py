"""The agent API's bodies and answers as pydantic models: what its OpenAPI schema says.

They describe; ``hostagent.api``'s handlers validate (with their own error codes, as the
API always did). docs/reference/openapi-agent.json is generated from them, and a test
checks that the committed file is what the agent serves at ``/openapi.json``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

KEY = "64-bit chunk key as hex text (0x optional): JSON numbers lose precision past 2**53"


class Open(BaseModel):
    """An answer that may carry more fields than listed."""

    model_config = ConfigDict(extra="allow")


class Health(Open):
    """``GET /v1/health``: alive, and where it listens."""

    ok: bool
    pid: int
    udp: list[Any] = Field(description="[host, port] of the agent's UDP transport")
    api_url: str
    tiers: list[str]
    api_socket: str | None = Field(None, description="unix:/PATH when the API has a Unix socket")


class Stats(Open):
    """``GET /v1/stats``: every counter, by part (transport, tiers, api, ...)."""


class KeySpec(BaseModel):
    """The chunks asked for: ``keys``, or the prompt's tokens (``model_id``, ``token_ids``, ``block_size``)."""

    keys: list[str] | None = Field(None, description=f"chunk keys in prefix order; {KEY}")
    model_id: str | None = Field(None, description="the model whose key chain the tokens start")
    token_ids: list[int] | None = Field(None, description="the prompt's token ids")
    block_size: int | None = Field(None, description="tokens per chunk", gt=0)


class FetchRequest(KeySpec):
    """``POST /v1/fetch`` and ``/v1/prefetch``: the longest available prefix of the chunks."""

    holder: str | None = Field(None, description='"host:port" of the holder\'s UDP transport; none: local and '
                                                 "directory only")
    timeout: float | None = Field(None, description="seconds for the whole fetch (default: the agent's)", gt=0,
                                  le=3600)
    generation: int | None = Field(None, description="the generation the chunks must have", ge=0, le=0xFFFF_FFFF)
    local: bool | None = Field(None, description="false: every chunk crosses the network, nothing is kept")


class PrefetchAnswer(BaseModel):
    """``POST /v1/prefetch``: what was fetched (and kept), not the bytes."""

    found: int
    requested: int
    bytes: int
    seconds: float
    stopped: str | None = Field(description="why the prefix stopped short, null when every chunk came")
    timing: dict[str, Any] | None = Field(description="where the fetched chunks' transfer time went")


class LookupAnswer(BaseModel):
    """``POST /v1/lookup``: leading chunks held here, and held here or known to the directory."""

    requested: int
    local: int
    available: int


class PushRequest(KeySpec):
    """``POST /v1/push``: send the held chunks to an address unasked."""

    to: str = Field(description='IPv4 "host:port" of the receiver\'s UDP transport')


class PushAnswer(BaseModel):
    """``POST /v1/push``: how many were sent, and the keys not held."""

    pushed: int
    missing: list[str]


class HintItem(BaseModel):
    """One chunk the fabric names."""

    key: str = Field(description="0x-prefixed 64-bit hex key")
    path: str = Field(description="single or servable")
    nbytes: int = Field(0, ge=0)


class HintsRequest(BaseModel):
    """``POST /v1/hints``: the fabric's hints, replacing the last ones."""

    ttl_s: float = Field(gt=0, description="seconds to trust them")
    merge: bool = False
    chunks: list[HintItem]


class HintsAnswer(BaseModel):
    """``POST /v1/hints``: chunks named."""

    chunks: int


class PutAnswer(BaseModel):
    """``PUT /v1/chunks/{key}``: where it landed."""

    key: str
    bytes: int
    tier: str


class PublishAnswer(BaseModel):
    """``POST /v1/publish``: chunks and bytes stored."""

    published: int
    bytes: int


class DeleteAnswer(BaseModel):
    """``DELETE /v1/chunks/{key}``: whether it was held."""

    deleted: bool
