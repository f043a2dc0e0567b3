"""The committed OpenAPI files are what the running agent and controller serve at ``/openapi.json``.

After an API change, regenerate them: ``KVPOOL_WRITE_OPENAPI=1 pytest tests/test_openapi.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from hostagent.client import AgentClient
from hostagent.daemon import Agent, AgentConfig
from hostagent.registration import ControllerClient
from tests.ctl_harness import running
from tests.paths import REPO

REFERENCE = REPO / "docs" / "reference"


def _check(served: dict[str, Any], name: str) -> None:
    path = REFERENCE / name
    if os.environ.get("KVPOOL_WRITE_OPENAPI"):
        path.write_text(json.dumps(served, indent=1, sort_keys=True) + "\n")
    committed = json.loads(path.read_text())
    assert served == committed, (f"{path.relative_to(REPO)} differs from the served schema: regenerate it with "
                                 "KVPOOL_WRITE_OPENAPI=1 pytest tests/test_openapi.py")


def test_the_agent_serves_the_committed_openapi_schema() -> None:
    agent = Agent(AgentConfig(udp_port=0, api_port=0, log_level="WARNING"))
    agent.start()
    try:
        served = AgentClient(agent.api_url).http.get("/openapi.json")
    finally:
        agent.stop()
    assert served["info"]["title"] == "kvpool agent API"
    assert {"/v1/fetch", "/v1/publish", "/v1/chunks/{key}", "/v1/health"} <= set(served["paths"])
    _check(served, "openapi-agent.json")


def test_the_controller_serves_the_committed_openapi_schema(tmp_path: Path) -> None:
    with running(tmp_path, switch=False) as d:
        served = ControllerClient(d.url, timeout=10).get("/openapi.json")
    assert served["info"]["title"] == "kvpool controller API"
    assert {"/v1/status", "/v1/nodes/register", "/v1/admit"} <= set(served["paths"])
    _check(served, "openapi-controller.json")


@pytest.mark.parametrize("name", ["openapi-agent.json", "openapi-controller.json"])
def test_every_operation_documents_its_refusals(name: str) -> None:
    doc = json.loads((REFERENCE / name).read_text())
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert {"200", "4XX"} <= set(op["responses"]), (method, path)
            assert op["summary"], (method, path)
