"""template.yaml, infra/ and samconfig.toml, checked offline.

cfn-lint (pinned) and ``sam validate --lint`` catch what CloudFormation's schemas know; the
rest of this file checks what they do not: schedule grammar, retries, reserved concurrency,
the runtime login, what re-runs the migrations, and the deployer's permissions. It reads the
template after aws-sam-translator has expanded it, i.e. what CloudFormation will create.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
import sys
import tomllib
from typing import Any

import pytest

from tests.infra.template_support import (
    ROOT,
    find_sam,
    load_sam_template,
    parameter_default,
    resources_of_type,
    sam_environment,
    schedule_expression_problem,
    translate,
)

RUNTIME_FUNCTIONS = ("WorkerFunction", "ReaperFunction", "EnqueueFunction")
ALL_FUNCTIONS = (*RUNTIME_FUNCTIONS, "MigrationsFunction")


@pytest.fixture(scope="module")
def sam() -> dict[str, Any]:
    return load_sam_template()


@pytest.fixture(scope="module")
def cfn(sam: dict[str, Any]) -> dict[str, Any]:
    return translate(sam)


def function_properties(cfn: dict[str, Any], name: str) -> dict[str, Any]:
    resource = cfn["Resources"][name]
    assert resource["Type"] == "AWS::Lambda::Function"
    properties: dict[str, Any] = resource["Properties"]
    return properties


# ---- linters ---------------------------------------------------------------------------------


def test_cfn_lint_at_the_pinned_version_finds_nothing_in_the_templates() -> None:
    version = subprocess.run(
        [sys.executable, "-c", "import cfnlint.version as v; print(v.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert version == "1.58.0", "cfn-lint is pinned in pyproject.toml; its data drifts"

    lint = subprocess.run(
        [sys.executable, "-c", "import sys; from cfnlint.runner import main; sys.exit(main())",
         "template.yaml", "infra/network.yaml"],
        cwd=ROOT, capture_output=True, text=True, env=sam_environment(), timeout=120,
    )

    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_sam_validate_with_lint_accepts_the_template() -> None:
    sam_cli = find_sam()
    if sam_cli is None:
        pytest.skip("SAM CLI not found (set SAM_CLI or install aws-sam-cli into .venv-sam)")

    result = subprocess.run(
        [sam_cli, "validate", "--lint", "--template-file", "template.yaml"],
        cwd=ROOT, capture_output=True, text=True, env=sam_environment(), timeout=180,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "is a valid SAM Template" in result.stdout + result.stderr


# ---- what gets deployed ----------------------------------------------------------------------


def test_the_expanded_template_has_every_piece_of_the_deployment(cfn: dict[str, Any]) -> None:
    types = {name: resource["Type"] for name, resource in cfn["Resources"].items()}
    expected = {
        "WorkerFunction": "AWS::Lambda::Function",
        "ReaperFunction": "AWS::Lambda::Function",
        "EnqueueFunction": "AWS::Lambda::Function",
        "MigrationsFunction": "AWS::Lambda::Function",
        "WorkerFunctionSchedule": "AWS::Scheduler::Schedule",
        "ReaperFunctionSchedule": "AWS::Scheduler::Schedule",
        "WorkerFunctionEventInvokeConfig": "AWS::Lambda::EventInvokeConfig",
        "ReaperFunctionEventInvokeConfig": "AWS::Lambda::EventInvokeConfig",
        "Migrations": "Custom::LeaseqMigrations",
        "Database": "AWS::RDS::DBInstance",
        "DatabaseProxy": "AWS::RDS::DBProxy",
        "DatabaseProxyTargetGroup": "AWS::RDS::DBProxyTargetGroup",
        "EnqueueEventBus": "AWS::Events::EventBus",
        "EnqueueFunctionEnqueueEvent": "AWS::Events::Rule",
        "EnqueueProducerPolicy": "AWS::IAM::ManagedPolicy",
        "WorkerLogGroup": "AWS::Logs::LogGroup",
        "Dashboard": "AWS::CloudWatch::Dashboard",
    }
    assert {name: types.get(name) for name in expected} == expected
    layers = resources_of_type(cfn, "AWS::Lambda::LayerVersion")
    assert len(layers) == 1


def test_the_layer_is_built_by_sam_for_python311_on_x86_64_and_every_function_uses_it(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    layer = sam["Resources"]["LeaseqLayer"]
    assert layer["Metadata"] == {"BuildMethod": "python3.11", "BuildArchitecture": "x86_64"}
    assert layer["Properties"]["CompatibleArchitectures"] == ["x86_64"]
    (layer_id,) = resources_of_type(cfn, "AWS::Lambda::LayerVersion")
    for name in ALL_FUNCTIONS:
        properties = function_properties(cfn, name)
        assert properties["Runtime"] == "python3.11"
        assert properties["Architectures"] == ["x86_64"]
        assert properties["Handler"] == "app.lambda_handler"
        assert properties["Layers"] == [{"Ref": layer_id}]


# ---- schedules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "accepted"),
    [
        ("rate(1 minute)", True),
        ("rate(5 minutes)", True),
        ("rate(1 hour)", True),
        ("rate(12 hours)", True),
        ("rate(1 day)", True),
        ("cron(0/5 * * * ? *)", True),
        ("cron(15 10 ? * MON-FRI *)", True),
        ("rate(30 seconds)", False),
        ("rate(1 minutes)", False),
        ("rate(2 minute)", False),
        ("rate(0 minutes)", False),
        ("cron(* * * * *)", False),
        ("cron(0 12 * * * *)", False),
        ("cron(61 * * * ? *)", False),
        ("every minute", False),
    ],
)
def test_schedule_expressions_follow_eventbridge_schedulers_grammar(
    sam: dict[str, Any], expression: str, accepted: bool,
) -> None:
    assert (schedule_expression_problem(expression) is None) is accepted
    for parameter in ("WorkerScheduleExpression", "ReaperScheduleExpression"):
        pattern = sam["Parameters"][parameter]["AllowedPattern"]
        # The parameter's pattern may be looser than the grammar, never wrong on these.
        if not accepted and expression.startswith("rate"):
            assert not re.match(pattern, expression), f"{parameter} admits {expression}"
        if accepted:
            assert re.match(pattern, expression), f"{parameter} refuses {expression}"


def test_every_deployed_schedule_has_a_valid_expression_including_samconfig_overrides(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    schedules = resources_of_type(cfn, "AWS::Scheduler::Schedule")
    assert len(schedules) == 2
    for schedule in schedules.values():
        expression = parameter_default(sam, schedule["Properties"]["ScheduleExpression"])
        assert schedule_expression_problem(expression) is None, expression
    for environment, overrides in samconfig_overrides().items():
        for key in ("WorkerScheduleExpression", "ReaperScheduleExpression"):
            if key in overrides:
                problem = schedule_expression_problem(overrides[key])
                assert problem is None, f"samconfig {environment} {key}: {problem}"


@pytest.mark.parametrize(("function", "task"), [("Worker", "worker"), ("Reaper", "reaper")])
def test_schedules_omit_names_send_an_explicit_input_and_never_retry(
    cfn: dict[str, Any], function: str, task: str,
) -> None:
    properties = cfn["Resources"][f"{function}FunctionSchedule"]["Properties"]

    assert "Name" not in properties  # OmitName: two stacks in one account do not collide
    assert properties["FlexibleTimeWindow"] == {"Mode": "OFF"}
    target = properties["Target"]
    assert target["Arn"] == {"Fn::GetAtt": [f"{function}Function", "Arn"]}
    assert target["RetryPolicy"]["MaximumRetryAttempts"] == 0
    assert json.loads(target["Input"]) == {
        "source": "leaseq.schedule",
        "task": task,
        "scheduled_time": "<aws.scheduler.scheduled-time>",
    }


# ---- async retries, reserved concurrency -----------------------------------------------------


@pytest.mark.parametrize("function", ["WorkerFunction", "ReaperFunction", "MigrationsFunction"])
def test_scheduled_and_custom_resource_functions_have_no_async_retries(
    cfn: dict[str, Any], function: str,
) -> None:
    config = cfn["Resources"][f"{function}EventInvokeConfig"]["Properties"]

    assert config["FunctionName"] == {"Ref": function}
    assert config["MaximumRetryAttempts"] == 0


def test_async_enqueue_failures_land_in_the_dead_letter_queue(cfn: dict[str, Any]) -> None:
    config = cfn["Resources"]["EnqueueFunctionEventInvokeConfig"]["Properties"]
    rule = cfn["Resources"]["EnqueueFunctionEnqueueEvent"]["Properties"]

    queue_arn = {"Fn::GetAtt": ["EnqueueDeadLetterQueue", "Arn"]}
    assert config["DestinationConfig"]["OnFailure"]["Destination"] == queue_arn
    assert rule["Targets"][0]["DeadLetterConfig"]["Arn"] == queue_arn
    assert rule["EventPattern"] == {"detail-type": ["leaseq.enqueue"]}
    assert rule["EventBusName"] == {"Ref": "EnqueueEventBus"}


@pytest.mark.parametrize(
    ("function", "parameter"),
    [
        ("WorkerFunction", "WorkerReservedConcurrency"),
        ("ReaperFunction", "ReaperReservedConcurrency"),
        ("EnqueueFunction", "EnqueueReservedConcurrency"),
    ],
)
def test_reserved_concurrency_comes_from_each_functions_budget_parameter(
    sam: dict[str, Any], cfn: dict[str, Any], function: str, parameter: str,
) -> None:
    reserved = function_properties(cfn, function)["ReservedConcurrentExecutions"]
    condition = reserved["Fn::If"][0]

    assert reserved == {"Fn::If": [condition, {"Ref": parameter}, {"Ref": "AWS::NoValue"}]}
    assert sam["Conditions"][condition] == {"Fn::Not": [{"Fn::Equals": [{"Ref": parameter}, 0]}]}
    assert int(sam["Parameters"][parameter]["Default"]) >= 1


def test_the_migrations_function_runs_one_at_a_time(cfn: dict[str, Any]) -> None:
    assert function_properties(cfn, "MigrationsFunction")["ReservedConcurrentExecutions"] == 1


# ---- the database login ----------------------------------------------------------------------


def settings_variables() -> set[str]:
    """Every environment variable the library's settings declare (aliases)."""
    from leaseq import settings

    names: set[str] = set()
    for model in vars(settings).values():
        fields = getattr(model, "model_fields", None)
        if isinstance(fields, dict):
            names |= {f.alias for f in fields.values() if getattr(f, "alias", None)}
    return names


