"""schemathesis against the served OpenAPI document: generated requests (bounded, derandomised) to every
operation, as a cluster admin and as a plain member. No response may be a 5xx, and every 4xx must
carry the error envelope.

(schemathesis' pytest plugin does not run under pytest 9 yet, so the operations are driven through
its Python API: one hypothesis run per operation.)
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings

MAX_EXAMPLES = 10


def test_no_generated_request_gets_a_5xx(app, world, sessions):
    from dlts.services.nodes import issue_node_token

    with sessions() as s:
        node_token = issue_node_token(s, "testnode")
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 30, [op.label for op in operations]
    failures: list[str] = []

    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            if case.path.endswith("/report"):  # the agent's endpoint: its node token, its node
                case.path_parameters = {"name": "testnode"}
                tokens = {"agent": node_token}
            else:
                tokens = {user: world.tokens[user] for user in ("admin", "bob")}
            for user, token in tokens.items():
                response = case.call(headers={"Authorization": f"Bearer {token}"})
                if response.status_code >= 500:
                    failures.append(f"{case.method} {case.formatted_path} as {user} -> {response.status_code}: {response.text[:300]}")
                elif response.status_code >= 400:
                    body = response.json()
                    if set(body.get("error", {})) != {"code", "message", "details"}:
                        failures.append(f"{case.method} {case.formatted_path} -> {response.status_code} without the envelope: {body}")

        run()
    assert not failures, "\n".join(failures[:20])
