"""infra/operator-access.yaml: the relay operators reach the database through with Session
Manager port forwarding, checked offline (cfn-lint and its structure; nothing here starts
an instance or a session, which needs an AWS account)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tests.infra.template_support import ROOT, load_sam_template, sam_environment

STACK = ROOT / "infra" / "operator-access.yaml"


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    return load_sam_template(STACK)


def test_cfn_lint_with_informational_and_serverless_rules_finds_nothing() -> None:
    lint = subprocess.run(
        [sys.executable, "-c", "import sys; from cfnlint.runner import main; sys.exit(main())",
         "infra/operator-access.yaml", "--include-checks", "I", "--append-rules",
         "cfn_lint_serverless.rules"],
        cwd=ROOT, capture_output=True, text=True, env=sam_environment(), timeout=180)

    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_relay_opens_no_port_and_its_role_may_only_serve_session_manager(
    stack: dict[str, Any],
) -> None:
    resources = stack["Resources"]
    group = resources["OperatorSecurityGroup"]["Properties"]
    role = resources["OperatorHostRole"]["Properties"]
    host = resources["OperatorHost"]["Properties"]

    assert "SecurityGroupIngress" not in group
    assert not [r for r in resources.values() if r["Type"] == "AWS::EC2::SecurityGroupIngress"]
    assert role["ManagedPolicyArns"] == [
        {"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"}]
    assert "Policies" not in role
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "ec2.amazonaws.com"}
    # IMDSv2 only, no key pair, no public address, an encrypted disk.
    assert host["MetadataOptions"]["HttpTokens"] == "required"
    assert "KeyName" not in host
    assert "NetworkInterfaces" not in host
    assert host["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True
    assert stack["Parameters"]["ImageId"]["Default"].startswith(
        "/aws/service/ami-amazon-linux-latest/al2023-ami-")


def test_the_agents_endpoints_take_https_from_the_relay_alone_and_only_when_asked_for(
    stack: dict[str, Any],
) -> None:
    resources = stack["Resources"]
    endpoints = {name: r for name, r in resources.items()
                 if r["Type"] == "AWS::EC2::VPCEndpoint"}

    services = sorted(r["Properties"]["ServiceName"]["Fn::Sub"].rsplit(".", 1)[1]
                      for r in endpoints.values())
    assert services == ["ec2messages", "ssm", "ssmmessages"]
    for endpoint in endpoints.values():
        assert endpoint["Condition"] == "CreateEndpoints"
        assert endpoint["Properties"]["PrivateDnsEnabled"] is True
        # One Availability Zone: each endpoint is billed per zone and hour.
        assert endpoint["Properties"]["SubnetIds"] == [{"Fn::Select": [0, {"Ref": "SubnetIds"}]}]
    (rule,) = resources["EndpointSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert (rule["FromPort"], rule["ToPort"]) == (443, 443)
    assert rule["SourceSecurityGroupId"] == {"Ref": "OperatorSecurityGroup"}


def test_its_security_group_is_what_the_leaseq_template_lets_into_the_proxy(
    stack: dict[str, Any],
) -> None:
    template = load_sam_template()

    assert stack["Outputs"]["OperatorSecurityGroupId"]["Value"] == {
        "Ref": "OperatorSecurityGroup"}
    assert "OperatorSecurityGroupId" in template["Parameters"]
    assert stack["Parameters"]["VpcId"]["Default"] == template["Parameters"]["VpcId"]["Default"]
    assert stack["Parameters"]["SubnetIds"]["Default"] == (
        template["Parameters"]["SubnetIds"]["Default"])
