"""The offline IAM evaluator (tests/support/iam_policies.py) follows the documented rules
the dashboard's invoke tests rely on, and refuses what it does not implement."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.iam_policies import Request, UnsupportedPolicyError, evaluate

ARN = "arn:aws:lambda:us-east-1:123456789012:function:leaseq-prod-dash"
WHO = "arn:aws:sts::123456789012:assumed-role/OnCall/ada"
INVOKE = Request(WHO, "lambda:InvokeFunction", ARN)


def _allow(**extra: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": ARN, **extra}


def test_nothing_granted_is_denied_and_an_explicit_deny_wins_over_any_allow() -> None:
    assert not evaluate(INVOKE).allowed
    assert evaluate(INVOKE, identity=[_allow()]).allowed
    deny = {**_allow(), "Effect": "Deny"}
    assert not evaluate(INVOKE, identity=[_allow()], resource=[
        {**deny, "Principal": "*"}]).allowed
    assert evaluate(INVOKE, identity=[_allow(), deny]).denied_by


@pytest.mark.parametrize(("condition", "context", "expected"), [
    ({"Bool": {"lambda:InvokedViaFunctionUrl": "true"}}, {}, False),
    ({"Bool": {"lambda:InvokedViaFunctionUrl": "true"}},
     {"lambda:InvokedViaFunctionUrl": "true"}, True),
    ({"Bool": {"lambda:InvokedViaFunctionUrl": "true"}},
     {"lambda:InvokedViaFunctionUrl": "false"}, False),
    ({"BoolIfExists": {"lambda:InvokedViaFunctionUrl": "false"}}, {}, True),
    ({"StringNotEquals": {"aws:PrincipalTag/team": "ops"}}, {}, True),
    ({"StringEquals": {"aws:PrincipalTag/team": ["ops", "sre"]}},
     {"aws:PrincipalTag/team": "sre"}, True),
    ({"StringLike": {"aws:userid": "AROA*:ada"}}, {"aws:userid": "AROAX:ada"}, True),
    ({"StringEquals": {"a": "1"}, "Bool": {"b": "true"}}, {"a": "1"}, False),
])
def test_conditions_follow_the_documented_missing_key_and_and_or_rules(
    condition: dict[str, Any], context: dict[str, str], expected: bool,
) -> None:
    request = Request(WHO, "lambda:InvokeFunction", ARN, context)
    assert evaluate(request, identity=[_allow(Condition=condition)]).allowed is expected


def test_actions_match_without_case_and_resources_with_case_and_not_action_inverts() -> None:
    assert evaluate(INVOKE, identity=[_allow(Action="Lambda:invoke*")]).allowed
    assert not evaluate(INVOKE, identity=[_allow(Resource=ARN.upper())]).allowed
    assert evaluate(INVOKE, identity=[{"Effect": "Allow", "NotAction": "iam:*",
                                       "Resource": "*"}]).allowed
    assert not evaluate(INVOKE, identity=[{"Effect": "Allow", "NotAction": "lambda:*",
                                           "Resource": "*"}]).allowed


def test_a_resource_policy_grants_its_named_principal_but_an_account_only_delegates() -> None:
    named = {**_allow(), "Principal": {"AWS": WHO}}
    account = {**_allow(), "Principal": {"AWS": "arn:aws:iam::123456789012:root"}}
    assert evaluate(INVOKE, resource=[named]).allowed
    assert not evaluate(INVOKE, resource=[account]).allowed
    assert evaluate(INVOKE, resource=[account], identity=[_allow()]).allowed
    other = Request("arn:aws:sts::999999999999:assumed-role/X/y", INVOKE.action, ARN)
    assert not evaluate(other, resource=[account]).allowed


def test_a_permissions_boundary_caps_what_identity_policies_allow() -> None:
    assert not evaluate(INVOKE, identity=[_allow()], boundary=[
        {"Effect": "Allow", "Action": "lambda:InvokeFunction",
         "Resource": "arn:aws:lambda:*:*:function:other-*"}]).allowed
    assert evaluate(INVOKE, identity=[_allow()], boundary=[
        {"Effect": "Allow", "Action": "lambda:*", "Resource": "*"}]).allowed


@pytest.mark.parametrize("statement", [
    _allow(Condition={"NumericLessThan": {"aws:MultiFactorAuthAge": "3600"}}),
    _allow(Condition={"ForAnyValue:StringEquals": {"aws:TagKeys": "x"}}),
    {**_allow(), "Principal": {"Federated": "cognito-identity.amazonaws.com"}},
    {**_allow(), "NotPrincipal": {"AWS": WHO}},
])
def test_what_the_evaluator_does_not_implement_is_refused_not_guessed(
    statement: dict[str, Any],
) -> None:
    with pytest.raises(UnsupportedPolicyError):
        evaluate(INVOKE, identity=[statement] if "Principal" not in statement
                 and "NotPrincipal" not in statement else [],
                 resource=[statement] if "Principal" in statement
                 or "NotPrincipal" in statement else [])
