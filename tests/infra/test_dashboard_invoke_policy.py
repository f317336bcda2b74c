"""Who may invoke the deployed dashboard, evaluated offline over the template's policies
and the caller policy docs/dashboard.md gives operators.

A function URL with AWS_IAM auth asks IAM two questions: ``lambda:InvokeFunctionUrl``
(context ``lambda:FunctionUrlAuthType = AWS_IAM``) and ``lambda:InvokeFunction``
(context ``lambda:InvokedViaFunctionUrl = true``). A direct ``lambda:Invoke`` asks only
the second, without that key, and may carry any event: any identity. These tests show
that nothing the template creates, and nothing the docs tell operators to grant, allows
the direct Invoke, while the URL stays open to the documented viewers.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.infra.template_policies import (
    ACCOUNT,
    function_arn,
    identity_statements,
    resource_policy,
)
from tests.infra.template_support import ROOT, load_sam_template, translate
from tests.support.iam_policies import Request, evaluate

DOCS = ROOT / "docs" / "dashboard.md"
VIEWER = f"arn:aws:sts::{ACCOUNT}:assumed-role/OnCall/ada"
PLACEHOLDER = "DASHBOARD_FUNCTION_ARN"


@pytest.fixture(scope="module")
def cfn() -> dict[str, Any]:
    sam = load_sam_template()
    sam["Parameters"]["DashboardEnabled"]["Default"] = "true"
    return translate(sam)


@pytest.fixture(scope="module")
def dashboard(cfn: dict[str, Any]) -> str:
    return function_arn(cfn, "DashboardFunction")


def documented_policy(marker: str, arn: str) -> list[dict[str, Any]]:
    """The JSON policy docs/dashboard.md shows after ``<!-- marker -->``."""
    text = DOCS.read_text(encoding="utf-8")
    found = re.search(rf"<!-- {marker} -->\s*```json\n(.*?)```", text, re.DOTALL)
    assert found, f"docs/dashboard.md has no ```json block after <!-- {marker} -->"
    document = json.loads(found.group(1).replace(PLACEHOLDER, arn))
    statements: list[dict[str, Any]] = document["Statement"]
    return statements


def url_request(arn: str, principal: str = VIEWER) -> list[Request]:
    """What Lambda asks IAM for one request through the function URL."""
    return [Request(principal, "lambda:InvokeFunctionUrl", arn,
                    {"lambda:FunctionUrlAuthType": "AWS_IAM"}),
            Request(principal, "lambda:InvokeFunction", arn,
                    {"lambda:InvokedViaFunctionUrl": "true"})]


def direct_invokes(arn: str, principal: str = VIEWER) -> list[Request]:
    """What it asks for a direct Invoke: the key absent, or false; qualified or not."""
    return [Request(principal, "lambda:InvokeFunction", arn),
            Request(principal, "lambda:InvokeFunction", arn,
                    {"lambda:InvokedViaFunctionUrl": "false"}),
            Request(principal, "lambda:InvokeFunction", f"{arn}:$LATEST")]


def test_the_documented_caller_policy_opens_the_url_and_refuses_every_direct_invoke(
    dashboard: str, cfn: dict[str, Any],
) -> None:
    caller = documented_policy("caller-policy", dashboard)
    resource = resource_policy(cfn, "DashboardFunction")

    for request in url_request(dashboard):
        decision = evaluate(request, identity=caller, resource=resource)
        assert decision.allowed, request
    for request in direct_invokes(dashboard):
        decision = evaluate(request, identity=caller, resource=resource)
        assert not decision.allowed, (request, decision)


def test_the_template_adds_nothing_to_the_dashboards_resource_policy_without_the_condition(
    dashboard: str, cfn: dict[str, Any],
) -> None:
    """AWS_IAM: SAM makes no public permission; any permission the template ever adds for
    InvokeFunction must carry InvokedViaFunctionUrl."""
    resource = resource_policy(cfn, "DashboardFunction")
    for principal in (VIEWER, "arn:aws:iam::999999999999:user/stranger", f"{ACCOUNT}"):
        for request in direct_invokes(dashboard, principal):
            assert not evaluate(request, resource=resource).allowed, request
    assert [s for s in resource if s["Action"] == "lambda:InvokeFunction"
            and s.get("Condition", {}).get("Bool") != {"lambda:InvokedViaFunctionUrl": "true"}
            ] == []


def test_no_role_or_managed_policy_of_the_template_may_invoke_the_dashboard_directly(
    dashboard: str, cfn: dict[str, Any],
) -> None:
    granted = {}
    for name, statements in identity_statements(cfn).items():
        for request in direct_invokes(dashboard, f"arn:aws:sts::{ACCOUNT}:assumed-role/{name}/s"):
            decision = evaluate(request, identity=statements)
            if decision.allowed:
                granted[name] = decision.allowed_by
    assert granted == {}
    # The check can see a grant: the worker's role may invoke the worker (fan-out).
    worker = function_arn(cfn, "WorkerFunction")
    assert evaluate(Request("arn:aws:sts::1:assumed-role/w/s", "lambda:InvokeFunction", worker),
                    identity=identity_statements(cfn)["WorkerFunctionRole"]).allowed


@pytest.mark.parametrize(("name", "statement"), [
    ("InvokeFunction without the condition",
     {"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": PLACEHOLDER}),
    ("lambda:*", {"Effect": "Allow", "Action": "lambda:*", "Resource": PLACEHOLDER}),
    ("lambda:Invoke*", {"Effect": "Allow", "Action": "lambda:Invoke*", "Resource": "*"}),
    ("every action", {"Effect": "Allow", "Action": "*", "Resource": "*"}),
])
def test_each_grant_the_docs_forbid_would_let_a_viewer_forge_any_identity(
    name: str, statement: dict[str, Any], dashboard: str,
) -> None:
    """The docs' list of what not to grant is right: each of these allows a direct
    Invoke (so the evaluator is not one that refuses everything)."""
    grant = json.loads(json.dumps(statement).replace(PLACEHOLDER, dashboard))
    assert evaluate(direct_invokes(dashboard)[0], identity=[grant]).allowed, name
    docs = DOCS.read_text(encoding="utf-8")
    assert f"`{statement['Action']}`" in docs, f"docs/dashboard.md does not name {name}"


def test_the_documented_deny_keeps_direct_invokes_out_even_beside_lambda_star(
    dashboard: str,
) -> None:
    """For accounts where viewers hold broader grants: the docs' explicit deny."""
    deny = documented_policy("deny-direct-invoke", dashboard)
    broad = [{"Effect": "Allow", "Action": "lambda:*", "Resource": "*"}]

    for request in direct_invokes(dashboard):
        assert not evaluate(request, identity=broad + deny).allowed, request
    for request in url_request(dashboard):
        assert evaluate(request, identity=broad + deny).allowed, request


def test_the_function_arn_output_describes_the_condition(cfn: dict[str, Any]) -> None:
    output = cfn["Outputs"]["DashboardFunctionArn"]
    assert output["Value"] == {"Fn::GetAtt": ["DashboardFunction", "Arn"]}
    assert "lambda:InvokedViaFunctionUrl" in output["Description"]
    assert output["Condition"] == "DashboardOn"
