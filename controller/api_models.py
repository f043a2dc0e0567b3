"""The controller API's bodies and answers as pydantic models: what its OpenAPI schema says.

They describe; ``controller.api``'s handlers validate (with their own error codes, as the
API always did). docs/reference/openapi-controller.json is generated from them, and a test
checks that the committed file is what the controller serves at ``/openapi.json``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

KEY = "64-bit chunk key as hex text (0x optional)"


class Open(BaseModel):
    """An answer that may carry more fields than listed."""

    model_config = ConfigDict(extra="allow")


class Status(Open):
    """``GET /v1/status``: the loop, the switches, the pool."""


class Tiers(Open):
    """``GET /v1/tiers``: capacity and use per tier."""


class Stats(Open):
    """``GET /v1/stats``: the switches' counters and the loop's."""


class Nodes(Open):
    """``GET /v1/nodes``: the directory's nodes."""

    nodes: list[dict[str, object]]


class Top(Open):
    """``GET /v1/top``: the most valuable chunks."""


class Switch(Open):
    """``GET /v1/switches/{name}``: one switch's state."""


class Chunk(Open):
    """``GET /v1/chunks/{key}``: where one chunk is and what it is worth."""


class Override(BaseModel):
    """``POST /v1/{admit,evict,pin,unpin,quota,republish}``: an operator's override, applied at the next epoch."""

    key: str | None = Field(None, description=f"the chunk (every op but quota); {KEY}")
    action: str | None = Field(None, description="evict only: demote (default) or drop")
    tenant: int | None = Field(None, ge=0, description="the tenant (quota; admit/pin: default 0)")
    slots: int | None = Field(None, ge=1, description="quota only: the tenant's slots; null lifts the quota")
    generation: int | None = Field(None, ge=0, description="republish only: the new generation")
    nbytes: int | None = Field(None, ge=1, description="republish only: the chunk's size")


class OverrideAnswer(Open):
    """The override's outcome, as the epoch loop applied it."""


class Register(BaseModel):
    """``POST /v1/nodes/register``: a node joins the directory (from another host: from the address it claims)."""

    node_id: str
    address: str
    role: str = Field("holder", description="holder or requester")
    tiers: dict[str, int] = Field(default_factory=dict, description="tier name -> capacity in bytes")


class Registered(BaseModel):
    """The node's credential: every later call for it carries it (``X-Kvpool-Node-Credential``)."""

    node_id: str
    heartbeat_s: float
    node_credential: str


class Deregistered(BaseModel):
    """``DELETE /v1/nodes/{node}``."""

    deregistered: str


class Heartbeat(BaseModel):
    """``POST /v1/nodes/{node}/heartbeat``."""

    ok: bool


class Publish(BaseModel):
    """``POST /v1/nodes/{node}/publish``: chunks the node now holds in ``tier``."""

    keys: list[str] = Field(description=KEY)
    tier: str
    nbytes: int = Field(ge=0, description="bytes of each chunk")
    generations: dict[str, int] = Field(default_factory=dict, description="hex key -> generation")


class Published(Open):
    """How many of the chunks were new to the directory."""

    new: int


class Withdraw(BaseModel):
    """``POST /v1/nodes/{node}/withdraw``: chunks the node no longer holds (in ``tier``, or any)."""

    keys: list[str] = Field(description=KEY)
    tier: str | None = None


class Withdrawn(Open):
    """How many entries the directory dropped."""

    removed: int


class Version(BaseModel):
    """One chunk a holder publishes: its key, a digest of its bytes and its size."""

    key: str
    digest: str = Field(description="64-bit hex digest of the chunk's bytes")
    nbytes: int = Field(ge=1)


class Versions(BaseModel):
    """``POST /v1/nodes/{node}/versions``: a holder's chunks; a changed digest is a new generation."""

    chunks: list[Version]


class Generations(BaseModel):
    """Current generation per hex key."""

    generations: dict[str, int]
