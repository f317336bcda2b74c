"""infra/queue.yaml: one named queue's worker, declared as a nested application per queue.

It must lint as clean as the stack's own template, give its worker the queue, its own pool
(invoking only itself, only with a pool), its own limits, schedule and alarms, and take
every shared piece from an output of the leaseq stack (template.yaml's Queue* outputs).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from leaseq.settings import LeaseqSettings

from tests.infra.template_support import ROOT, load_sam_template, resources_of_type, translate
from tests.infra.test_template import LINT_RULES, cfn_lint

QUEUE_TEMPLATE = ROOT / "infra" / "queue.yaml"


@pytest.fixture(scope="module")
def queue_sam() -> dict[str, Any]:
    return load_sam_template(QUEUE_TEMPLATE)


@pytest.fixture(scope="module")
def queue_cfn(queue_sam: dict[str, Any]) -> dict[str, Any]:
    return translate(queue_sam)


def worker(queue_cfn: dict[str, Any]) -> dict[str, Any]:
    (function,) = resources_of_type(queue_cfn, "AWS::Lambda::Function").values()
    properties: dict[str, Any] = function["Properties"]
    return properties


def test_cfn_lint_with_informational_and_serverless_rules_finds_nothing_in_the_queue() -> None:
    lint = cfn_lint("infra/queue.yaml", *LINT_RULES)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_queues_worker_drains_its_queue_with_a_pool_of_its_own(
        queue_cfn: dict[str, Any]) -> None:
    properties = worker(queue_cfn)
    variables = properties["Environment"]["Variables"]
    assert variables["LEASEQ_QUEUE"] == {"Ref": "QueueName"}
    assert variables["LEASEQ_MAX_WORKERS"] == {"Ref": "MaxWorkers"}
    assert variables["LEASEQ_WORKER_FUNCTION"] == {"Ref": "FunctionName"}
    assert properties["FunctionName"] == {"Ref": "FunctionName"}
    for key, parameter in (("Timeout", "TimeoutSeconds"), ("MemorySize", "MemorySize")):
        assert properties[key] == {"Ref": parameter}
    assert properties["Architectures"] == [{"Ref": "Architecture"}]
    assert properties["ReservedConcurrentExecutions"]["Fn::If"][1] == {
        "Ref": "ReservedConcurrency"}


def test_the_queues_worker_may_invoke_only_itself_and_only_with_a_pool(
        queue_cfn: dict[str, Any]) -> None:
    (role,) = [r for n, r in resources_of_type(queue_cfn, "AWS::IAM::Role").items()
               if not n.endswith("ScheduleRole")]
    text = repr(role["Properties"]["Policies"])
    invokes = [p for p in role["Properties"]["Policies"]
               if "lambda:InvokeFunction" in repr(p)]
    assert len(invokes) == 1
    assert invokes[0]["Fn::If"][0] == "HasPool"
    assert "function:${FunctionName}" in repr(invokes[0])
    assert "*" not in re.sub(r"\$\{[^}]+\}", "", repr(invokes[0]))
    assert "rds-db:connect" in text


def test_the_queue_has_its_own_schedule_and_alarms_on_its_queue_dimension(
        queue_cfn: dict[str, Any]) -> None:
    (schedule,) = resources_of_type(queue_cfn, "AWS::Scheduler::Schedule").values()
    assert schedule["Properties"]["ScheduleExpression"] == {"Ref": "ScheduleExpression"}
    alarms = resources_of_type(queue_cfn, "AWS::CloudWatch::Alarm")
    lag = alarms["OldestReadyAgeAlarm"]["Properties"]
    assert lag["MetricName"] == "QueueOldestReadyAgeSeconds"
    assert {"Name": "queue", "Value": {"Ref": "QueueName"}} in lag["Dimensions"]
    assert alarms["WorkerErrorsAlarm"]["Properties"]["MetricName"] == "Errors"


def test_every_shared_parameter_is_an_output_of_the_leaseq_stack(
        queue_sam: dict[str, Any]) -> None:
    outputs = load_sam_template()["Outputs"]
    shared = {"LeaseqLayerArn", "CertificatesLayerArn", "SubnetIds", "SecurityGroupIds",
              "DbHost", "DbPort", "DbUser", "DbIamAuth", "DbConnectArn", "DbSslRootCert",
              "PermissionsBoundaryArn"}
    assert shared <= set(queue_sam["Parameters"])
    assert {f"Queue{name}" for name in shared} <= set(outputs)


def test_the_queues_environment_is_one_the_worker_settings_accept(
        queue_sam: dict[str, Any], queue_cfn: dict[str, Any]) -> None:
    defaults = {name: str(p.get("Default", "")) for name, p in queue_sam["Parameters"].items()}
    # (the RDS bundle is the certificates layer's, not on this machine: the system roots)
    defaults.update(QueueName="reports", FunctionName="leaseq-prod-reports", DbHost="db",
                    DbUser="leaseq_worker_login", DbSslRootCert="system")

    def resolve(value: Any) -> str | None:
        # A Ref is its parameter's value here; an Fn::If its first branch when that gives
        # a value (the conditions here only test a parameter for emptiness), else None.
        if isinstance(value, str):
            return value
        if "Ref" in value:
            return defaults.get(value["Ref"]) or None
        if "Fn::If" in value:
            return resolve(value["Fn::If"][1])
        return None

    environment = {key: text for key, value in
                   worker(queue_cfn)["Environment"]["Variables"].items()
                   if (text := resolve(value)) is not None}
    settings = LeaseqSettings.from_env(environment)
    assert (settings.worker.queue, settings.pool.queue) == ("reports", "reports")
    assert settings.pool.worker_function == "leaseq-prod-reports"


def test_the_queue_registers_its_worker_through_the_leaseq_stacks_migrations_function(
        queue_sam: dict[str, Any]) -> None:
    from leaseq_deploy.queue_workers import RESOURCE_TYPE, requested_worker

    registration = queue_sam["Resources"]["Registration"]
    assert registration["Type"] == RESOURCE_TYPE
    properties = registration["Properties"]
    assert properties["ServiceToken"] == {"Ref": "ServiceToken"}
    assert properties["WorkerFunction"] == {"Ref": "FunctionName"}
    # The worker waits for its registration: a refused budget creates no worker.
    assert queue_sam["Resources"]["WorkerFunction"]["DependsOn"] == "Registration"
    assert properties["ReservedConcurrency"] == {"Ref": "ReservedConcurrency"}
    assert properties["MaxWorkers"] == {"Ref": "MaxWorkers"}
    # The defaults make a registration the migrations function accepts.
    defaults = {name: str(p.get("Default", "")) for name, p in queue_sam["Parameters"].items()}
    accepted = requested_worker({"QueueName": "reports", "WorkerFunction": "leaseq-reports",
                                 "ReservedConcurrency": defaults["ReservedConcurrency"],
                                 "MaxWorkers": defaults["MaxWorkers"]})
    assert accepted.connections == int(defaults["ReservedConcurrency"])
    outputs = load_sam_template()["Outputs"]
    assert outputs["QueueServiceToken"]["Value"] == {"Fn::GetAtt": ["MigrationsFunction", "Arn"]}
    assert outputs["QueueEnqueueRoleName"]["Value"] == {"Ref": "EnqueueFunctionRole"}


def test_the_wake_policy_lets_the_enqueue_role_invoke_this_queues_worker_and_nothing_else(
        queue_sam: dict[str, Any]) -> None:
    wake = queue_sam["Resources"]["WakePolicy"]
    assert wake["Type"] == "AWS::IAM::Policy"
    assert wake["Properties"]["Roles"] == [{"Ref": "EnqueueRoleName"}]
    (statement,) = wake["Properties"]["PolicyDocument"]["Statement"]
    assert statement == {"Effect": "Allow", "Action": "lambda:InvokeFunction",
                         "Resource": {"Fn::GetAtt": ["WorkerFunction", "Arn"]}}


def test_the_enqueue_role_may_wake_the_workers_and_no_other_function() -> None:
    from tests.infra.template_policies import function_arn, identity_statements
    from tests.support.iam_policies import Request, evaluate

    sam = load_sam_template()
    sam["Parameters"]["DashboardEnabled"]["Default"] = "true"
    sam["Parameters"]["SlowKinds"]["Default"] = "report.build"
    cfn = translate(sam)
    enqueue = identity_statements(cfn)["EnqueueFunctionRole"]
    caller = "arn:aws:sts::123456789012:assumed-role/EnqueueFunctionRole/s"

    def may_invoke(function: str) -> bool:
        arn = function_arn(cfn, function)
        return evaluate(Request(caller, "lambda:InvokeFunction", arn), identity=enqueue).allowed

    assert may_invoke("WorkerFunction")
    assert may_invoke("SlowWorkerFunction")
    for other in ("DashboardFunction", "MigrationsFunction", "ReaperFunction", "EnqueueFunction"):
        assert not may_invoke(other), other
