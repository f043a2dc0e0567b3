"""kvpool: an in-network KV-cache pool for LLM inference (shared code: wire format, CLI)."""

__version__ = "0.1.0"
