"""The deployer's policies and the permissions boundary, read as IAM reads them.

Two kinds of checks. Static ones walk the JSON: no master-secret read without the tag that
ties the secret to a leaseq stack's database; every statement that writes a role or its
trust policy carries the boundary condition; every RDS create, snapshot and tag action
carries a stack-tag condition or is one of the listed exceptions. Attack ones put requests
to tests/infra/iam_policy.py (the subset of IAM's evaluation these files use): what a role
under the boundary, or the deployer, gets for each move of the security review.

The condition keys are those the Service Authorization Reference lists for the actions;
which tags AWS really puts in each request (CloudFormation's aws:cloudformation:stack-name
on a create, RDS's aws:rds:primaryDBInstanceArn on its managed secret) is documented in
infra/README.md, and was read from AWS's managed policies and CloudFormation's RDS
resource handlers, not observed in an account.
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any

import pytest

from tests.infra.iam_policy import Resource, allows, decision, request, statements
from tests.infra.template_support import ROOT, load_sam_template, resources_of_type, translate

BOUNDARY_ARN = "arn:aws:iam::*:policy/boundaries/leaseq-permissions-boundary"
#: Both boundaries an administrator makes: the stack's and the workers' (handlers').
BOUNDARY_ARNS = [BOUNDARY_ARN,
                 "arn:aws:iam::*:policy/boundaries/leaseq-handlers-boundary"]
STACK_TAG = "aws:cloudformation:stack-name"
ACCOUNT = "111122223333"
#: A database of this project, as CloudFormation names it after the stack.
OWN_DB = f"arn:aws:rds:eu-west-1:{ACCOUNT}:db:leaseq-prod-database-k3j4h5g6f7d8"
#: Another application's database in the same account.
FOREIGN_DB = f"arn:aws:rds:eu-west-1:{ACCOUNT}:db:payments-prod"
#: The services the stack's roles are for: the only principals their trust policies name.
TRUSTED_SERVICES = {"lambda.amazonaws.com", "rds.amazonaws.com", "scheduler.amazonaws.com"}


def document(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((ROOT / "infra" / name).read_text(encoding="utf-8"))
    return loaded


@pytest.fixture(scope="module")
def boundary() -> list[dict[str, Any]]:
    return statements([document("permissions-boundary.json")])


@pytest.fixture(scope="module")
def deployer() -> list[dict[str, Any]]:
    return statements([document("deployer-policy.json"),
                       document("deployer-policy-resources.json")])


def actions(statement: dict[str, Any]) -> list[str]:
    value = statement["Action"]
    return value if isinstance(value, list) else [value]


def resources(statement: dict[str, Any]) -> list[str]:
    value = statement["Resource"]
    return value if isinstance(value, list) else [value]


def granting(policy: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    """The Allow statements whose actions match ``action``."""
    return [s for s in policy if s["Effect"] == "Allow"
            and any(fnmatch.fnmatchcase(action.lower(), a.lower()) for a in actions(s))]


def master_secret(db_arn: str | None, *, owned_by_rds: bool = True) -> Resource:
    """An RDS-managed master secret (``rds!db-<uuid>``) with the tags RDS gives it."""
    keys = {}
    if db_arn is not None:
        keys["secretsmanager:ResourceTag/aws:rds:primaryDBInstanceArn"] = db_arn
        keys["aws:ResourceTag/aws:rds:primaryDBInstanceArn"] = db_arn
    if owned_by_rds:
        keys["secretsmanager:ResourceTag/aws:secretsmanager:owningService"] = "rds"
    return Resource(f"arn:aws:secretsmanager:eu-west-1:{ACCOUNT}:secret:"
                    "rds!db-6f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b-AbCdEf", keys)


# ---- the boundary: the most any stack role can do -----------------------------------------------


def test_no_master_secret_can_be_read_without_the_tag_naming_a_leaseq_database(
    boundary: list[dict[str, Any]], deployer: list[dict[str, Any]],
) -> None:
    for statement in granting(boundary + deployer, "secretsmanager:GetSecretValue"):
        for resource in resources(statement):
            if "secret:rds!" in resource or resource.endswith(":secret:*") or resource == "*":
                condition = statement.get("Condition", {})
                assert condition.get("StringLike", {}).get(
                    "secretsmanager:ResourceTag/aws:rds:primaryDBInstanceArn") == (
                    "arn:aws:rds:*:*:db:leaseq-*"), statement["Sid"]
                assert condition.get("StringEquals", {}).get(
                    "secretsmanager:ResourceTag/aws:secretsmanager:owningService") == "rds"
    # The deployer itself reads no secret at all.
    assert granting(deployer, "secretsmanager:GetSecretValue") == []


def test_a_stack_role_reads_its_own_databases_master_secret_and_no_other(
    boundary: list[dict[str, Any]],
) -> None:
    read = "secretsmanager:GetSecretValue"
    assert allows(boundary, request(read, master_secret(OWN_DB)))
    # The review's attack: every RDS-managed master secret of the account.
    assert not allows(boundary, request(read, master_secret(FOREIGN_DB)))
    # A secret merely named like one (no RDS tags), or tagged but not RDS's.
    assert not allows(boundary, request(read, master_secret(None, owned_by_rds=False)))
    assert not allows(boundary, request(read, master_secret(OWN_DB, owned_by_rds=False)))
    # Secrets an administrator names leaseq/... for an existing database stay readable.
    assert allows(boundary, request(
        read, f"arn:aws:secretsmanager:eu-west-1:{ACCOUNT}:secret:leaseq/owner-AbCdEf"))
    assert not allows(boundary, request(
        read, f"arn:aws:secretsmanager:eu-west-1:{ACCOUNT}:secret:payments/owner-AbCdEf"))


# ---- the deployer: roles and who may assume them ------------------------------------------------


#: Actions by which the deployer writes a role's permissions or its trust policy.
ROLE_WRITES = ("iam:CreateRole", "iam:PutRolePolicy", "iam:UpdateAssumeRolePolicy",
               "iam:PutRolePermissionsBoundary", "iam:AttachRolePolicy")


@pytest.mark.parametrize("action", ROLE_WRITES)
def test_every_statement_that_writes_a_role_or_its_trust_carries_the_boundary_condition(
    deployer: list[dict[str, Any]], action: str,
) -> None:
    found = granting(deployer, action)
    assert found, f"{action} is needed by the IAM role handler"
    for statement in found:
        assert statement["Condition"]["StringLike"]["iam:PermissionsBoundary"] == (
            BOUNDARY_ARNS), statement["Sid"]
        assert resources(statement) == ["arn:aws:iam::*:role/leaseq-*"], statement["Sid"]


def test_the_deployer_cannot_make_a_role_it_can_assume(deployer: list[dict[str, Any]]) -> None:
    role = f"arn:aws:iam::{ACCOUNT}:role/leaseq-prod-Escalation-1A2B3C"
    bounded = {"iam:PermissionsBoundary":
               f"arn:aws:iam::{ACCOUNT}:policy/boundaries/leaseq-permissions-boundary"}

    # Creating or re-trusting a role without the boundary, or with another one, is refused.
    for action in ("iam:CreateRole", "iam:UpdateAssumeRolePolicy", "iam:PutRolePolicy"):
        assert not allows(deployer, request(action, role)), action
        assert not allows(deployer, request(action, role, keys={
            "iam:PermissionsBoundary": f"arn:aws:iam::{ACCOUNT}:policy/AdministratorAccess"}))
        assert allows(deployer, request(action, role, keys=bounded)), action
        # The workers' boundary (handlers) is an administrator's too, and allowed as well.
        assert allows(deployer, request(action, role, keys={"iam:PermissionsBoundary":
            f"arn:aws:iam::{ACCOUNT}:policy/boundaries/leaseq-handlers-boundary"})), action
        # A policy the deployer could write itself is no boundary.
        assert not allows(deployer, request(action, role, keys={"iam:PermissionsBoundary":
            f"arn:aws:iam::{ACCOUNT}:policy/leaseq-handlers-boundary"})), action
    # Whatever trust policy it wrote (IAM has no condition key on its content), the
    # deployer's own credentials cannot assume, tag or name a session of a stack role.
    for action in ("sts:AssumeRole", "sts:TagSession", "sts:SetSourceIdentity"):
        assert decision(deployer, request(action, role)) == "denied", action
    # Roles may be handed only to the services of the stack.
    assert allows(deployer, request("iam:PassRole", role,
                                    keys={"iam:PassedToService": "lambda.amazonaws.com"}))
    assert not allows(deployer, request("iam:PassRole", role,
                                        keys={"iam:PassedToService": "ec2.amazonaws.com"}))


def test_the_stacks_roles_trust_only_lambda_rds_and_scheduler() -> None:
    cfn = translate(load_sam_template())
    roles = resources_of_type(cfn, "AWS::IAM::Role")

    assert roles
    for name, role in roles.items():
        trust = role["Properties"]["AssumeRolePolicyDocument"]
        for statement in trust["Statement"]:
            assert statement["Effect"] == "Allow", name
            assert actions(statement) == ["sts:AssumeRole"], name
            assert set(statement["Principal"]) == {"Service"}, name
            services = statement["Principal"]["Service"]
            assert set(services if isinstance(services, list) else [services]) <= (
                TRUSTED_SERVICES), name


# ---- the deployer: RDS creates, snapshots and tags ----------------------------------------------

STACK_CONDITIONS = (
    {"StringLike": {f"aws:RequestTag/{STACK_TAG}": "leaseq-*"}},
    {"StringLike": {f"aws:ResourceTag/{STACK_TAG}": "leaseq-*"}},
)
#: Statements of RDS create/snapshot/tag actions without a stack-tag condition, and why.
UNTAGGED_RDS = {
    "ProxiesHaveNoResourceLevelCreate": (
        ["rds:CreateDBProxy"], ["*"],
        "CreateDBProxy has no resource-level permission and its create request carries "
        "no CloudFormation tag to require; the proxy needs a leaseq-* role passed to RDS"),
    "TheFinalSnapshotNamedAfterTheStack": (
        ["rds:CreateDBSnapshot"], ["arn:aws:rds:*:*:snapshot:leaseq-*"],
        "the snapshot resource of the final snapshot, named after the stack by "
        "CloudFormation; its database must carry the stack's tag (statement above)"),
    "ProxyTargetGroupsCarryNoStackTagOfTheirOwn": (
        ["rds:DeregisterDBProxyTargets", "rds:ModifyDBProxyTargetGroup",
         "rds:RegisterDBProxyTargets"], ["arn:aws:rds:*:*:target-group:*"],
        "a proxy's target group carries no stack tag; the database registered with it does"),
}


def test_every_rds_create_snapshot_and_tag_statement_requires_the_stacks_tag(
    deployer: list[dict[str, Any]],
) -> None:
    checked = 0
    for statement in deployer:
        rds = [a for a in actions(statement) if a.startswith("rds:") and a.split(":")[1]
               .startswith(("Create", "AddTags", "Register", "Restore", "Copy"))]
        if statement["Effect"] != "Allow" or not rds:
            continue
        checked += 1
        if statement["Sid"] in UNTAGGED_RDS:
            listed, where, reason = UNTAGGED_RDS[statement["Sid"]]
            assert sorted(actions(statement)) == listed, statement["Sid"]
            assert resources(statement) == where, statement["Sid"]
            assert reason
            continue
        assert statement.get("Condition") in STACK_CONDITIONS, statement["Sid"]
    assert checked >= 8
    assert not granting(deployer, "rds:RestoreDBInstanceFromDBSnapshot")
    assert not granting(deployer, "rds:CopyDBSnapshot")
    assert not granting(deployer, "rds:ModifyDBSnapshotAttribute")  # no sharing


def test_the_deployer_creates_a_database_only_as_a_leaseq_stack_does(
    deployer: list[dict[str, Any]],
) -> None:
    create = "rds:CreateDBInstance"
    by_cloudformation = {f"aws:RequestTag/{STACK_TAG}": "leaseq-prod"}
    parts = (OWN_DB, f"arn:aws:rds:eu-west-1:{ACCOUNT}:subgrp:leaseq-prod-databasesubnetgroup-x",
             f"arn:aws:rds:eu-west-1:{ACCOUNT}:pg:default.postgres17",
             f"arn:aws:rds:eu-west-1:{ACCOUNT}:og:default:postgres-17")

    assert allows(deployer, request(create, *parts, keys=by_cloudformation))
    # Called directly (no CloudFormation tag, which nobody else can set), or for another
    # stack's name, or for an instance not named after a leaseq stack: refused.
    assert not allows(deployer, request(create, *parts))
    assert not allows(deployer, request(create, *parts,
                                        keys={f"aws:RequestTag/{STACK_TAG}": "payments"}))
    assert not allows(deployer, request(create, FOREIGN_DB, *parts[1:], keys=by_cloudformation))
    # Tagging on create is authorized too; tagging another application's resources is not.
    assert allows(deployer, request("rds:AddTagsToResource", OWN_DB, keys=by_cloudformation))
    assert not allows(deployer, request("rds:AddTagsToResource", FOREIGN_DB,
                                        keys={"aws:RequestTag/team": "payments"}))


def test_the_deployer_snapshots_only_a_leaseq_stacks_database(
    deployer: list[dict[str, Any]],
) -> None:
    snapshot = "rds:CreateDBSnapshot"
    own = Resource(OWN_DB, {f"aws:ResourceTag/{STACK_TAG}": "leaseq-prod"})
    foreign = Resource(FOREIGN_DB, {f"aws:ResourceTag/{STACK_TAG}": "payments"})
    final = f"arn:aws:rds:eu-west-1:{ACCOUNT}:snapshot:leaseq-prod-snapshot-database-q9w8e7"
    elsewhere = f"arn:aws:rds:eu-west-1:{ACCOUNT}:snapshot:exfil"

    assert allows(deployer, request(snapshot, own, final))
    # The review's attack: a snapshot of any database of the account.
    assert not allows(deployer, request(snapshot, foreign, final))
    assert not allows(deployer, request(snapshot, Resource(FOREIGN_DB), final))
    assert not allows(deployer, request(snapshot, own, elsewhere))
    # Registering a database with a proxy needs its stack tag as well.
    group = f"arn:aws:rds:eu-west-1:{ACCOUNT}:target-group:prx-tg-0123"
    assert allows(deployer, request("rds:RegisterDBProxyTargets", own, group))
    assert not allows(deployer, request("rds:RegisterDBProxyTargets", foreign, group))