def test_runtime_functions_set_only_variables_the_settings_declare_and_the_same_login(
    cfn: dict[str, Any],
) -> None:
    declared = settings_variables() | {"POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE"}
    logins = []
    for name in RUNTIME_FUNCTIONS:
        variables = function_properties(cfn, name)["Environment"]["Variables"]
        assert set(variables) <= declared, set(variables) - declared
        assert variables["POWERTOOLS_SERVICE_NAME"] == "leaseq"
        assert variables["POWERTOOLS_METRICS_NAMESPACE"] == "Leaseq"
        logins.append({key: variables[key] for key in (
            "LEASEQ_DB_HOST", "LEASEQ_DB_PORT", "LEASEQ_DB_NAME", "LEASEQ_DB_USER",
            "LEASEQ_DB_IAM_AUTH", "LEASEQ_DATABASE_SECRET_ARN", "LEASEQ_DB_SSLMODE")})
    assert logins[0] == logins[1] == logins[2]
    assert logins[0]["LEASEQ_DB_USER"] == {"Ref": "RuntimeDbUser"}
    assert logins[0]["LEASEQ_DB_HOST"]["Fn::If"][1] == {
        "Fn::GetAtt": ["DatabaseProxy", "Endpoint"]}
    # The proxy listens on 5432 even when the database itself uses another port.
    assert logins[0]["LEASEQ_DB_PORT"] == {"Fn::If": ["UsesProxy", "5432", {"Ref": "DbPort"}]}


