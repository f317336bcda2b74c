"""infra/permissions-boundary.yaml: the two boundaries an administrator deploys, and the
workers' one as the extension point for what the handlers use.

The stack's statements are the JSON file's (which an administrator may create with the CLI
instead); the handlers' boundary adds the actions, resources and secrets its parameters
name, and nothing else. What each boundary then allows is asked through the offline reading
of IAM's evaluation (tests/infra/iam_policy.py), with the parameters resolved as
CloudFormation would for a given deploy.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.infra.iam_policy import allows, request, statements
from tests.infra.template_support import (
    ROOT,
    load_sam_template,
    parameter_values,
    rule_refusals,
    rule_value,
    sam_environment,
)

STACK = ROOT / "infra" / "permissions-boundary.yaml"
ACCOUNT = "123456789012"
BUCKET = "arn:aws:s3:::invoices-bucket"
API_KEY = f"arn:aws:secretsmanager:eu-west-1:{ACCOUNT}:secret:invoices/api-key-AbCdEf"


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    return load_sam_template(STACK)


def base_document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        (ROOT / "infra" / "permissions-boundary.json").read_text(encoding="utf-8"))
    return document


def resolved(stack: dict[str, Any], logical_id: str, **given: str) -> dict[str, Any]:
    """The policy document of ``logical_id`` as CloudFormation makes it for ``given``."""
    values = parameter_values(stack, **given)
    conditions = stack["Conditions"]

    def resolve(value: Any) -> Any:
        if isinstance(value, list):
            return [item for item in (resolve(v) for v in value) if item is not _NO_VALUE]
        if isinstance(value, dict):
            if set(value) == {"Fn::If"}:
                condition, when_true, when_false = value["Fn::If"]
                held = rule_value(conditions[condition], values, conditions)
                return resolve(when_true if held else when_false)
            if value == {"Ref": "AWS::NoValue"}:
                return _NO_VALUE
            if len(value) == 1 and next(iter(value)).startswith(("Fn::", "Ref")):
                return rule_value(value, values, conditions)
            return {key: resolve(item) for key, item in value.items()}
        return value

    document: dict[str, Any] = resolve(
        stack["Resources"][logical_id]["Properties"]["PolicyDocument"])
    return document


_NO_VALUE = object()


def lint(path: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from cfnlint.runner import main; sys.exit(main())",
         path, "--include-checks", "I", "--append-rules", "cfn_lint_serverless.rules", *extra],
        cwd=ROOT, capture_output=True, text=True, env=sam_environment(), timeout=180)


def test_cfn_lint_finds_nothing_and_its_one_exception_still_fires_without_the_switch(
    stack: dict[str, Any], tmp_path: Any,
) -> None:
    assert lint("infra/permissions-boundary.yaml").returncode == 0
    assert stack["Metadata"]["cfn-lint"]["config"]["ignore_checks"] == ["W1033"]
    assert "W1033" in stack["Metadata"]["LintExceptions"]
    unswitched = tmp_path / "boundary.yaml"
    unswitched.write_text(STACK.read_text(encoding="utf-8").replace(
        "      ignore_checks: [W1033]\n", "      ignore_checks: []\n"), encoding="utf-8")
    assert "W1033" in lint(str(unswitched)).stdout


def test_the_stacks_boundary_is_the_json_files_and_the_workers_adds_only_the_handlers(
    stack: dict[str, Any],
) -> None:
    base = base_document()

    assert resolved(stack, "PermissionsBoundary") == base
    plain = resolved(stack, "HandlersBoundary")
    assert plain == base  # nothing for the handlers until the administrator names it
    extended = resolved(stack, "HandlersBoundary", HandlerActions="s3:GetObject,s3:PutObject",
                        HandlerResources=f"{BUCKET}/*", HandlerSecretArns=API_KEY)
    added = [s for s in extended["Statement"] if s not in base["Statement"]]
    assert added == [
        {"Sid": "WhatTheHandlersMayCall", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject"], "Resource": [f"{BUCKET}/*"]},
        {"Sid": "SecretsTheHandlersMayRead", "Effect": "Allow",
         "Action": "secretsmanager:GetSecretValue", "Resource": [API_KEY]}]
    names = {r["Properties"]["ManagedPolicyName"]: r["Properties"]["Path"]
             for r in stack["Resources"].values()}
    assert names == {"leaseq-permissions-boundary": "/boundaries/",
                     "leaseq-handlers-boundary": "/boundaries/"}


def test_the_workers_boundary_lets_the_handlers_do_what_it_names_and_nothing_more(
    stack: dict[str, Any],
) -> None:
    base = statements([resolved(stack, "PermissionsBoundary")])
    workers = statements([resolved(
        stack, "HandlersBoundary", HandlerActions="s3:GetObject,ses:SendEmail",
        HandlerResources=f"{BUCKET}/*,arn:aws:ses:eu-west-1:{ACCOUNT}:identity/example.com",
        HandlerSecretArns=API_KEY)])
    get_invoice = request("s3:GetObject", f"{BUCKET}/2026/11.pdf")

    assert allows(workers, get_invoice)
    assert not allows(base, get_invoice)
    assert not allows(workers, request("s3:GetObject", "arn:aws:s3:::other-bucket/x"))
    assert not allows(workers, request("s3:DeleteObject", f"{BUCKET}/2026/11.pdf"))
    assert allows(workers, request("secretsmanager:GetSecretValue", API_KEY))
    assert not allows(base, request("secretsmanager:GetSecretValue", API_KEY))
    assert not allows(workers, request(
        "secretsmanager:GetSecretValue",
        f"arn:aws:secretsmanager:eu-west-1:{ACCOUNT}:secret:payments/key-AbCdEf"))
    # What every role needs stays: the worker still reaches its own login and leaseq secrets.
    for asked in (request("rds-db:connect", f"arn:aws:rds-db:eu-west-1:{ACCOUNT}:dbuser:"
                                            "prx-0123/leaseq_worker_login"),
                  request("secretsmanager:GetSecretValue",
                          f"arn:aws:secretsmanager:eu-west-1:{ACCOUNT}:secret:leaseq/w-AbCdEf")):
        assert allows(workers, asked)
        assert allows(base, asked)
    assert not allows(workers, request("iam:CreateRole", f"arn:aws:iam::{ACCOUNT}:role/x"))


def test_the_parameters_refuse_identity_actions_and_actions_without_resources(
    stack: dict[str, Any],
) -> None:
    actions = re.compile(stack["Parameters"]["HandlerActions"]["AllowedPattern"])

    for accepted in ("", "s3:GetObject", "s3:GetObject,ses:SendEmail", "s3:*",
                     "dynamodb:PutItem,sqs:SendMessage"):
        assert actions.fullmatch(accepted), accepted
    for refused in ("*", "iam:PassRole", "s3:GetObject,iam:CreateRole", "sts:AssumeRole",
                    "organizations:LeaveOrganization", "s3:GetObject,", "s3 GetObject"):
        assert not actions.fullmatch(refused), refused
    assert rule_refusals(stack, HandlerActions="s3:GetObject") == ["ActionsNeedResources"]
    assert rule_refusals(stack, HandlerActions="s3:GetObject",
                         HandlerResources=f"{BUCKET}/*") == []
    assert rule_refusals(stack) == []


def test_the_workers_boundary_output_is_what_the_template_parameter_accepts(
    stack: dict[str, Any],
) -> None:
    template = load_sam_template()["Parameters"]["WorkerPermissionsBoundaryArn"]
    name = stack["Resources"]["HandlersBoundary"]["Properties"]["ManagedPolicyName"]

    assert re.fullmatch(template["AllowedPattern"],
                        f"arn:aws:iam::{ACCOUNT}:policy/boundaries/{name}")
    assert stack["Outputs"]["WorkerPermissionsBoundaryArn"]["Value"] == {
        "Ref": "HandlersBoundary"}
