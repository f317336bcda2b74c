"""The IAM statements a translated template creates, as plain JSON for
:mod:`tests.support.iam_policies`: each role's and managed policy's statements, and a
function's resource policy (its ``AWS::Lambda::Permission`` resources).

Intrinsic functions are expanded the cautious way for a question of the form "could
this ever allow ...": both branches of every ``Fn::If`` are kept (a statement that only
one branch makes still counts), ``Ref`` of a parameter is its default, pseudo parameters
are those of one stack (:data:`STACK`), and ``Fn::GetAtt X.Arn`` of a function is the
ARN it would have (its ``FunctionName`` if it sets one, else a name of CloudFormation's
form ``<stack>-X-<suffix>``). Anything else becomes a value no pattern matches
(``unresolved:...``), never a wildcard.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

REGION = "us-east-1"
ACCOUNT = "123456789012"
STACK = "leaseq-prod"
PSEUDO = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT,
          "AWS::StackName": STACK, "AWS::URLSuffix": "amazonaws.com"}
NO_VALUE = object()


def function_arn(cfn: dict[str, Any], name: str) -> str:
    """The ARN ``Fn::GetAtt name.Arn`` gives, for the function ``name``."""
    given = cfn["Resources"][name]["Properties"].get("FunctionName")
    function = next(iter(strings(cfn, given))) if given is not None else (
        f"{STACK}-{name}-Q1w2E3r4T5y6")
    return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function}"


def _sub(cfn: dict[str, Any], template: str, variables: dict[str, Any]) -> Iterator[str]:
    head, sep, rest = template.partition("${")
    if not sep:
        yield head
        return
    name, _, tail = rest.partition("}")
    if name in variables:
        values = list(strings(cfn, variables[name]))
    elif name in PSEUDO:
        values = [PSEUDO[name]]
    elif name in cfn.get("Parameters", {}):
        values = [str(cfn["Parameters"][name].get("Default", ""))]
    elif "." in name:
        resource, attribute = name.split(".", 1)
        values = list(strings(cfn, {"Fn::GetAtt": [resource, attribute]}))
    else:
        values = [f"unresolved:{name}"]
    for value in values:
        for end in _sub(cfn, tail, variables):
            yield head + value + end


def strings(cfn: dict[str, Any], value: Any) -> Iterator[str]:
    """Every string ``value`` could become (both branches of each Fn::If)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from strings(cfn, item)
    elif isinstance(value, dict) and len(value) == 1:
        (function, argument), = value.items()
        if function == "Fn::If":
            for branch in argument[1:]:
                yield from strings(cfn, branch)
        elif function == "Ref":
            if argument == "AWS::NoValue":
                return
            if argument in PSEUDO:
                yield PSEUDO[argument]
            elif argument in cfn.get("Parameters", {}):
                yield str(cfn["Parameters"][argument].get("Default", ""))
            elif cfn["Resources"].get(argument, {}).get("Type") == "AWS::Lambda::Function":
                yield function_arn(cfn, argument).rsplit(":", 1)[1]
            else:
                yield f"unresolved:Ref:{argument}"
        elif function == "Fn::GetAtt":
            resource, attribute = argument if isinstance(argument, list) else \
                argument.split(".", 1)
            if attribute == "Arn" and cfn["Resources"].get(resource, {}).get("Type") == (
                    "AWS::Lambda::Function"):
                yield function_arn(cfn, resource)
            else:
                yield f"unresolved:GetAtt:{resource}.{attribute}"
        elif function == "Fn::Sub":
            template, variables = (argument, {}) if isinstance(argument, str) else argument
            yield from _sub(cfn, template, variables)
        else:
            yield f"unresolved:{function}"
    else:
        yield f"unresolved:{value!r}"


def _statements(cfn: dict[str, Any], value: Any) -> Iterator[dict[str, Any]]:
    """The plain statements of a statement, a list of them, or an Fn::If of either."""
    if isinstance(value, list):
        for item in value:
            yield from _statements(cfn, item)
    elif isinstance(value, dict) and set(value) == {"Fn::If"}:
        for branch in value["Fn::If"][1:]:
            yield from _statements(cfn, branch)
    elif isinstance(value, dict) and "Effect" in value:
        plain: dict[str, Any] = {"Effect": value["Effect"]}
        for key in ("Action", "NotAction", "Resource", "NotResource"):
            if key in value:
                plain[key] = list(strings(cfn, value[key]))
        if "Condition" in value:
            plain["Condition"] = value["Condition"]
        yield plain


def _documents(cfn: dict[str, Any], value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, list):
        for item in value:
            yield from _documents(cfn, item)
    elif isinstance(value, dict) and set(value) == {"Fn::If"}:
        for branch in value["Fn::If"][1:]:
            yield from _documents(cfn, branch)
    elif isinstance(value, dict) and "PolicyDocument" in value:
        yield value["PolicyDocument"]


def identity_statements(cfn: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each role's inline statements (plus the template's managed policies it attaches),
    and each managed policy's own, by logical id."""
    managed: dict[str, list[dict[str, Any]]] = {}
    for name, resource in cfn["Resources"].items():
        if resource["Type"] == "AWS::IAM::ManagedPolicy":
            managed[name] = list(_statements(
                cfn, resource["Properties"]["PolicyDocument"]["Statement"]))
    found = dict(managed)
    for name, resource in cfn["Resources"].items():
        if resource["Type"] != "AWS::IAM::Role":
            continue
        statements = [s for document in _documents(cfn, resource["Properties"].get(
            "Policies", [])) for s in _statements(cfn, document["Statement"])]
        for arn in resource["Properties"].get("ManagedPolicyArns", []):
            if isinstance(arn, dict) and arn.get("Ref") in managed:
                statements += managed[arn["Ref"]]
        found[name] = statements
    return found


def resource_policy(cfn: dict[str, Any], function: str) -> list[dict[str, Any]]:
    """The statements the template's AWS::Lambda::Permission resources add to
    ``function``'s resource policy, as Lambda writes them (FunctionUrlAuthType and
    InvokedViaFunctionUrl become conditions)."""
    arn = function_arn(cfn, function)
    statements = []
    for resource in cfn["Resources"].values():
        if resource["Type"] != "AWS::Lambda::Permission":
            continue
        properties = resource["Properties"]
        targets = set(strings(cfn, properties["FunctionName"]))
        if not targets & {arn, arn.rsplit(":", 1)[1]}:
            continue
        principal = next(iter(strings(cfn, properties["Principal"])))
        statement: dict[str, Any] = {
            "Effect": "Allow", "Action": properties["Action"], "Resource": arn,
            "Principal": "*" if principal == "*" else (
                {"Service": principal} if principal.endswith(".amazonaws.com")
                else {"AWS": principal})}
        condition: dict[str, dict[str, str]] = {}
        if "FunctionUrlAuthType" in properties:
            condition.setdefault("StringEquals", {})["lambda:FunctionUrlAuthType"] = str(
                properties["FunctionUrlAuthType"])
        if properties.get("InvokedViaFunctionUrl") is True:
            condition.setdefault("Bool", {})["lambda:InvokedViaFunctionUrl"] = "true"
        for key, context in (("SourceArn", "AWS:SourceArn"),
                             ("SourceAccount", "AWS:SourceAccount"),
                             ("PrincipalOrgID", "aws:PrincipalOrgID")):
            if key in properties:
                operator = "ArnLike" if key == "SourceArn" else "StringEquals"
                condition.setdefault(operator, {})[context] = next(
                    iter(strings(cfn, properties[key])))
        if condition:
            statement["Condition"] = condition
        statements.append(statement)
    return statements