def test_runtime_functions_may_connect_only_as_the_runtime_user_through_the_proxy(
    cfn: dict[str, Any],
) -> None:
    statement = cfn["Resources"]["RuntimeDatabaseAccessPolicy"]["Properties"][
        "PolicyDocument"]["Statement"][0]
    condition, iam_statement, secret_statement = statement["Fn::If"]
    created, existing = iam_statement["Resource"]["Fn::If"][1:]

    assert condition == "UseIamAuth"
    assert iam_statement["Action"] == "rds-db:connect"
    template, variables = created["Fn::Sub"]
    assert template.endswith(":dbuser:${ProxyId}/${RuntimeDbUser}")
    assert variables["ProxyId"] == {
        "Fn::Select": [6, {"Fn::Split": [":", {"Fn::GetAtt": ["DatabaseProxy", "DBProxyArn"]}]}]}
    assert existing["Fn::Sub"].endswith(":dbuser:${ExistingDbResourceId}/${RuntimeDbUser}")
    assert secret_statement["Resource"] == {"Ref": "RuntimeSecretArn"}
    for name in RUNTIME_FUNCTIONS:
        role = cfn["Resources"][f"{name}Role"]["Properties"]
        assert {"Ref": "RuntimeDatabaseAccessPolicy"} in role["ManagedPolicyArns"]
        # Besides: only what SAM adds for the enqueue failure destination.
        inline = [statement["Action"] for policy in role.get("Policies", [])
                  for statement in policy["PolicyDocument"]["Statement"]]
        assert set(inline) <= {"sqs:SendMessage"}, inline


