"""Property-based requests generated from the server's own OpenAPI document (schemathesis + hypothesis):
for the inference routes, requests that follow the document and requests that break it (negative
mode), no 5xx, no hang, and every answer matches the document (status codes, content types, JSON
bodies). A bounded, derandomized number of examples per route and mode, so CI stays quick and stable.

(schemathesis' own pytest plugin does not load on pytest 9 here, so the operations' strategies are
driven with hypothesis directly.)
"""
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_schema_conformance, status_code_conformance)

from tests.servers import API_KEY

EXAMPLES = 20
AUTH = {"Authorization": f"Bearer {API_KEY}"}


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def fuzz(base: str, path: str, mode: GenerationMode, headers=None) -> int:
    """Run the examples; returns how many requests were made. Schema-valid requests may still be refused
    (a URL that does not answer, a prompt past the context): only invalid ones must be (negative mode)."""
    headers = headers or {}
    checks = CHECKS + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json", headers=headers)
    operation = schema[path]["POST"]
    calls = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case):
        case.call_and_validate(base_url=base, headers=headers, checks=checks, timeout=60)
        calls.append(case)

    check()
    return len(calls)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"])
def test_openai_routes_hold_their_contract(llava_server, path, mode):
    assert fuzz(llava_server.base, path, mode) >= 5


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_pooling_route_holds_its_contract(flood_server, mode):
    assert fuzz(flood_server.base, "/pooling", mode, headers=AUTH) >= 5
