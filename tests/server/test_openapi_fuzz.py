"""Schemathesis against a real `localchat serve` (the default model, no API key), from the OpenAPI
schema the server itself publishes: every operation, with bodies and parameters generated from the
schema (valid and not), answers without a 5xx and with a body that matches what the schema
declares for its status.

Schemathesis's coverage phase adds each field's edge values (its bounds and just past them, missing
required fields, wrong types) to the generated cases. Bounded to run in about a minute and a half
on two cores: a short context (every prompt fits in 128 tokens),
at most 4 sequences at once (a larger `n` is a 400), and at most 8 new tokens a request (its
token fields clamped before it is sent, and set where an operation's is optional and the case
leaves it out: the default, the rest of the context, took about 2 s a case), so no fuzzed request
keeps the engine long."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.serve_process import serve_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MODEL = "SmolLM2-135M-Instruct"  # the served model's name
MAX_NEW_TOKENS = 8
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# the operations whose token limit is optional, and its field (the Messages API requires its own)
OPTIONAL_LIMIT = {
    "/v1/completions": "max_tokens",
    "/v1/chat/completions": "max_tokens",
    "/v1/responses": "max_output_tokens",
}
CONFIG = schemathesis.Config.from_dict(
    {
        "seed": 42,  # the same cases every run
        # coverage: each field's boundaries and wrong types, as well as the generated cases
        "phases": {"coverage": {"enabled": True}, "stateful": {"enabled": False}},
    }
)


@pytest.fixture(scope="module")
def openapi_schema(default_gguf, tmp_path_factory):
    log = tmp_path_factory.mktemp("fuzz") / "serve.log"
    args = ["--max-model-len", "128", "--max-num-seqs", "4", "--max-waiting", "4"]
    args += ["--kv-cache-memory", "64MiB", "--threads", "1"]
    with serve_process(log, *args, timeout=180) as server:
        yield schemathesis.openapi.from_url(f"{server.base_url}/docs/openapi.json", config=CONFIG)
        assert server.process.poll() is None, server.log()


schema = schemathesis.pytest.from_fixture("openapi_schema")


def _bounded(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """`body` with each token count it gives (an integer) at most MAX_NEW_TOKENS, the limit set to
    it where the operation's is optional and no token field is given, and a model named by a
    string the served one (any other is a 404 before the body is looked at)."""
    bounded = {
        key: min(value, MAX_NEW_TOKENS) if key in TOKEN_FIELDS and type(value) is int else value
        for key, value in body.items()
    }
    if path in OPTIONAL_LIMIT and not any(key in bounded for key in TOKEN_FIELDS):
        bounded[OPTIONAL_LIMIT[path]] = MAX_NEW_TOKENS
    if isinstance(bounded.get("model"), str):
        bounded["model"] = MODEL
    return bounded


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_every_operation_answers_as_its_schema_says(case):
    if isinstance(case.body, dict):
        case.body = _bounded(case.path, case.body)
    case.call_and_validate(checks=[not_a_server_error, response_schema_conformance], timeout=60)