def test_the_proxy_authenticates_end_to_end_with_iam_and_requires_tls(cfn: dict[str, Any]) -> None:
    proxy = cfn["Resources"]["DatabaseProxy"]["Properties"]
    database = cfn["Resources"]["Database"]["Properties"]

    assert proxy["DefaultAuthScheme"] == "IAM_AUTH"
    assert proxy["RequireTLS"] is True
    assert database["EnableIAMDatabaseAuthentication"] is True
    assert database["ManageMasterUserPassword"] is True
    assert "MasterUserPassword" not in database
    assert cfn["Resources"]["Database"]["DeletionPolicy"] == "Snapshot"


# ---- migrations at deploy time ---------------------------------------------------------------


def test_the_migrations_resource_re_runs_when_the_layer_content_changes(
    sam: dict[str, Any],
) -> None:
    # sam package names the uploaded layer after its content, and SAM derives the layer's
    # logical id (so its version ARN) from that URI.
    before = translate(sam, layer_uri="s3://artifacts/0f3c9a.zip")
    after = translate(sam, layer_uri="s3://artifacts/8d2e17.zip")

    ref_before = before["Resources"]["Migrations"]["Properties"]["LayerVersionArn"]
    ref_after = after["Resources"]["Migrations"]["Properties"]["LayerVersionArn"]
    assert ref_before != ref_after
    assert ref_after["Ref"] in resources_of_type(after, "AWS::Lambda::LayerVersion")


def test_the_migrations_resource_has_a_timeout_and_runs_before_the_runtime_functions(
    cfn: dict[str, Any],
) -> None:
    migrations = cfn["Resources"]["Migrations"]["Properties"]

    assert migrations["ServiceToken"] == {"Fn::GetAtt": ["MigrationsFunction", "Arn"]}
    assert 60 <= migrations["ServiceTimeout"] <= 3600
    assert function_properties(cfn, "MigrationsFunction")["Timeout"] < migrations["ServiceTimeout"]
    assert migrations["RuntimeDbUser"] == {"Ref": "RuntimeDbUser"}
    for name in RUNTIME_FUNCTIONS:
        assert "Migrations" in cfn["Resources"][name]["DependsOn"]
    # ... and after the database is reachable and the proxy has its target.
    assert migrations["DatabaseIngress"]["Fn::If"][1] == {"Ref": "DatabaseFromFunctionsIngress"}
    assert migrations["ProxyTargetGroup"]["Fn::If"][1] == {"Ref": "DatabaseProxyTargetGroup"}


def test_the_migrations_function_logs_in_directly_with_the_owner_secret(
    cfn: dict[str, Any],
) -> None:
    variables = function_properties(cfn, "MigrationsFunction")["Environment"]["Variables"]

    assert variables["LEASEQ_DB_HOST"]["Fn::If"][1] == {
        "Fn::GetAtt": ["Database", "Endpoint.Address"]}
    assert variables["LEASEQ_DATABASE_SECRET_ARN"]["Fn::If"][1] == {
        "Fn::GetAtt": ["Database", "MasterUserSecret.SecretArn"]}


# ---- operations ------------------------------------------------------------------------------


def test_every_function_logs_to_a_group_with_retention(cfn: dict[str, Any]) -> None:
    for name in ALL_FUNCTIONS:
        group = function_properties(cfn, name)["LoggingConfig"]["LogGroup"]["Ref"]
        assert cfn["Resources"][group]["Properties"]["RetentionInDays"] == {
            "Ref": "LogRetentionDays"}


def alarm_metrics(alarm: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(namespace, metric, dimension value) of an alarm, including metric-math inputs."""
    properties = alarm["Properties"]
    found = set()
    entries = [{"Metric": properties}] if "MetricName" in properties else [
        m["MetricStat"] for m in properties["Metrics"] if "MetricStat" in m]
    for entry in entries:
        metric = entry["Metric"]
        for dimension in metric.get("Dimensions", []):
            value = dimension["Value"]
            if isinstance(value, dict):
                value = value.get("Ref") or json.dumps(value)
            found.add((metric["Namespace"], metric["MetricName"], value))
    return found


def test_alarms_cover_dead_jobs_queue_age_errors_silence_and_throttles(
    cfn: dict[str, Any],
) -> None:
    alarms = resources_of_type(cfn, "AWS::CloudWatch::Alarm")
    watched = set().union(*(alarm_metrics(a) for a in alarms.values()))

    for expected in [
        ("Leaseq", "JobsDead", "leaseq"),
        ("Leaseq", "OldestReadyAgeSeconds", "leaseq"),
        ("AWS/Lambda", "Errors", "WorkerFunction"),
        ("AWS/Lambda", "Errors", "ReaperFunction"),
        ("AWS/Lambda", "Invocations", "WorkerFunction"),
        ("AWS/Lambda", "Invocations", "ReaperFunction"),
        ("AWS/Lambda", "Throttles", "WorkerFunction"),
        ("AWS/Lambda", "Throttles", "ReaperFunction"),
        ("AWS/Lambda", "Throttles", "EnqueueFunction"),
    ]:
        assert expected in watched, expected
    for name in ("WorkerNotRunningAlarm", "ReaperNotRunningAlarm"):
        properties = alarms[name]["Properties"]
        assert properties["TreatMissingData"] == "breaching"
        assert properties["ComparisonOperator"] == "LessThanThreshold"


@pytest.mark.parametrize("creates_database", [True, False])
def test_the_dashboard_body_is_json_in_both_database_modes(
    cfn: dict[str, Any], creates_database: bool,
) -> None:
    body, variables = cfn["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    condition, with_database, without_database = variables["DatabaseWidgets"]["Fn::If"]
    assert condition == "CreateDatabase"
    fragment = with_database["Fn::Sub"][0] if creates_database else without_database

    def placeholder(match: re.Match[str]) -> str:
        return "X" + re.sub(r"\W", "_", match.group(1))

    text = re.sub(r"\$\{([^}]+)\}", placeholder, body.replace("${DatabaseWidgets}", fragment))
    widgets = json.loads(text)["widgets"]

    metrics = {m[1] for w in widgets for m in w["properties"].get("metrics", [])}
    assert {"JobsClaimed", "JobsSucceeded", "JobsDead", "QueueLag", "JobDuration",
            "OldestReadyAgeSeconds", "Invocations", "Errors"} <= metrics
    assert ("DatabaseConnectionsCurrentlySessionPinned" in metrics) is creates_database


def test_producers_in_other_stacks_get_exports_to_enqueue(cfn: dict[str, Any]) -> None:
    outputs = cfn["Outputs"]
    for name in ("EnqueueFunctionArn", "EnqueueEventBusName", "EnqueueEventBusArn",
                 "EnqueueProducerPolicyArn"):
        assert outputs[name]["Export"]["Name"] == {"Fn::Sub": f"${{AWS::StackName}}-{name}"}
    statements = cfn["Resources"]["EnqueueProducerPolicy"]["Properties"]["PolicyDocument"][
        "Statement"]
    assert {(s["Action"], json.dumps(s["Resource"])) for s in statements} == {
        ("lambda:InvokeFunction", json.dumps({"Fn::GetAtt": ["EnqueueFunction", "Arn"]})),
        ("events:PutEvents", json.dumps({"Fn::GetAtt": ["EnqueueEventBus", "Arn"]})),
    }


# ---- samconfig.toml --------------------------------------------------------------------------


def samconfig_overrides() -> dict[str, dict[str, str]]:
    config = tomllib.loads((ROOT / "samconfig.toml").read_text(encoding="utf-8"))
    found = {}
    for environment, commands in config.items():
        if isinstance(commands, dict):
            text = commands.get("deploy", {}).get("parameters", {}).get("parameter_overrides")
            if text:
                pairs = (item.split("=", 1) for item in shlex.split(text))
                found[environment] = {key: value for key, value in pairs}
    return found


def test_samconfig_names_environments_whose_overrides_are_parameters_and_no_secrets(
    sam: dict[str, Any],
) -> None:
    config = tomllib.loads((ROOT / "samconfig.toml").read_text(encoding="utf-8"))
    overrides = samconfig_overrides()

    assert {"default", "dev", "prod"} <= set(overrides)
    stacks = {config[env]["global"]["parameters"]["stack_name"] for env in ("dev", "prod")}
    assert stacks == {"leaseq-dev", "leaseq-prod"}
    for environment, values in overrides.items():
        unknown = set(values) - set(sam["Parameters"])
        assert not unknown, f"{environment} overrides parameters the template lacks: {unknown}"
        for key, value in values.items():
            allowed = sam["Parameters"][key].get("AllowedValues")
            if allowed is not None:
                assert value in [str(v) for v in allowed], (environment, key, value)
    lines = (ROOT / "samconfig.toml").read_text(encoding="utf-8").lower().splitlines()
    text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    for word in ("password", "secret_access_key", "aws_access_key_id", "token"):
        assert word not in text
    assert not re.search(r"\b\d{12}\b", text), "no account ids in samconfig.toml"
    assert not re.search(r"\b(vpc|subnet|sg)-[0-9a-f]{8,}\b", text), "no resource ids"


# ---- the deployer's policy -------------------------------------------------------------------

#: The API call CloudFormation makes, with the deployer's credentials, to create each type.
CREATE_ACTION = {
    "AWS::CloudWatch::Alarm": "cloudwatch:PutMetricAlarm",
    "AWS::CloudWatch::Dashboard": "cloudwatch:PutDashboard",
    "AWS::EC2::RouteTable": "ec2:CreateRouteTable",
    "AWS::EC2::SecurityGroup": "ec2:CreateSecurityGroup",
    "AWS::EC2::SecurityGroupIngress": "ec2:AuthorizeSecurityGroupIngress",
    "AWS::EC2::Subnet": "ec2:CreateSubnet",
    "AWS::EC2::SubnetRouteTableAssociation": "ec2:AssociateRouteTable",
    "AWS::EC2::VPC": "ec2:CreateVpc",
    "AWS::EC2::VPCEndpoint": "ec2:CreateVpcEndpoint",
    "AWS::Events::EventBus": "events:CreateEventBus",
    "AWS::Events::Rule": "events:PutRule",
    "AWS::IAM::ManagedPolicy": "iam:CreatePolicy",
    "AWS::IAM::Role": "iam:CreateRole",
    "AWS::Lambda::EventInvokeConfig": "lambda:PutFunctionEventInvokeConfig",
    "AWS::Lambda::Function": "lambda:CreateFunction",
    "AWS::Lambda::LayerVersion": "lambda:PublishLayerVersion",
    "AWS::Lambda::Permission": "lambda:AddPermission",
    "AWS::Lambda::Url": "lambda:CreateFunctionUrlConfig",
    "AWS::Logs::LogGroup": "logs:CreateLogGroup",
    "AWS::RDS::DBInstance": "rds:CreateDBInstance",
    "AWS::RDS::DBProxy": "rds:CreateDBProxy",
    "AWS::RDS::DBProxyTargetGroup": "rds:RegisterDBProxyTargets",
    "AWS::RDS::DBSubnetGroup": "rds:CreateDBSubnetGroup",
    "AWS::SQS::Queue": "sqs:CreateQueue",
    "AWS::SQS::QueuePolicy": "sqs:SetQueueAttributes",
    "AWS::SSM::Parameter": "ssm:PutParameter",
    "AWS::Scheduler::Schedule": "scheduler:CreateSchedule",
    "Custom::LeaseqMigrations": "lambda:InvokeFunction",
}


def allowed_actions() -> list[str]:
    policy = json.loads((ROOT / "infra" / "deployer-policy.json").read_text(encoding="utf-8"))
    actions: list[str] = []
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        action = statement["Action"]
        actions.extend([action] if isinstance(action, str) else action)
    return actions


def test_the_deployer_policy_allows_creating_every_resource_type_of_both_templates(
    cfn: dict[str, Any],
) -> None:
    network = load_sam_template(ROOT / "infra" / "network.yaml")
    types = {r["Type"] for r in [*cfn["Resources"].values(), *network["Resources"].values()]}
    actions = allowed_actions()

    unknown = types - set(CREATE_ACTION)
    assert not unknown, f"new resource types: add their actions to the policy and here: {unknown}"
    for type_name in sorted(types):
        needed = CREATE_ACTION[type_name]
        assert any(fnmatch.fnmatchcase(needed, pattern) for pattern in actions), (
            f"infra/deployer-policy.json cannot create {type_name} ({needed})")
    assert "iam:PassRole" in actions
    assert "cloudformation:CreateChangeSet" in actions


@pytest.mark.parametrize(("function", "event_file"), [
    ("Worker", "worker_schedule.json"), ("Reaper", "reaper_schedule.json")])
def test_the_sample_events_have_the_shape_the_schedules_send(
    cfn: dict[str, Any], function: str, event_file: str,
) -> None:
    """events/*.json feed `sam local invoke -e` and the handler tests: keep them true."""
    sent = json.loads(cfn["Resources"][f"{function}FunctionSchedule"]["Properties"]["Target"][
        "Input"])
    sample = json.loads((ROOT / "events" / event_file).read_text(encoding="utf-8"))

    assert set(sample) == set(sent)
    assert {k: v for k, v in sample.items() if k != "scheduled_time"} == {
        k: v for k, v in sent.items() if k != "scheduled_time"}


# ---- the web dashboard ---------------------------------------------------------------------


def test_the_dashboard_is_off_by_default_and_behind_a_function_url_with_iam_auth(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    assert parameter_default(sam, {"Ref": "DashboardEnabled"}) == "false"
    assert sam["Conditions"]["DashboardOn"] == {"Fn::Equals": [{"Ref": "DashboardEnabled"},
                                                               "true"]}
    (url_name,) = resources_of_type(cfn, "AWS::Lambda::Url")
    url = cfn["Resources"][url_name]
    assert url["Properties"]["AuthType"] == "AWS_IAM"
    assert url["Properties"]["TargetFunctionArn"] == {"Ref": "DashboardFunction"}
    for name in ("DashboardFunction", "DashboardFunctionRole", url_name, "DashboardLogGroup"):
        assert cfn["Resources"][name]["Condition"] == "DashboardOn", name
    assert cfn["Outputs"]["DashboardUrl"]["Condition"] == "DashboardOn"
    # AWS_IAM: no public invoke permission is created for the URL.
    assert not [r for r in cfn["Resources"].values() if r["Type"] == "AWS::Lambda::Permission"
                and r["Properties"].get("FunctionUrlAuthType") == "NONE"]


def test_the_dashboard_logs_in_like_the_runtime_functions_and_reads_its_access_lists(
    cfn: dict[str, Any],
) -> None:
    declared = settings_variables() | {"POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE"}
    dashboard = function_properties(cfn, "DashboardFunction")
    variables = dashboard["Environment"]["Variables"]
    worker = function_properties(cfn, "WorkerFunction")["Environment"]["Variables"]
    login = ("LEASEQ_DB_HOST", "LEASEQ_DB_PORT", "LEASEQ_DB_NAME", "LEASEQ_DB_USER",
             "LEASEQ_DB_IAM_AUTH", "LEASEQ_DATABASE_SECRET_ARN", "LEASEQ_DB_SSLMODE")
    assert {k: variables[k] for k in login} == {k: worker[k] for k in login}
    assert variables["LEASEQ_DASHBOARD_OPERATORS"] == {"Ref": "DashboardOperators"}
    assert variables["LEASEQ_DASHBOARD_TENANT_VIEWERS"] == {"Ref": "DashboardTenantViewers"}
    dashboard_variables = {"LEASEQ_DASHBOARD_OPERATORS", "LEASEQ_DASHBOARD_VIEWERS",
                           "LEASEQ_DASHBOARD_TENANT_VIEWERS",
                           "LEASEQ_DASHBOARD_READER_SECRET_ARN"}
    assert set(variables) <= declared | dashboard_variables, set(variables) - declared
    group = dashboard["LoggingConfig"]["LogGroup"]["Ref"]
    assert cfn["Resources"][group]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    role = cfn["Resources"]["DashboardFunctionRole"]["Properties"]
    assert {"Ref": "RuntimeDatabaseAccessPolicy"} in role["ManagedPolicyArns"]


def test_the_dashboard_settings_declare_every_variable_the_template_sets() -> None:
    from leaseq_dashboard.settings import DashboardSettings

    aliases = {f.alias for f in DashboardSettings.model_fields.values()}
    assert {"LEASEQ_DASHBOARD_OPERATORS", "LEASEQ_DASHBOARD_VIEWERS",
            "LEASEQ_DASHBOARD_TENANT_VIEWERS", "LEASEQ_DASHBOARD_READER_SECRET_ARN"} <= aliases
