"""template.yaml, infra/ and samconfig.toml, checked offline.

cfn-lint (pinned) and ``sam validate --lint`` catch what CloudFormation's schemas know; the
rest of this file checks what they do not: schedule grammar, retries, reserved concurrency,
one database login per function, what re-runs the migrations, the permissions boundary on
every role, and the deployer's permissions (complete against the permissions the resource
handlers document, which cfn-lint ships, and without a way to escalate). It reads the
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
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from leaseq_lambda.handlers_config import ENVIRONMENT_VARIABLE

from tests.infra.template_support import (
    ROOT,
    load_sam_template,
    parameter_default,
    require_sam,
    resources_of_type,
    sam_environment,
    schedule_expression_problem,
    translate,
)

RUNTIME_FUNCTIONS = ("WorkerFunction", "ReaperFunction", "EnqueueFunction")
ALL_FUNCTIONS = (*RUNTIME_FUNCTIONS, "SlowWorkerFunction", "MigrationsFunction")
#: The workers: they run your handlers, so they get your layer, policies and settings.
WORKERS = ("WorkerFunction", "SlowWorkerFunction")
#: function -> (its login parameter, its secret parameter); the operators' login has no
#: function of this stack.
LOGIN_OF = {
    "WorkerFunction": ("WorkerDbUser", "WorkerDbSecretArn"),
    "ReaperFunction": ("ReaperDbUser", "ReaperDbSecretArn"),
    "EnqueueFunction": ("EnqueueDbUser", "EnqueueDbSecretArn"),
    "DashboardFunction": ("DashboardDbUser", "DashboardDbSecretArn"),
}
LOGIN_PARAMETERS = ("WorkerDbUser", "ReaperDbUser", "EnqueueDbUser", "OperatorDbUser")
SECRET_PARAMETERS = ("WorkerDbSecretArn", "ReaperDbSecretArn", "EnqueueDbSecretArn",
                     "OperatorDbSecretArn")
#: The dashboard's login and secret (DashboardEnabled only).
DASHBOARD_LOGIN = ("DashboardDbUser", "DashboardDbSecretArn")
#: The tenant viewers' reader logins, one per tenant, all under one name prefix.
TENANT_READERS = "leaseq_tenant_reader_*"
DUTY_GROUPS = ("leaseq_producer", "leaseq_tenant_producer", "leaseq_worker", "leaseq_reaper",
               "leaseq_operator")
#: The worker pool's settings the template sets, by the parameter each comes from (the
#: library's pool settings read them; see test_the_pool_parameters_fit_the_librarys_bounds).
POOL_PARAMETERS = {
    "LEASEQ_MAX_WORKERS": "MaxWorkers",
    "LEASEQ_FANOUT_IDLE_SECONDS": "FanOutIdleSeconds",
}
POOL_VARIABLES = (*POOL_PARAMETERS, "LEASEQ_WORKER_FUNCTION")
#: What the template sets for Powertools itself (Globals): no leaseq setting reads these.
POWERTOOLS_VARIABLES = ("POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE",
                        "POWERTOOLS_LOG_LEVEL")
#: The worker's own name, and its ARN as its own role must spell it (a !GetAtt of itself
#: would be circular); the enqueue function may refer to the resource.
WORKER_NAME = {"Fn::Sub": "${AWS::StackName}-worker"}
WORKER_ARN = {"Fn::Sub": "arn:${AWS::Partition}:lambda:${AWS::Region}:${AWS::AccountId}:"
                         "function:${AWS::StackName}-worker"}
#: Who may invoke the worker (fan-out, wake), on exactly which resource.
INVOKE_WORKER = {
    "WorkerFunction": WORKER_ARN,
    "EnqueueFunction": {"Fn::GetAtt": ["WorkerFunction", "Arn"]},
}


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


LINT_RULES = ["--include-checks", "I", "--append-rules", "cfn_lint_serverless.rules"]


def cfn_lint(*arguments: str, cwd: Any = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from cfnlint.runner import main; sys.exit(main())",
         *arguments], cwd=cwd, capture_output=True, text=True, env=sam_environment(), timeout=180)


def test_cfn_lint_at_the_pinned_version_with_informational_and_serverless_rules_finds_nothing(
) -> None:
    version = subprocess.run(
        [sys.executable, "-c", "import cfnlint.version as v; print(v.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert version == "1.58.0", "cfn-lint is pinned in pyproject.toml; its data drifts"

    lint = cfn_lint("template.yaml", "infra/network.yaml", *LINT_RULES)

    assert lint.returncode == 0, lint.stdout + lint.stderr


def ignored_checks(document: dict[str, Any]) -> dict[str, set[str]]:
    """Where each check is switched off: "Metadata" (the template) or a resource's name."""
    found: dict[str, set[str]] = {}
    places = [("Metadata", document.get("Metadata", {}))] + [
        (name, resource.get("Metadata", {})) for name, resource in document["Resources"].items()]
    for place, metadata in places:
        for check in metadata.get("cfn-lint", {}).get("config", {}).get("ignore_checks", []):
            found.setdefault(check, set()).add(place)
    return found


def test_every_lint_exception_has_its_reason_and_still_fires_without_it(
    sam: dict[str, Any], tmp_path: Any,
) -> None:
    reasons = sam["Metadata"]["LintExceptions"]
    ignored = ignored_checks(sam)

    assert set(ignored) == set(reasons), "each switched-off check has a reason, and only those"
    assert all(isinstance(r, str) and len(r) > 40 for r in reasons.values())
    # Without the switches every one of them is reported.
    stripped = json.loads(json.dumps(sam))
    for metadata in [stripped["Metadata"]] + [r.get("Metadata", {})
                                              for r in stripped["Resources"].values()]:
        metadata.pop("cfn-lint", None)
    (tmp_path / "template.json").write_text(json.dumps(stripped), encoding="utf-8")
    lint = cfn_lint(str(tmp_path / "template.json"), *LINT_RULES, "--format", "parseable")
    reported = {fields[5] for fields in (line.split(":") for line in lint.stdout.splitlines())
                if len(fields) >= 7}
    assert set(reasons) <= reported, lint.stdout + lint.stderr


def test_sam_validate_with_lint_accepts_the_template() -> None:
    sam_cli = require_sam()

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
    # leaseq's, one per architecture, and the CA bundles' (tested below)
    assert len(resources_of_type(cfn, "AWS::Lambda::LayerVersion")) == 3


LAYER_OF = {"x86_64": "LeaseqLayerX8664", "arm64": "LeaseqLayerArm64"}


def test_functions_run_python313_on_the_chosen_architecture_with_that_architectures_layer(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    architecture = sam["Parameters"]["Architecture"]
    assert architecture["AllowedValues"] == ["x86_64", "arm64"]
    assert architecture["Default"] in LAYER_OF
    for arch, name in LAYER_OF.items():
        layer = sam["Resources"][name]
        assert layer["Metadata"] == {"BuildMethod": "makefile", "BuildArchitecture": arch}
        assert layer["Properties"]["CompatibleArchitectures"] == [arch]
        assert layer["Properties"]["CompatibleRuntimes"] == ["python3.13"]
        assert layer["Properties"]["ContentUri"] == "layer/"
        # Only the layer of the chosen architecture is created.
        condition = layer["Condition"]
        assert sam["Conditions"][condition] == {
            "Fn::Equals": [{"Ref": "Architecture"}, arch]}
    layers = {name: layer for name, layer in
              resources_of_type(cfn, "AWS::Lambda::LayerVersion").items()
              if not name.startswith("CertificatesLayer")}
    by_condition = {resource["Condition"]: {"Ref": name} for name, resource in layers.items()}
    assert len(layers) == 2
    chosen = {"Fn::If": ["IsArm64", by_condition["IsArm64"], by_condition["IsX8664"]]}
    for name in ALL_FUNCTIONS:
        properties = function_properties(cfn, name)
        assert properties["Runtime"] == "python3.13"
        assert properties["Architectures"] == [{"Ref": "Architecture"}]
        assert properties["Handler"] == "app.lambda_handler"
        assert properties["Layers"][0] == chosen
    assert cfn["Resources"]["Migrations"]["Properties"]["LayerVersionArn"] == chosen


def test_every_function_is_traced_logs_json_and_carries_the_certificates_layer(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    layer = sam["Resources"]["CertificatesLayer"]
    assert "Condition" not in layer, "every function may verify with it, so always there"
    # certificates/Makefile puts the checked RDS CA bundle in it, or fails the build.
    assert layer["Metadata"] == {"BuildMethod": "makefile"}
    assert layer["Properties"]["ContentUri"] == "certificates/"
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.13"]
    assert layer["Properties"]["CompatibleArchitectures"] == ["x86_64", "arm64"]
    (certificates,) = [name for name in resources_of_type(cfn, "AWS::Lambda::LayerVersion")
                       if name.startswith("CertificatesLayer")]
    for name in ALL_FUNCTIONS:
        properties = function_properties(cfn, name)
        assert properties["TracingConfig"] == {"Mode": "Active"}, name
        assert properties["LoggingConfig"]["LogFormat"] == "JSON", name
        assert properties["LoggingConfig"]["LogGroup"], name
        assert properties["Layers"][1] == {"Ref": certificates}, name
    # The bundle is built into the layer, never committed.
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "certificates/rds/*.pem" in ignored
    assert (ROOT / "certificates" / "rds" / ".gitkeep").is_file()
    assert "global-bundle.pem" in (ROOT / "certificates" / "README.md").read_text("utf-8")


def test_the_log_level_parameter_sets_powertools_level_and_never_lambdas_filter(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    parameter = sam["Parameters"]["LogLevel"]
    assert (parameter["Default"], parameter["AllowedValues"]) == (
        "INFO", ["DEBUG", "INFO", "WARNING", "ERROR"])
    for name in ALL_FUNCTIONS:
        properties = function_properties(cfn, name)
        level = properties["Environment"]["Variables"]["POWERTOOLS_LOG_LEVEL"]
        assert level == {"Ref": "LogLevel"}, name
        # Lambda's own filter treats a line without a "level" key as INFO: at WARN it
        # would drop every EMF metric document, and the alarms with them.
        assert "ApplicationLogLevel" not in properties["LoggingConfig"], name


def test_tls_settings_reach_every_function_and_the_rds_bundle_skips_the_proxy(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    parameters = sam["Parameters"]
    assert parameters["DbSslMode"]["Default"] == ""
    # No plain require: connecting unverified is chosen by a name that says so.
    assert parameters["DbSslMode"]["AllowedValues"] == [
        "", "verify-full", "verify-ca", "require-unverified"]
    assert parameters["DbSslRootCert"]["Default"] == "/opt/rds/global-bundle.pem"
    through_proxy = {"Fn::If": ["UsesProxy", {"Ref": "AWS::NoValue"}, {"Ref": "DbSslRootCert"}]}
    for name in ALL_FUNCTIONS:
        variables = function_properties(cfn, name)["Environment"]["Variables"]
        assert variables["LEASEQ_DB_SSLMODE"] == {"Ref": "DbSslMode"}, name
        # The migrations connect directly (never through the proxy), so the bundle applies.
        expected = {"Ref": "DbSslRootCert"} if name == "MigrationsFunction" else through_proxy
        assert variables["LEASEQ_DB_SSLROOTCERT"] == expected, name


def test_the_layer_makefile_targets_the_functions_runtime_and_both_architectures(
    sam: dict[str, Any],
) -> None:
    makefile = (ROOT / "layer" / "Makefile").read_text(encoding="utf-8")
    runtime = sam["Globals"]["Function"]["Runtime"]

    assert re.search(r"^LAMBDA_PYTHON := (\S+)$", makefile, re.M)[1] == runtime[len("python"):]
    for name in LAYER_OF.values():
        assert re.search(rf"^build-{name}: WHEEL_ARCH := \w+$", makefile, re.M), name
    for flag in ("--implementation cp", "--only-binary=:all:", '--target "$(ARTIFACTS_DIR)/python"',
                 "--python-version $(LAMBDA_PYTHON)"):
        assert flag in makefile, flag


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
    assert len(schedules) == 3  # the slow worker's only with SlowKinds
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


def test_async_enqueue_failures_reach_one_queue_in_one_format(cfn: dict[str, Any]) -> None:
    config = cfn["Resources"]["EnqueueFunctionEventInvokeConfig"]["Properties"]
    rule = cfn["Resources"]["EnqueueFunctionEnqueueEvent"]["Properties"]

    queue_arn = {"Fn::GetAtt": ["EnqueueDeadLetterQueue", "Arn"]}
    assert config["DestinationConfig"]["OnFailure"]["Destination"] == queue_arn
    assert "OnSuccess" not in config["DestinationConfig"]
    assert config["MaximumRetryAttempts"] >= 1
    # The rule only hands events to Lambda's asynchronous queue; a DLQ on it would add
    # EventBridge's own message format to the queue. It retries for as long as it may.
    (target,) = rule["Targets"]
    assert "DeadLetterConfig" not in target
    assert target["RetryPolicy"] == {"MaximumRetryAttempts": 185,
                                     "MaximumEventAgeInSeconds": 86400}
    assert rule["EventPattern"] == {"detail-type": ["leaseq.enqueue"]}
    assert rule["EventBusName"] == {"Ref": "EnqueueEventBus"}
    # Nothing else may write to the queue: no queue policy opens it to EventBridge.
    assert not resources_of_type(cfn, "AWS::SQS::QueuePolicy")
    writers = [name for name, role in resources_of_type(cfn, "AWS::IAM::Role").items()
               if "sqs:SendMessage" in json.dumps(role)]
    assert writers == ["EnqueueFunctionRole"]
    # Delivery retries of the rule raise an alarm on the metrics of that very rule.
    alarm = cfn["Resources"]["EnqueueDeliveryRetriesAlarm"]["Properties"]
    names = {m["MetricStat"]["Metric"]["MetricName"] for m in alarm["Metrics"] if "MetricStat" in m}
    assert names == {"RetryInvocationAttempts", "FailedInvocations"}
    for metric in (m["MetricStat"]["Metric"] for m in alarm["Metrics"] if "MetricStat" in m):
        assert metric["Dimensions"] == [
            {"Name": "EventBusName", "Value": {"Ref": "EnqueueEventBus"}},
            {"Name": "RuleName", "Value": rule["Name"]}]


def test_the_dead_letter_queue_and_the_log_groups_outlive_the_stack(cfn: dict[str, Any]) -> None:
    kept = [*resources_of_type(cfn, "AWS::Logs::LogGroup"), "EnqueueDeadLetterQueue"]

    assert len(kept) >= 5
    for name in kept:
        resource = cfn["Resources"][name]
        assert resource.get("DeletionPolicy") == "Retain", name
        assert resource.get("UpdateReplacePolicy") == "Retain", name


def test_the_database_pins_its_major_version_only_and_takes_minor_upgrades(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    database = cfn["Resources"]["Database"]["Properties"]
    parameter = sam["Parameters"]["DbEngineVersion"]
    pattern = re.compile(parameter["AllowedPattern"])

    assert database["EngineVersion"] == {"Ref": "DbEngineVersion"}
    assert database["AutoMinorVersionUpgrade"] is True
    assert pattern.fullmatch(parameter["Default"])
    for refused in ("17.6", "16.4", "14", "17.", "latest"):
        assert not pattern.fullmatch(refused), refused
    for environment, overrides in samconfig_overrides().items():
        if "DbEngineVersion" in overrides:
            assert pattern.fullmatch(overrides["DbEngineVersion"]), environment


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


# ---- the worker pool: fan-out and wake -------------------------------------------------------


def environment_of(cfn: dict[str, Any], name: str) -> dict[str, Any]:
    variables: dict[str, Any] = function_properties(cfn, name)["Environment"]["Variables"]
    return variables


def test_max_workers_reaches_the_worker_and_the_enqueue_function_and_only_them(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    parameter = sam["Parameters"]["MaxWorkers"]
    worker, enqueue = environment_of(cfn, "WorkerFunction"), environment_of(cfn, "EnqueueFunction")

    assert (parameter["Default"], parameter["MinValue"], parameter["MaxValue"]) == (4, 0, 1000)
    assert worker["LEASEQ_MAX_WORKERS"] == enqueue["LEASEQ_MAX_WORKERS"] == {"Ref": "MaxWorkers"}
    # The worker stops a started invocation when idle. The wake's debounce and the start
    # hold are the schema owner's (test_the_pool_limits_reach_the_owners_settings_...):
    # no function's environment names them.
    assert worker["LEASEQ_FANOUT_IDLE_SECONDS"] == {"Ref": "FanOutIdleSeconds"}
    for environment in (worker, enqueue):
        assert not {"LEASEQ_WAKE_DEBOUNCE_SECONDS", "LEASEQ_START_HOLD_SECONDS"} & set(
            environment)
    assert "LEASEQ_FANOUT_IDLE_SECONDS" not in enqueue
    for name in ("ReaperFunction", "MigrationsFunction", "DashboardFunction"):
        assert not set(POOL_VARIABLES) & set(environment_of(cfn, name)), name
    # The slow worker drains a named queue of its own, with that queue's own pool
    # (SlowWorkerMaxWorkers, off by default as before named queues).
    slow = environment_of(cfn, "SlowWorkerFunction")
    assert slow["LEASEQ_MAX_WORKERS"] == {"Ref": "SlowWorkerMaxWorkers"}
    assert sam["Parameters"]["SlowWorkerMaxWorkers"]["Default"] == 0
    assert (slow["LEASEQ_QUEUE"], worker["LEASEQ_QUEUE"]) == ({"Ref": "SlowQueueName"},
                                                              "default")
    assert sam["Conditions"]["HasWorkerPool"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "MaxWorkers"}, 0]}]}


def test_the_worker_has_a_name_of_its_own_that_fan_out_and_wake_invoke_it_by(
    cfn: dict[str, Any],
) -> None:
    worker = function_properties(cfn, "WorkerFunction")

    assert worker["FunctionName"] == WORKER_NAME
    assert environment_of(cfn, "WorkerFunction")["LEASEQ_WORKER_FUNCTION"] == WORKER_NAME
    # !Ref of a function is its name; it also orders the enqueue function after the worker.
    assert environment_of(cfn, "EnqueueFunction")["LEASEQ_WORKER_FUNCTION"] == {
        "Ref": "WorkerFunction"}
    assert WORKER_ARN["Fn::Sub"].endswith(":function:" + WORKER_NAME["Fn::Sub"])
    # The log group it writes to is the one named after it.
    group = cfn["Resources"][worker["LoggingConfig"]["LogGroup"]["Ref"]]["Properties"]
    assert group["LogGroupName"] == {"Fn::Sub": "/aws/lambda/${AWS::StackName}-worker"}
    # Outputs name it for producers that wake it themselves (leaseq_lambda.wake_worker).
    assert cfn["Outputs"]["WorkerFunctionName"]["Value"] == {"Ref": "WorkerFunction"}
    assert cfn["Outputs"]["WorkerFunctionArn"]["Value"] == {
        "Fn::GetAtt": ["WorkerFunction", "Arn"]}


def invoke_statements(cfn: dict[str, Any]) -> dict[str, list[tuple[str | None, Any]]]:
    """role -> (the condition of its policy, the statement) for every lambda:InvokeFunction."""
    found: dict[str, list[tuple[str | None, Any]]] = {}
    for name, role in resources_of_type(cfn, "AWS::IAM::Role").items():
        for policy in role["Properties"].get("Policies", []):
            condition, branches = (policy["Fn::If"][0], policy["Fn::If"][1:]) \
                if "Fn::If" in policy else (None, [policy])
            for branch in branches:
                if not isinstance(branch, dict) or "PolicyDocument" not in branch:
                    continue
                for statement in branch["PolicyDocument"]["Statement"]:
                    if "lambda:InvokeFunction" in json.dumps(statement):
                        found.setdefault(name, []).append((condition, statement))
    return found


def test_only_the_worker_and_the_enqueue_function_may_invoke_the_worker_on_its_arn_alone(
    cfn: dict[str, Any],
) -> None:
    found = invoke_statements(cfn)

    # (the schedules' roles, which SAM makes, invoke their own targets)
    # (the schedules' roles, and the slow queue's worker, which starts only itself: see
    # test_a_slow_worker_drains_a_named_queue_...)
    runtime = {role: statements for role, statements in found.items()
               if not role.endswith("ScheduleRole") and role != "SlowWorkerFunctionRole"}
    assert set(runtime) == {f"{name}Role" for name in INVOKE_WORKER}
    for function, resource in INVOKE_WORKER.items():
        statements = runtime[f"{function}Role"]
        if function == "EnqueueFunction":
            # Wake on enqueue of the slow queue too: its worker, only with a slow worker.
            slow = ("HasSlowWorker", {"Effect": "Allow", "Action": "lambda:InvokeFunction",
                                      "Resource": {"Fn::GetAtt": ["SlowWorkerFunction", "Arn"]}})
            assert slow in statements
            statements = [s for s in statements if s != slow]
        ((condition, statement),) = statements
        assert condition == "HasWorkerPool", function  # no pool, no permission
        assert statement == {"Effect": "Allow", "Action": "lambda:InvokeFunction",
                             "Resource": resource}, function
        # Unqualified: no version, alias or wildcard (the functions invoke it by name).
        assert "*" not in json.dumps(resource), function
    # The permissions boundary allows invoking it for every stack the deployer may create.
    boundary = policy_document("permissions-boundary.json")
    (invoke,) = [s for s in boundary["Statement"] if s["Action"] == "lambda:InvokeFunction"]
    arn = "arn:aws:lambda:eu-west-1:123456789012:function:leaseq-prod-worker"
    assert any(fnmatch.fnmatchcase(arn, pattern) for pattern in invoke["Resource"])


def test_the_network_gives_the_functions_a_path_to_s3_secrets_manager_and_lambda() -> None:
    """The custom-resource answer (S3), the owner's secret, and the Invoke API that fan-out
    and wake use: the private subnets have no NAT, so each needs an endpoint."""
    network = load_sam_template(ROOT / "infra" / "network.yaml")["Resources"]
    endpoints = {resource["Properties"]["ServiceName"]["Fn::Sub"].rsplit(".", 1)[1]:
                 resource["Properties"] for resource in network.values()
                 if resource["Type"] == "AWS::EC2::VPCEndpoint"}

    assert set(endpoints) == {"s3", "secretsmanager", "lambda"}
    lambda_endpoint = endpoints["lambda"]
    assert lambda_endpoint["VpcEndpointType"] == "Interface"
    assert lambda_endpoint["PrivateDnsEnabled"] is True  # boto3's default endpoint resolves to it
    assert lambda_endpoint["SubnetIds"] == [{"Ref": "PrivateSubnetA"}, {"Ref": "PrivateSubnetB"}]
    assert not [r for r in network.values() if r["Type"] == "AWS::EC2::NatGateway"]


def test_the_worker_never_retries_an_asynchronous_start_and_drops_it_after_a_minute(
    cfn: dict[str, Any],
) -> None:
    config = cfn["Resources"]["WorkerFunctionEventInvokeConfig"]["Properties"]

    assert config["FunctionName"] == {"Ref": "WorkerFunction"}
    # A lost or late start only leaves its reserved place to expire; a retry or a start
    # older than the place's hold would be a second invocation for one place.
    assert (config["MaximumRetryAttempts"], config["MaximumEventAgeInSeconds"]) == (0, 60)
    assert not config.get("DestinationConfig")  # SAM writes an empty one


def test_the_pool_parameters_fit_the_librarys_bounds(sam: dict[str, Any]) -> None:
    """A parameter the template accepts must be one the pool's settings accept, or every
    invocation would fail its configuration at cold start."""
    from leaseq import settings

    pool = getattr(settings, "PoolSettings", None)
    if pool is None:
        pytest.skip("the library's pool settings (leaseq.settings.PoolSettings) are not here")
    fields = {field.alias: field for field in pool.model_fields.values()}
    for variable, parameter in POOL_PARAMETERS.items():
        definition = sam["Parameters"][parameter]
        field = fields[variable]
        # The library's pool is off unless asked for; the template asks for one.
        if parameter != "MaxWorkers":
            assert field.default == definition["Default"], parameter
        for constraint in field.metadata:
            if getattr(constraint, "ge", None) is not None:
                assert definition["MinValue"] >= constraint.ge, parameter
            if getattr(constraint, "gt", None) is not None:
                assert definition["MinValue"] > constraint.gt, parameter
            if getattr(constraint, "le", None) is not None:
                assert definition["MaxValue"] <= constraint.le, parameter
    # A reservation outlives the oldest start Lambda may still deliver.
    hold = fields["LEASEQ_START_HOLD_SECONDS"].default
    assert hold > 60, "LEASEQ_START_HOLD_SECONDS must exceed MaximumEventAgeInSeconds"


def test_the_pool_limits_reach_the_owners_settings_through_the_migrations_and_fit_them(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    """The maximum, the start hold and the debounce are written by the migrations custom
    resource as the schema owner (app.settings), from the same parameters the functions
    get, and every value the template accepts is one the database accepts."""
    from leaseq.drain.config import OWNER_POOL_BOUNDS

    limits = cfn["Resources"]["Migrations"]["Properties"]["WorkerPool"]
    assert limits == {"MaxWorkers": {"Ref": "MaxWorkers"}, "StartHoldSeconds": "90",
                      "WakeDebounceSeconds": {"Ref": "WakeDebounceSeconds"}}
    for parameter, key in (("MaxWorkers", "max_workers"),
                           ("WakeDebounceSeconds", "wake_debounce")):
        definition, bounds = sam["Parameters"][parameter], OWNER_POOL_BOUNDS[key]
        assert bounds.allows(definition["MinValue"]), parameter
        assert bounds.allows(definition["MaxValue"]), parameter
        assert bounds.allows(definition["Default"]), parameter
    # A start event Lambda still delivers finds its place (or its ticket) waiting.
    age = cfn["Resources"]["WorkerFunctionEventInvokeConfig"]["Properties"][
        "MaximumEventAgeInSeconds"]
    hold = float(limits["StartHoldSeconds"])
    assert OWNER_POOL_BOUNDS["start_hold"].allows(hold)
    assert hold > age, "StartHoldSeconds must exceed the worker's MaximumEventAgeInSeconds"


def test_the_default_reservation_holds_the_default_pool_and_the_tick_everywhere(
    sam: dict[str, Any], migrations_app: Any,
) -> None:
    from leaseq_deploy import connection_budget

    parameters = sam["Parameters"]
    environments = {"defaults": {}, **samconfig_overrides()}
    for environment, overrides in environments.items():
        def value(name: str, given: dict[str, str] = overrides) -> str:
            return given.get(name, str(parameters[name]["Default"]))

        properties = {connection_budget.PROPERTY: {
            key: value(key) if key in parameters else "" for key in connection_budget.KEYS}}
        properties[connection_budget.PROPERTY][connection_budget.PROXY_PERCENT] = value(
            "ProxyMaxConnectionsPercent")
        stack = connection_budget.stack_connections(properties)
        assert stack is not None
        assert connection_budget.reservation_problem(stack) is None, environment
        assert stack.worker.reserved >= stack.max_workers + 1, environment


def test_a_rule_refuses_the_default_pool_with_a_smaller_worker_reservation(
    sam: dict[str, Any],
) -> None:
    rule = sam["Rules"]["WorkerReservationHoldsTheDefaultPool"]
    default = str(sam["Parameters"]["MaxWorkers"]["Default"])

    assert rule["RuleCondition"] == {"Fn::Equals": [{"Ref": "MaxWorkers"}, default]}
    ((assertion),) = rule["Assertions"]
    refused, parameter = assertion["Assert"]["Fn::Not"][0]["Fn::Contains"]
    assert parameter == {"Ref": "WorkerReservedConcurrency"}
    # Every reservation from 1 to MaxWorkers; 0 (unreserved) and MaxWorkers + 1 pass.
    assert refused == [str(n) for n in range(1, int(default) + 1)]
    assert "WorkerReservedConcurrency" in assertion["AssertDescription"]


def test_the_migrations_get_every_parameter_of_the_connection_budget(
    sam: dict[str, Any], cfn: dict[str, Any], migrations_app: Any,
) -> None:
    from leaseq_deploy import connection_budget

    budget = cfn["Resources"]["Migrations"]["Properties"][connection_budget.PROPERTY]

    assert tuple(budget) == connection_budget.KEYS
    for key, value in budget.items():
        assert key in sam["Parameters"], key
        if key == connection_budget.SLOW_WORKER:
            assert value == {"Fn::If": ["HasSlowWorker", {"Ref": key}, ""]}
        elif key == connection_budget.PROXY_PERCENT:
            assert value == {"Fn::If": ["UsesProxy", {"Ref": key}, ""]}
        elif key == connection_budget.DASHBOARD:
            assert value == {"Fn::If": ["DashboardOn", {"Ref": key}, ""]}
        elif key == connection_budget.DASHBOARD_READERS:
            assert value == {"Fn::If": ["DashboardHasTenantViewers", {"Ref": key}, "0"]}
        else:
            assert value == {"Ref": key}, key
    assert cfn["Outputs"]["ConnectionBudget"]["Value"] == {
        "Fn::GetAtt": ["Migrations", "ConnectionBudget"]}


def test_stack_names_leave_room_for_every_name_made_from_them(
    cfn: dict[str, Any], migrations_app: Any,
) -> None:
    from leaseq_deploy import stack_name

    limited = {"FunctionName", "Name", "RuleName", "DBProxyName"}
    made = set()
    for resource in cfn["Resources"].values():
        if resource["Type"] == "AWS::Events::EventBus":
            continue  # 256 characters
        for key, value in resource.get("Properties", {}).items():
            if key in limited and isinstance(value, dict) and "Fn::Sub" in value:
                text = value["Fn::Sub"]
                if isinstance(text, str) and text.startswith("${AWS::StackName}-"):
                    made.add(text[len("${AWS::StackName}"):])
    assert made == {suffix for suffix, _, _ in stack_name.DERIVED_NAMES}
    assert stack_name.MAX_STACK_NAME == 56
    config = tomllib.loads((ROOT / "samconfig.toml").read_text(encoding="utf-8"))
    names = {section["global"]["parameters"]["stack_name"] for section in config.values()
             if isinstance(section, dict) and "global" in section}
    assert names
    assert [n for n in names if len(n) > stack_name.MAX_STACK_NAME] == []


def test_alarms_watch_worker_throttles_and_a_pool_at_its_maximum(
    cfn: dict[str, Any],
) -> None:
    from leaseq_lambda import telemetry

    throttles = cfn["Resources"]["WorkerThrottlesAlarm"]["Properties"]
    pool = cfn["Resources"]["WorkerPoolAtMaximumAlarm"]

    assert alarm_metrics({"Properties": throttles}) == {
        ("AWS/Lambda", "Throttles", "WorkerFunction")}
    assert (throttles["Statistic"], throttles["Threshold"], throttles["ComparisonOperator"]) == (
        "Sum", 1, "GreaterThanOrEqualToThreshold")
    # Only with a pool; at MaxWorkers for most of ten minutes, not a single peak.
    assert pool["Condition"] == "HasWorkerPool"
    properties = pool["Properties"]
    assert alarm_metrics(pool) == {(telemetry.NAMESPACE, "WorkerPoolSize", telemetry.SERVICE)}
    assert properties["Dimensions"] == [{"Name": "service", "Value": telemetry.SERVICE}]
    assert properties["Statistic"] == "Maximum"
    assert properties["Threshold"] == {"Ref": "MaxWorkers"}
    assert properties["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert properties["EvaluationPeriods"] > properties["DatapointsToAlarm"] > 1
    assert properties["TreatMissingData"] == "notBreaching"
    # A worker throttle raises one alarm, not two.
    general = alarm_metrics(cfn["Resources"]["FunctionThrottlesAlarm"])
    assert ("AWS/Lambda", "Throttles", "WorkerFunction") not in general


def test_every_alarm_notifies_the_alarm_topic(cfn: dict[str, Any]) -> None:
    alarms = resources_of_type(cfn, "AWS::CloudWatch::Alarm")

    assert {"WorkerThrottlesAlarm", "WorkerPoolAtMaximumAlarm"} <= set(alarms)
    for name, alarm in alarms.items():
        assert alarm["Properties"]["AlarmActions"] == {
            "Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}, name


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


def test_runtime_functions_share_the_database_and_each_logs_in_as_its_own_user(
    cfn: dict[str, Any],
) -> None:
    declared = settings_variables() | {*POWERTOOLS_VARIABLES, ENVIRONMENT_VARIABLE,
                                       *KIND_FILTER_VARIABLES, *POOL_VARIABLES}
    from leaseq_dashboard.settings import DashboardSettings

    dashboard = {f.alias for f in DashboardSettings.model_fields.values() if f.alias}
    databases = []
    for name, (user, secret) in LOGIN_OF.items():
        variables = function_properties(cfn, name)["Environment"]["Variables"]
        own = dashboard if name == "DashboardFunction" else set()
        assert set(variables) <= declared | own, set(variables) - declared - own
        assert variables["POWERTOOLS_SERVICE_NAME"] == "leaseq"
        assert variables["POWERTOOLS_METRICS_NAMESPACE"] == "Leaseq"
        assert variables["LEASEQ_DB_USER"] == {"Ref": user}
        assert variables["LEASEQ_DATABASE_SECRET_ARN"] == {
            "Fn::If": ["UsePasswordAuth", {"Ref": secret}, {"Ref": "AWS::NoValue"}]}
        databases.append({key: variables[key] for key in (
            "LEASEQ_DB_HOST", "LEASEQ_DB_PORT", "LEASEQ_DB_NAME", "LEASEQ_DB_IAM_AUTH",
            "LEASEQ_DB_SSLMODE")})
    assert all(database == databases[0] for database in databases)
    assert databases[0]["LEASEQ_DB_HOST"]["Fn::If"][1] == {
        "Fn::GetAtt": ["DatabaseProxy", "Endpoint"]}
    # The proxy listens on 5432 even when the database itself uses another port.
    assert databases[0]["LEASEQ_DB_PORT"] == {"Fn::If": ["UsesProxy", "5432", {"Ref": "DbPort"}]}


def statements_of(role: dict[str, Any]) -> list[dict[str, Any]]:
    """The role's inline statements; a policy behind a condition counts with its branch."""
    policies = []
    for policy in role["Properties"].get("Policies", []):
        branches = policy["Fn::If"][1:] if "Fn::If" in policy else [policy]
        policies += [b for b in branches if isinstance(b, dict) and "PolicyDocument" in b]
    return [statement for policy in policies for statement in policy["PolicyDocument"]["Statement"]]


@pytest.mark.parametrize("function", list(LOGIN_OF))
def test_each_function_may_connect_only_as_its_own_login(
    cfn: dict[str, Any], function: str,
) -> None:
    user, secret = LOGIN_OF[function]
    role = cfn["Resources"][f"{function}Role"]
    statements = statements_of(role)

    (statement,) = [s for s in statements if "Fn::If" in s]
    condition, iam_statement, secret_statement = statement["Fn::If"]
    assert condition == "UseIamAuth"
    assert iam_statement["Action"] == "rds-db:connect"
    created, existing = iam_statement["Resource"]["Fn::If"][1:]
    template, variables = created["Fn::Sub"]
    assert template.endswith(f":dbuser:${{ProxyId}}/${{{user}}}")
    assert variables["ProxyId"] == {
        "Fn::Select": [6, {"Fn::Split": [":", {"Fn::GetAtt": ["DatabaseProxy", "DBProxyArn"]}]}]}
    assert existing["Fn::Sub"].endswith(f":dbuser:${{ExistingDbResourceId}}/${{{user}}}")
    assert secret_statement == {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
                                "Resource": {"Ref": secret}}
    # No other login and no other secret: nothing in the role names another function's.
    others = [p for p in (*LOGIN_PARAMETERS, *SECRET_PARAMETERS, *DASHBOARD_LOGIN)
              if p not in (user, secret)]
    text = json.dumps(role)
    assert [p for p in others if p in text] == []
    # Besides: only what SAM adds for the enqueue failure destination, the dashboard's
    # tenant reader logins (one prefix, tested below), the handlers' own secrets on the
    # workers (HandlersSecretArns), invoking the worker (the pool: tested below), and the
    # two AWS managed policies SAM attaches to a function in a VPC.
    extra = [s for s in statements if "Fn::If" not in s]
    assert {s["Action"] for s in extra} <= {"sqs:SendMessage", "rds-db:connect",
                                            "secretsmanager:GetSecretValue",
                                            "lambda:InvokeFunction"}
    # (and the enqueue function's wake of the slow queue's worker, registered for its queue)
    wakes_slow = [{"Fn::GetAtt": ["SlowWorkerFunction", "Arn"]}] \
        if function == "EnqueueFunction" else []
    assert [s["Resource"] for s in extra if s["Action"] == "lambda:InvokeFunction"] == (
        [INVOKE_WORKER[function]] if function in INVOKE_WORKER else []) + wakes_slow
    readers = [s for s in extra if s["Action"] == "rds-db:connect"]
    assert len(readers) == (1 if function == "DashboardFunction" else 0)
    if readers:
        created, existing = readers[0]["Resource"]["Fn::If"][1:]
        assert created["Fn::Sub"][0].endswith(f":dbuser:${{ProxyId}}/{TENANT_READERS}")
        assert existing["Fn::Sub"].endswith(f":dbuser:${{ExistingDbResourceId}}/{TENANT_READERS}")
        (policy,) = [p for p in role["Properties"]["Policies"] if "Fn::If" in p]
        assert policy["Fn::If"][0] == "DashboardHasTenantViewers"
    own_secrets = {"WorkerFunction": [HANDLERS_SECRETS]}
    assert [s["Resource"] for s in extra if s["Action"] == "secretsmanager:GetSecretValue"] == (
        own_secrets.get(function, []))
    assert role["Properties"]["ManagedPolicyArns"] == [
        "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
        XRAY_WRITE_POLICY,
        "arn:aws:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole",
        *(handler_policies() if function in WORKERS else []),
    ]


# ---- your handlers, and a worker for slow kinds --------------------------------------------

#: The workers' kind filter (leaseq.settings.WorkerSettings): the slow worker's kinds, and
#: the kinds the main worker leaves to it.
KIND_FILTER_VARIABLES = ("LEASEQ_KINDS", "LEASEQ_EXCLUDE_KINDS")


#: The handlers' secrets (HandlersSecretArns) as the workers' roles name them.
HANDLERS_SECRETS = {"Fn::Split": [",", {"Ref": "HandlersSecretArns"}]}


def handler_policies() -> list[dict[str, Any]]:
    """The three optional managed policies of WorkerManagedPolicyArns, as SAM expands them."""
    padded = {"Fn::Split": [",", {"Fn::Sub": "${WorkerManagedPolicyArns},,,"}]}
    return [{"Fn::If": [f"HasWorkerPolicy{n + 1}", {"Fn::Select": [n, padded]},
                        {"Ref": "AWS::NoValue"}]} for n in range(3)]


def chosen_policies(value: str) -> list[str]:
    """What CloudFormation makes of those conditions and selects for a parameter value."""
    fields = f"{value},,,".split(",")
    return [fields[n] for n in range(3) if fields[n] != ""]


def test_your_handlers_layer_policies_and_settings_reach_the_workers_and_only_them(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    for name in WORKERS:
        properties = function_properties(cfn, name)
        # After leaseq's layer and the CA bundles' (Globals): your handlers'.
        assert properties["Layers"][2:] == [
            {"Fn::If": ["HasHandlersLayer", {"Ref": "HandlersLayerArn"}, {"Ref": "AWS::NoValue"}]}]
        variables = properties["Environment"]["Variables"]
        assert variables["LEASEQ_HANDLERS"] == {
            "Fn::If": ["HasHandlersModule", {"Ref": "HandlersModule"}, {"Ref": "AWS::NoValue"}]}
        assert variables[ENVIRONMENT_VARIABLE] == {"Ref": "HandlersEnvironment"}
    for name in ("ReaperFunction", "EnqueueFunction", "MigrationsFunction"):
        properties = function_properties(cfn, name)
        assert "WorkerManagedPolicyArns" not in json.dumps(cfn["Resources"][f"{name}Role"])
        if name == "EnqueueFunction":
            continue  # only with EnqueueChecksJobs (the next test)
        assert len(properties["Layers"]) == 2, name  # leaseq's and the CA bundles'
        assert ENVIRONMENT_VARIABLE not in properties["Environment"]["Variables"], name
    for n in range(3):
        condition = sam["Conditions"][f"HasWorkerPolicy{n + 1}"]
        assert condition == {"Fn::Not": [{"Fn::Equals": [handler_policies()[n]["Fn::If"][1], ""]}]}
    one = "arn:aws:iam::123456789012:policy/leaseq-invoices"
    two = "arn:aws:iam::123456789012:policy/leaseq-mail"
    assert chosen_policies("") == []
    assert chosen_policies(one) == [one]
    assert chosen_policies(f"{one},{two},{one}") == [one, two, one]
    parameters = sam["Parameters"]
    policies = re.compile(parameters["WorkerManagedPolicyArns"]["AllowedPattern"])
    layer = re.compile(parameters["HandlersLayerArn"]["AllowedPattern"])
    for accepted in ("", one, f"{one},{two}", f"{one},{two},{one}"):
        assert policies.fullmatch(accepted), accepted
    # The deployer may attach leaseq-* policies and use leaseq-* layers only.
    for refused in (f"{one},{two},{one},{two}", "arn:aws:iam::aws:policy/AdministratorAccess",
                    "arn:aws:iam::123456789012:policy/other", f"{one},"):
        assert not policies.fullmatch(refused), refused
    assert layer.fullmatch("arn:aws:lambda:eu-west-1:123456789012:layer:leaseq-dev-handlers:7")
    assert not layer.fullmatch("arn:aws:lambda:eu-west-1:123456789012:layer:handlers:7")
    assert not layer.fullmatch("arn:aws:lambda:eu-west-1:123456789012:layer:leaseq-dev-handlers")
    assert parameters["HandlersEnvironment"]["Default"] == "{}"


def test_the_handlers_secrets_and_boundary_reach_the_workers_roles_and_only_them(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    parameters = sam["Parameters"]
    secrets = re.compile(parameters["HandlersSecretArns"]["AllowedPattern"])
    boundary = re.compile(parameters["WorkerPermissionsBoundaryArn"]["AllowedPattern"])
    api_key = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:invoices/api-key-AbCdEf"
    any_name = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:billing/*"

    for name in WORKERS:
        role = cfn["Resources"][f"{name}Role"]
        granted = [s for s in statements_of(role)
                   if s.get("Action") == "secretsmanager:GetSecretValue"]
        assert granted == [{"Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
                            "Resource": HANDLERS_SECRETS}], name
        (policy,) = [p for p in role["Properties"]["Policies"]
                     if "HandlersSecretArns" in json.dumps(p)]
        assert policy["Fn::If"][0] == "HasHandlersSecrets"
    for name in ("ReaperFunction", "EnqueueFunction", "MigrationsFunction"):
        role = json.dumps(cfn["Resources"][f"{name}Role"])
        assert "HandlersSecretArns" not in role, name
        assert "WorkerPermissionsBoundaryArn" not in role, name
    # Any name, not only leaseq/...: the workers' boundary is what caps them.
    for accepted in ("", api_key, any_name, f"{api_key},{any_name}"):
        assert secrets.fullmatch(accepted), accepted
    for refused in (f"{api_key},", "arn:aws:s3:::bucket", "leaseq/owner",
                    ",".join([api_key] * 21)):
        assert not secrets.fullmatch(refused), refused
    assert boundary.fullmatch(
        "arn:aws:iam::123456789012:policy/boundaries/leaseq-handlers-boundary")
    # The deployer may create roles with admin-made boundaries only (policy/boundaries/...).
    for refused in ("arn:aws:iam::123456789012:policy/leaseq-handlers-boundary",
                    "arn:aws:iam::123456789012:policy/boundaries/other",
                    "arn:aws:iam::aws:policy/AdministratorAccess"):
        assert not boundary.fullmatch(refused), refused
    assert conditions_for(sam, HandlersSecretArns=api_key)["HasHandlersSecrets"] is True
    assert conditions_for(sam)["HasHandlersSecrets"] is False


def test_the_operators_security_group_is_let_into_the_proxy_and_on_request_the_database(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    proxy = cfn["Resources"]["ProxyFromOperatorsIngress"]
    database = cfn["Resources"]["DatabaseFromOperatorsIngress"]
    group = "sg-0123456789abcdef0"

    assert proxy["Condition"] == "OperatorsReachTheProxy"
    assert proxy["Properties"]["GroupId"] == {"Ref": "ProxySecurityGroup"}
    assert proxy["Properties"]["SourceSecurityGroupId"] == {"Ref": "OperatorSecurityGroupId"}
    assert (proxy["Properties"]["FromPort"], proxy["Properties"]["ToPort"]) == (5432, 5432)
    assert database["Condition"] == "OperatorsReachTheDatabase"
    assert database["Properties"]["GroupId"] == {"Ref": "DatabaseSecurityGroup"}
    assert database["Properties"]["FromPort"] == {"Ref": "DbPort"}
    assert database["Properties"]["SourceSecurityGroupId"] == {"Ref": "OperatorSecurityGroupId"}
    # No group, no rule; a group: the proxy; the database only when asked for.
    assert not conditions_for(sam)["OperatorsReachTheProxy"]
    with_group = conditions_for(sam, OperatorSecurityGroupId=group)
    assert (with_group["OperatorsReachTheProxy"], with_group["OperatorsReachTheDatabase"]) == (
        True, False)
    assert conditions_for(sam, OperatorSecurityGroupId=group,
                          OperatorDatabaseAccess="true")["OperatorsReachTheDatabase"] is True
    pattern = re.compile(sam["Parameters"]["OperatorSecurityGroupId"]["AllowedPattern"])
    for accepted in ("", group, "sg-0123abcd"):
        assert pattern.fullmatch(accepted), accepted
    for refused in ("sg-", "0123456789abcdef0", "sg-0123456789ABCDEF0", f"{group},{group}"):
        assert not pattern.fullmatch(refused), refused


def test_the_worker_runs_async_handlers_ten_at_a_time_and_sync_ones_in_turn_by_default(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    """The defaults as the worker reads them: async handlers get the concurrency, a
    registry of def handlers only keeps the one-at-a-time drain (SIGALRM at the budget),
    and a mixed one runs its def handlers one at a time among the async ones."""
    from leaseq import Registry, Worker, WorkerConfig
    from leaseq.settings import WorkerSettings

    variables = function_properties(cfn, "WorkerFunction")["Environment"]["Variables"]
    assert variables["LEASEQ_WORKER_CONCURRENCY"] == {"Ref": "WorkerConcurrency"}
    assert variables["LEASEQ_SYNC_CONCURRENCY"] == {"Ref": "SyncHandlerConcurrency"}
    parameters = sam["Parameters"]
    assert (parameters["WorkerConcurrency"]["Default"],
            parameters["SyncHandlerConcurrency"]["Default"]) == (10, 1)
    settings = WorkerSettings.model_validate({
        "LEASEQ_WORKER_CONCURRENCY": str(parameters["WorkerConcurrency"]["Default"]),
        "LEASEQ_SYNC_CONCURRENCY": str(parameters["SyncHandlerConcurrency"]["Default"])})
    values = settings.config_values()
    values.pop("retry_base")
    values.pop("retry_max")
    config = WorkerConfig(owner="w", **values)

    sync_only, async_only, mixed = Registry(), Registry(), Registry()
    sync_only.register("a", lambda payload, ctx: None)
    mixed.register("a", lambda payload, ctx: None)

    async def waits(payload: Any, ctx: Any) -> None:
        return None

    async_only.register("b", waits)
    mixed.register("b", waits)
    assert (config.concurrency, config.sync_limit) == (10, 1)
    assert not Worker(None, sync_only, config).uses_event_loop  # type: ignore[arg-type]
    assert Worker(None, async_only, config).uses_event_loop  # type: ignore[arg-type]
    assert Worker(None, mixed, config).uses_event_loop  # type: ignore[arg-type]
    # The slow worker keeps the library's one job at a time.
    slow = function_properties(cfn, "SlowWorkerFunction")["Environment"]["Variables"]
    assert "LEASEQ_WORKER_CONCURRENCY" not in slow


def test_a_slow_worker_drains_a_named_queue_with_its_own_limits_schedule_pool_and_kinds(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    slow = function_properties(cfn, "SlowWorkerFunction")
    worker = function_properties(cfn, "WorkerFunction")

    assert sam["Conditions"]["HasSlowWorker"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "SlowKinds"}, ""]}]}
    assert sam["Parameters"]["SlowKinds"]["Default"] == ""
    for name in ("SlowWorkerFunction", "SlowWorkerFunctionRole", "SlowWorkerFunctionSchedule",
                 "SlowWorkerFunctionScheduleRole", "SlowWorkerFunctionEventInvokeConfig",
                 "SlowWorkerLogGroup", "SlowWorkerErrorsAlarm"):
        assert cfn["Resources"][name]["Condition"] == "HasSlowWorker", name
    assert slow["Timeout"] == {"Ref": "SlowWorkerTimeoutSeconds"}
    assert slow["MemorySize"] == {"Ref": "SlowWorkerMemorySize"}
    reserved = slow["ReservedConcurrentExecutions"]["Fn::If"]
    assert reserved[1] == {"Ref": "SlowWorkerReservedConcurrency"}
    schedule = cfn["Resources"]["SlowWorkerFunctionSchedule"]["Properties"]
    assert schedule["ScheduleExpression"] == {"Ref": "SlowWorkerScheduleExpression"}
    assert schedule_expression_problem(sam["Parameters"]["SlowWorkerScheduleExpression"][
        "Default"]) is None
    assert cfn["Resources"]["SlowWorkerFunctionEventInvokeConfig"]["Properties"][
        "MaximumRetryAttempts"] == 0
    variables, worker_variables = slow["Environment"]["Variables"], worker["Environment"][
        "Variables"]
    # An ordinary named queue: its kinds are routed there at deploy (the migrations'
    # Queues property), so neither worker filters kinds.
    assert variables["LEASEQ_QUEUE"] == {"Ref": "SlowQueueName"}
    assert worker_variables["LEASEQ_QUEUE"] == "default"
    assert variables["LEASEQ_JOB_TIMEOUT_SECONDS"] == {"Ref": "SlowJobTimeoutSeconds"}
    assert not {"LEASEQ_KINDS", "LEASEQ_EXCLUDE_KINDS"} & (set(variables) | set(worker_variables))
    queues = cfn["Resources"]["Migrations"]["Properties"]["Queues"]["Fn::If"]
    assert queues == ["HasSlowWorker", [{"Name": {"Ref": "SlowQueueName"},
                                         "Kinds": {"Ref": "SlowKinds"}, "MaxWorkers": "",
                                         "WorkerFunction": {"Fn::Sub": "${AWS::StackName}-slow"}}],
                      []]
    # The same duty, so the same login; the rest of the database settings as the worker's.
    for key in ("LEASEQ_DB_USER", "LEASEQ_DB_HOST", "LEASEQ_DB_PORT", "LEASEQ_DB_IAM_AUTH",
                "LEASEQ_DATABASE_SECRET_ARN", "LEASEQ_HANDLERS", "LEASEQ_BATCH_SIZE"):
        assert variables[key] == worker_variables[key], key
    # Its own pool (off by default): it starts only itself, by its own name.
    assert variables["LEASEQ_MAX_WORKERS"] == {"Ref": "SlowWorkerMaxWorkers"}
    assert variables["LEASEQ_WORKER_FUNCTION"] == {"Fn::Sub": "${AWS::StackName}-slow"}
    assert slow["FunctionName"] == {"Fn::Sub": "${AWS::StackName}-slow"}
    ((condition, statement),) = invoke_statements(cfn)["SlowWorkerFunctionRole"]
    assert condition == "HasSlowWorkerPool"
    assert statement["Resource"] == {"Fn::Sub": "arn:${AWS::Partition}:lambda:${AWS::Region}:"
                                     "${AWS::AccountId}:function:${AWS::StackName}-slow"}
    # A slow job's budget fits the slowest the function may be given.
    assert sam["Parameters"]["SlowJobTimeoutSeconds"]["MaxValue"] < sam["Parameters"][
        "SlowWorkerTimeoutSeconds"]["MaxValue"]


def test_slow_kinds_reach_both_workers_as_one_list_that_the_library_reads_alike(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    """Whatever SlowKinds the template accepts, the slow worker claims exactly the kinds
    the main worker leaves (the same list, parsed by the same settings), and neither
    worker gets both variables, which the library refuses."""
    from leaseq.settings import WorkerSettings

    slow = function_properties(cfn, "SlowWorkerFunction")["Environment"]["Variables"]
    main = function_properties(cfn, "WorkerFunction")["Environment"]["Variables"]
    assert set(KIND_FILTER_VARIABLES) <= settings_variables()
    assert set(slow) <= settings_variables() | {*POWERTOOLS_VARIABLES, ENVIRONMENT_VARIABLE}
    assert "LEASEQ_EXCLUDE_KINDS" not in slow
    assert "LEASEQ_KINDS" not in main
    pattern = re.compile(sam["Parameters"]["SlowKinds"]["AllowedPattern"])
    for value, kinds in [
        ("report.build", ("report.build",)),
        ("report.build,invoice.render", ("report.build", "invoice.render")),
        ("report.build ,invoice.render", ("report.build", "invoice.render")),
        ("x" * 128 + ",y", ("x" * 128, "y")),
    ]:
        assert pattern.fullmatch(value), value
        # As the two functions' environments carry it (an empty variable is unset).
        claimed = WorkerSettings.model_validate({"LEASEQ_KINDS": value})
        left = WorkerSettings.model_validate({"LEASEQ_EXCLUDE_KINDS": value})
        assert claimed.kinds == left.exclude_kinds == kinds, value
    assert pattern.fullmatch("")  # no slow worker; the main worker then claims every kind
    # What the library would refuse, the template refuses first.
    for value in ("report.build,", ",report.build", "report.build,,x", " report.build",
                  "report.build, x", "x" * 129):
        assert not pattern.fullmatch(value), value


def test_the_kind_filter_is_documented_as_working_now_that_the_library_reads_it() -> None:
    """The template sets LEASEQ_KINDS / LEASEQ_EXCLUDE_KINDS and the library declares
    them; no text may still tell deployers that SlowKinds has no effect."""
    deploy = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    template = (ROOT / "template.yaml").read_text(encoding="utf-8")

    assert set(KIND_FILTER_VARIABLES) <= settings_variables()
    for stale in ("until then leave it empty", "Takes effect once", "takes effect with the "
                  "library", "does not have yet"):
        assert stale not in deploy, stale
        assert stale not in template, stale
    for variable in KIND_FILTER_VARIABLES:
        assert variable in deploy, variable


def test_the_proxy_role_may_connect_as_each_login_and_no_other(cfn: dict[str, Any]) -> None:
    """End-to-end IAM: the proxy logs in to the database with IAM as the client's user:
    the stack's logins, and each of TenantProducerDbUsers when that is given."""
    statement, *producers = statements_of(cfn["Resources"]["DatabaseProxyRole"])

    assert statement["Action"] == "rds-db:connect"
    prefix = ("arn:${AWS::Partition}:rds-db:${AWS::Region}:${AWS::AccountId}:dbuser:"
              "${Database.DbiResourceId}/")
    always = [r["Fn::Sub"] for r in statement["Resource"] if "Fn::Sub" in r]
    assert always == [f"{prefix}${{{user}}}" for user in LOGIN_PARAMETERS]
    conditional = [r["Fn::If"] for r in statement["Resource"] if "Fn::If" in r]
    assert conditional == [
        ["DashboardOn", {"Fn::Sub": f"{prefix}${{DashboardDbUser}}"}, {"Ref": "AWS::NoValue"}],
        ["DashboardHasTenantViewers", {"Fn::Sub": f"{prefix}{TENANT_READERS}"},
         {"Ref": "AWS::NoValue"}]]
    assert len(producers) == 5
    for slot, conditional in enumerate(producers):
        condition, granted, absent = conditional["Fn::If"]
        assert condition == f"ProxyTakesTenantProducer{slot + 1}"
        assert absent == {"Ref": "AWS::NoValue"}
        assert granted["Action"] == "rds-db:connect"
        template, variables = granted["Resource"]["Fn::Sub"]
        assert template == f"{prefix}${{Login}}"
        assert variables["Login"] == {"Fn::Select": [slot, {"Fn::Split": [
            ",", {"Fn::Sub": "${TenantProducerDbUsers},,,,,"}]}]}
        assert cfn["Conditions"][condition] == {"Fn::And": [
            {"Condition": "CreateDatabase"},
            {"Fn::Not": [{"Fn::Equals": [variables["Login"], ""]}]}]}


def test_tenant_producer_logins_are_at_most_five_leaseq_names(sam: dict[str, Any]) -> None:
    """The boundary allows rds-db:connect as leaseq_* users only; five slots exist."""
    pattern = re.compile(sam["Parameters"]["TenantProducerDbUsers"]["AllowedPattern"])
    logins = [f"leaseq_acme_{n}" for n in range(6)]

    assert sam["Parameters"]["TenantProducerDbUsers"]["Default"] == ""
    assert pattern.match("")
    assert pattern.match(",".join(logins[:5]))
    for refused in (",".join(logins), "acme_producer", "leaseq_acme,", "leaseq_a, leaseq_b",
                    "leaseq_Acme"):
        assert not pattern.match(refused), refused


def test_the_enqueue_function_gets_the_handlers_only_when_it_checks_jobs(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    """EnqueueChecksJobs (off by default) gives the enqueue function the handlers module as
    LEASEQ_ENQUEUE_HANDLERS, their layer and their settings; never their policies."""
    assert sam["Parameters"]["EnqueueChecksJobs"]["Default"] == "false"
    assert sam["Conditions"]["EnqueueChecksJobsOn"] == {"Fn::And": [
        {"Fn::Equals": [{"Ref": "EnqueueChecksJobs"}, "true"]},
        {"Condition": "HasHandlersModule"}]}
    assert sam["Conditions"]["EnqueueHasHandlersLayer"] == {"Fn::And": [
        {"Condition": "EnqueueChecksJobsOn"}, {"Condition": "HasHandlersLayer"}]}
    properties = function_properties(cfn, "EnqueueFunction")
    assert properties["Layers"][2:] == [{"Fn::If": [
        "EnqueueHasHandlersLayer", {"Ref": "HandlersLayerArn"}, {"Ref": "AWS::NoValue"}]}]
    variables = properties["Environment"]["Variables"]
    assert variables["LEASEQ_ENQUEUE_HANDLERS"] == {
        "Fn::If": ["EnqueueChecksJobsOn", {"Ref": "HandlersModule"}, {"Ref": "AWS::NoValue"}]}
    assert variables[ENVIRONMENT_VARIABLE] == {
        "Fn::If": ["EnqueueChecksJobsOn", {"Ref": "HandlersEnvironment"},
                   {"Ref": "AWS::NoValue"}]}
    assert "LEASEQ_HANDLERS" not in variables  # it checks, it never runs a handler
    holders = [name for name in resources_of_type(cfn, "AWS::Lambda::Function")
               if "LEASEQ_ENQUEUE_HANDLERS" in function_properties(cfn, name).get(
                   "Environment", {}).get("Variables", {})]
    assert holders == ["EnqueueFunction"]


def test_enqueue_tenants_reach_the_migrations_and_the_enqueue_function_and_nothing_else(
    cfn: dict[str, Any],
) -> None:
    """The migrations bind the enqueue login to them (the fence); the function answers
    another tenant's job item by item (the answer)."""
    migrations = cfn["Resources"]["Migrations"]["Properties"]
    assert migrations["EnqueueTenants"] == {"Ref": "EnqueueTenants"}
    assert cfn["Parameters"]["EnqueueTenants"]["Default"] == ""
    holders = [name for name in resources_of_type(cfn, "AWS::Lambda::Function")
               if "LEASEQ_ENQUEUE_TENANTS" in function_properties(cfn, name).get(
                   "Environment", {}).get("Variables", {})]
    assert holders == ["EnqueueFunction"]
    variables = function_properties(cfn, "EnqueueFunction")["Environment"]["Variables"]
    assert variables["LEASEQ_ENQUEUE_TENANTS"] == {"Ref": "EnqueueTenants"}
    assert "EnqueueTenants" in cfn["Metadata"]["AWS::CloudFormation::Interface"][
        "ParameterGroups"][2]["Parameters"]


def test_the_enqueue_tenants_pattern_accepts_exactly_what_the_library_reads(
    sam: dict[str, Any],
) -> None:
    """A value the pattern lets through and the migrations or the function refuse would
    fail the deploy, or every cold start, instead of the parameter."""
    from leaseq.settings import MAX_ENQUEUE_TENANTS, tenant_list

    pattern = re.compile(sam["Parameters"]["EnqueueTenants"]["AllowedPattern"])
    ids = [str(uuid.uuid4()) for _ in range(MAX_ENQUEUE_TENANTS + 1)]
    accepted = ["", ids[0], ids[0].upper(), f"{ids[0]}, {ids[1]}", f" {ids[0]} ,{ids[1]} ",
                ",".join(ids[:MAX_ENQUEUE_TENANTS])]
    refused = [",".join(ids), "tenant-a", f"{ids[0]},", f"{ids[0]};{ids[1]}",
               ids[0].replace("-", ""), f"{{{ids[0]}}}"]

    for value in accepted:
        assert pattern.match(value), value
        assert len(tenant_list(value)) == len([v for v in value.split(",") if v.strip()])
    for value in refused:
        assert not pattern.match(value), value
    # The library is no looser where it matters: too many, or not a tenant id.
    for value in (",".join(ids), "tenant-a", f"{ids[0]},"):
        with pytest.raises(ValueError, match=r"tenants; at most|is not a tenant id"):
            tenant_list(value)


def test_operators_get_the_connect_resource_of_their_login_and_no_managed_policy(
    cfn: dict[str, Any],
) -> None:
    output = cfn["Outputs"]["OperatorDbConnectResource"]
    created = output["Value"]["Fn::If"][1]["Fn::Sub"][0]

    assert output["Condition"] == "UseIamAuth"
    assert created.endswith(":dbuser:${ProxyId}/${OperatorDbUser}")
    # The only managed policy is the producers' (exported before this change); a policy
    # operators attached would be one more the deployer could widen.
    assert set(resources_of_type(cfn, "AWS::IAM::ManagedPolicy")) == {"EnqueueProducerPolicy"}


def test_login_parameters_default_to_four_logins_and_refuse_the_names_of_groups(
    sam: dict[str, Any],
) -> None:
    defaults = [sam["Parameters"][p]["Default"] for p in LOGIN_PARAMETERS]

    assert len(set(defaults)) == 4
    for parameter in LOGIN_PARAMETERS:
        pattern = re.compile(sam["Parameters"][parameter]["AllowedPattern"])
        assert pattern.match(sam["Parameters"][parameter]["Default"])
        for refused in (*DUTY_GROUPS, "service_role", "authenticated", "app_admin",
                        "leaseq_", "Leaseq_worker_login", "leaseq_x; drop role y"):
            assert not pattern.match(refused), (parameter, refused)
    assert "RuntimeDbUser" not in sam["Parameters"]
    assert "RuntimeSecretArn" not in sam["Parameters"]
    for parameter in (*SECRET_PARAMETERS, "SchemaOwnerSecretArn"):
        pattern = re.compile(sam["Parameters"][parameter]["AllowedPattern"])
        assert pattern.match("")
        assert pattern.match("arn:aws:secretsmanager:eu-west-1:123456789012:secret:leaseq/w-AbC")
        # The boundary lets the stack's roles read leaseq/... secrets only.
        assert not pattern.match("arn:aws:secretsmanager:eu-west-1:123456789012:secret:other")
    rules = sam["Rules"]
    assert {"PasswordAuthenticationNeedsASecretPerLogin", "EachFunctionHasALoginOfItsOwn"} <= set(
        rules)


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
    condition, arm64, x86_64 = ref_after["Fn::If"]
    assert condition == "IsArm64"
    assert {arm64["Ref"], x86_64["Ref"]} == {
        name for name in resources_of_type(after, "AWS::Lambda::LayerVersion")
        if not name.startswith("CertificatesLayer")}


def test_the_migrations_resource_has_a_timeout_and_runs_before_the_runtime_functions(
    cfn: dict[str, Any],
) -> None:
    migrations = cfn["Resources"]["Migrations"]["Properties"]

    assert migrations["ServiceToken"] == {"Fn::GetAtt": ["MigrationsFunction", "Arn"]}
    assert 60 <= migrations["ServiceTimeout"] <= 3600
    assert function_properties(cfn, "MigrationsFunction")["Timeout"] < migrations["ServiceTimeout"]
    for parameter in (*LOGIN_PARAMETERS, *SECRET_PARAMETERS, "RuntimeStatementTimeout"):
        assert migrations[parameter] == {"Ref": parameter}
    assert migrations["RuntimeIamAuth"] == {"Fn::If": ["UseIamAuth", "true", "false"]}
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


def test_a_missed_schedule_slot_or_a_silent_reaper_raises_the_schedules_alarm(
    cfn: dict[str, Any],
) -> None:
    """The reaper publishes ScheduleSlotsMissed on every pass (0 included), so a slot
    enqueued late or skipped breaches, and so does a five-minute gap with no pass."""
    alarm = cfn["Resources"]["ScheduleSlotsMissedAlarm"]
    assert alarm_metrics(alarm) == {("Leaseq", "ScheduleSlotsMissed", "leaseq")}
    properties = alarm["Properties"]
    assert (properties["Statistic"], properties["Threshold"],
            properties["ComparisonOperator"], properties["TreatMissingData"]) == (
        "Sum", 1, "GreaterThanOrEqualToThreshold", "breaching")
    assert properties["Period"] * properties["EvaluationPeriods"] == 300
    assert properties["AlarmActions"] == {
        "Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}


def test_the_database_created_here_has_alarms_for_its_cpu_and_its_proxys_connections(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    alarms = cfn["Resources"]

    cpu = alarms["DatabaseCpuAlarm"]
    assert cpu["Condition"] == "CreateDatabase"
    assert alarm_metrics(cpu) == {("AWS/RDS", "CPUUtilization", "Database")}
    assert (cpu["Properties"]["Statistic"], cpu["Properties"]["Threshold"],
            cpu["Properties"]["ComparisonOperator"]) == (
        "Average", {"Ref": "DatabaseCpuAlarmPercent"}, "GreaterThanThreshold")
    # Sustained, not a peak: 15 minutes of five-minute averages.
    assert cpu["Properties"]["Period"] * cpu["Properties"]["DatapointsToAlarm"] == 900
    assert sam["Parameters"]["DatabaseCpuAlarmPercent"]["Default"] == 80
    # The proxy's share of what it may open: a ratio of the two metrics, as a percentage.
    proxy = alarms["ProxyConnectionsAlarm"]
    assert proxy["Condition"] == "CreateDatabase"
    assert alarm_metrics(proxy) == {("AWS/RDS", "DatabaseConnections", "DatabaseProxy"),
                                    ("AWS/RDS", "MaxDatabaseConnectionsAllowed", "DatabaseProxy")}
    (expression,) = [m for m in proxy["Properties"]["Metrics"] if m.get("ReturnData")]
    assert expression["Expression"] == "100 * used / allowed"
    assert proxy["Properties"]["Threshold"] == {"Ref": "ProxyConnectionsAlarmPercent"}
    assert proxy["Properties"]["TreatMissingData"] == "notBreaching"
    failures = alarms["ProxyLoginFailuresAlarm"]
    assert alarm_metrics(failures) == {
        ("AWS/RDS", "ClientConnectionsSetupFailedAuth", "DatabaseProxy")}
    assert failures["Properties"]["Threshold"] == 1


@pytest.mark.parametrize(("instance_class", "burstable"), [
    ("db.t4g.micro", True), ("db.t3.medium", True), ("db.m7g.large", False),
    ("db.r7g.xlarge", False), ("db.m5.large", False)])
def test_cpu_credits_are_watched_on_a_burstable_instance_class_only(
    sam: dict[str, Any], cfn: dict[str, Any], instance_class: str, burstable: bool,
) -> None:
    credits = cfn["Resources"]["DatabaseCpuCreditsAlarm"]

    assert credits["Condition"] == "BurstableDatabase"
    assert alarm_metrics(credits) == {("AWS/RDS", "CPUCreditBalance", "Database")}
    properties = credits["Properties"]
    assert (properties["Statistic"], properties["ComparisonOperator"], properties["Threshold"]) == (
        "Minimum", "LessThanThreshold", {"Ref": "DatabaseCpuCreditsAlarmThreshold"})
    assert conditions_for(sam, DbInstanceClass=instance_class)["BurstableDatabase"] is burstable
    # The default class is burstable, so a first deploy has the alarm.
    assert sam["Parameters"]["DbInstanceClass"]["Default"].startswith("db.t")
    assert conditions_for(sam)["BurstableDatabase"] is True
    assert conditions_for(sam, DbInstanceClass="db.t4g.micro", ExistingDbEndpoint="db.internal",
                          SchemaOwnerSecretArn="x")["BurstableDatabase"] is False


def test_the_dashboard_function_has_an_errors_alarm_when_it_exists(cfn: dict[str, Any]) -> None:
    alarm = cfn["Resources"]["DashboardErrorsAlarm"]

    assert alarm["Condition"] == "DashboardOn"
    assert alarm_metrics(alarm) == {("AWS/Lambda", "Errors", "DashboardFunction")}
    assert (alarm["Properties"]["Threshold"], alarm["Properties"]["ComparisonOperator"]) == (
        1, "GreaterThanOrEqualToThreshold")


#: The conditions the dashboard's fragments and the alarms depend on, and the parameters
#: that turn each on (the others keep their defaults).
DASHBOARD_CONDITIONS = {
    "CreateDatabase": {"ExistingDbEndpoint": "db.example.internal",
                       "SchemaOwnerSecretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:"
                                               "secret:leaseq/owner"},
    "HasWorkerPool": {"MaxWorkers": "0"},
    "HasSlowWorker": {"SlowKinds": "report.monthly"},
    "DashboardOn": {"DashboardEnabled": "true"},
    "BurstableDatabase": {"DbInstanceClass": "db.m7g.large"},
}


def conditions_for(sam: dict[str, Any], **given: str) -> dict[str, bool]:
    """Every condition of the template, evaluated as CloudFormation does for ``given``."""
    from tests.infra.template_support import parameter_values, rule_value

    values = parameter_values(sam, **given)
    return {name: bool(rule_value(condition, values, sam["Conditions"]))
            for name, condition in sam["Conditions"].items()}


def dashboard_deployments() -> list[dict[str, str]]:
    """The defaults, then each condition flipped from its default on its own, then all."""
    deployments: list[dict[str, str]] = [{}]
    deployments += [dict(flip) for flip in DASHBOARD_CONDITIONS.values()]
    deployments.append({k: v for flip in list(DASHBOARD_CONDITIONS.values())[1:4]
                        for k, v in flip.items()})
    deployments.append({k: v for flip in DASHBOARD_CONDITIONS.values() for k, v in flip.items()
                        if k != "DbInstanceClass"})
    return deployments


def dashboard_widgets(sam: dict[str, Any], cfn: dict[str, Any],
                      conditions: dict[str, bool]) -> list[dict[str, Any]]:
    """The dashboard body CloudFormation would make under ``conditions``, parsed."""
    body, variables = cfn["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    numbers = {name for name, parameter in sam["Parameters"].items()
               if parameter["Type"] == "Number"}

    def placeholder(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in numbers:
            return str(sam["Parameters"][name]["Default"])
        return "X" + re.sub(r"\W", "_", name)

    text = body
    for name, value in variables.items():
        condition, when_true, when_false = value["Fn::If"]
        chosen = when_true if conditions[condition] else when_false
        if isinstance(chosen, dict):
            chosen = chosen["Fn::Sub"]
            if isinstance(chosen, list):  # an inner Sub's own names stand for !Refs
                chosen, names = chosen
                for inner, ref in names.items():
                    chosen = chosen.replace("${" + inner + "}", "${" + ref["Ref"] + "}")
        text = text.replace("${" + name + "}", chosen)
    widgets: list[dict[str, Any]] = json.loads(re.sub(r"\$\{([^}]+)\}", placeholder, text))[
        "widgets"]
    return widgets


@pytest.mark.parametrize("given", dashboard_deployments(),
                         ids=lambda given: ",".join(f"{k}={v}" for k, v in given.items())
                         or "defaults")
def test_the_dashboard_is_json_and_shows_every_alarm_the_stack_creates(
    sam: dict[str, Any], cfn: dict[str, Any], given: dict[str, str],
) -> None:
    conditions = conditions_for(sam, **given)
    widgets = dashboard_widgets(sam, cfn, conditions)

    metrics = {m[1] for w in widgets for m in w["properties"].get("metrics", [])}
    assert {"JobsClaimed", "JobsSucceeded", "JobsDead", "QueueLag", "JobDuration",
            "OldestReadyAgeSeconds", "Invocations", "Errors", "WorkerPoolSize",
            "ConcurrentExecutions", "Throttles"} <= metrics
    database = {"DatabaseConnectionsCurrentlySessionPinned", "MaxDatabaseConnectionsAllowed",
                "CPUUtilization", "CPUCreditBalance"}
    assert (database <= metrics) is conditions["CreateDatabase"]
    functions = {m[3] for w in widgets for m in w["properties"].get("metrics", [])
                 if m[0] == "AWS/Lambda"}
    assert ("XDashboardFunction" in functions) is conditions["DashboardOn"]
    (shown,) = [w["properties"]["alarms"] for w in widgets if w["type"] == "alarm"]
    alarms = resources_of_type(cfn, "AWS::CloudWatch::Alarm")
    created = {f"X{name}_Arn" for name, alarm in alarms.items()
               if conditions.get(alarm.get("Condition", ""), True)}
    assert sorted(shown) == sorted(created)


def test_the_dashboard_deployments_reach_every_condition_of_an_alarm_both_ways(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    """The deployments above must turn each alarm's condition on and off, or the test above
    would not see a missing fragment (the two alarms it once left out were conditional)."""
    alarms = resources_of_type(cfn, "AWS::CloudWatch::Alarm")
    used = {alarm["Condition"] for alarm in alarms.values() if "Condition" in alarm}
    seen = [conditions_for(sam, **given) for given in dashboard_deployments()]

    assert used == {"CreateDatabase", "HasWorkerPool", "HasSlowWorker", "DashboardOn",
                    "BurstableDatabase"}
    for condition in used:
        assert {found[condition] for found in seen} == {True, False}, condition


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


# ---- the permissions boundary ------------------------------------------------------------------

#: The X-Ray write policy SAM attaches to a function with Tracing: Active (aws partition).
XRAY_WRITE_POLICY = "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess"
BOUNDARY_ARN = "arn:aws:iam::*:policy/boundaries/leaseq-permissions-boundary"
#: The boundaries an administrator makes (infra/permissions-boundary.yaml): the stack's,
#: and the workers' one that takes what the handlers use.
BOUNDARY_ARNS = [BOUNDARY_ARN,
                 "arn:aws:iam::*:policy/boundaries/leaseq-handlers-boundary"]
BOUNDARY_DEFAULT = "arn:${AWS::Partition}:iam::${AWS::AccountId}:policy/boundaries/" \
    "leaseq-permissions-boundary"

#: What the AWS managed policies SAM attaches to a traced function in a VPC allow (the X-Ray
#: write policy under either of its names grants the same five actions).
SAM_ATTACHED_ACTIONS = (
    "logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
    "ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets",
    "ec2:DeleteNetworkInterface", "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignPrivateIpAddresses",
    "xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules",
    "xray:GetSamplingTargets", "xray:GetSamplingStatisticSummaries",
)


#: The deployer's policy, in two managed policies: one alone would pass IAM's size limit.
DEPLOYER_POLICIES = ("deployer-policy.json", "deployer-policy-resources.json")


def policy_document(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        (ROOT / "infra" / name).read_text(encoding="utf-8"))
    return document


def deployer_policy() -> dict[str, Any]:
    """The statements of both deployer policies, as IAM evaluates them together."""
    statements = [s for name in DEPLOYER_POLICIES for s in policy_document(name)["Statement"]]
    return {"Version": "2012-10-17", "Statement": statements}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def matches(action: str, patterns: list[str]) -> bool:
    """IAM action matching: case-insensitive, * and ? wildcards."""
    return any(fnmatch.fnmatchcase(action.lower(), p.lower()) for p in patterns)


def test_every_role_the_stack_creates_has_the_permissions_boundary(
    sam: dict[str, Any], cfn: dict[str, Any],
) -> None:
    expected = {"Fn::If": ["HasPermissionsBoundaryArn", {"Ref": "PermissionsBoundaryArn"},
                           {"Fn::Sub": BOUNDARY_DEFAULT}]}
    # The workers run your handlers: their boundary is the one an administrator extends
    # for them (infra/permissions-boundary.yaml), else the stack's.
    workers = {"Fn::If": ["HasWorkerPermissionsBoundaryArn",
                          {"Ref": "WorkerPermissionsBoundaryArn"}, expected]}
    roles = resources_of_type(cfn, "AWS::IAM::Role")

    # the six functions' roles, the three schedules' roles (SAM makes them), the proxy's
    assert len(roles) == 10, sorted(roles)
    for name, role in roles.items():
        wanted = workers if name.removesuffix("Role") in WORKERS else expected
        assert role["Properties"].get("PermissionsBoundary") == wanted, name
    assert sam["Parameters"]["WorkerPermissionsBoundaryArn"]["Default"] == ""
    # No other kind of principal is made, and no role outside what SAM expands.
    assert not resources_of_type(cfn, "AWS::IAM::User")
    assert not resources_of_type(cfn, "AWS::IAM::Group")
    assert sam["Parameters"]["PermissionsBoundaryArn"]["Default"] == ""


def test_the_boundary_allows_what_the_stack_roles_use_and_nothing_of_iam(
    cfn: dict[str, Any],
) -> None:
    boundary = policy_document("permissions-boundary.json")
    allowed = [a for s in boundary["Statement"] if s["Effect"] == "Allow"
               for a in as_list(s["Action"])]

    used = set(SAM_ATTACHED_ACTIONS)
    for role in resources_of_type(cfn, "AWS::IAM::Role").values():
        for statement in statements_of(role):
            branches = statement["Fn::If"][1:] if "Fn::If" in statement else [statement]
            for branch in branches:
                if branch != {"Ref": "AWS::NoValue"}:
                    used |= set(as_list(branch["Action"]))
    for policy in resources_of_type(cfn, "AWS::IAM::ManagedPolicy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            used |= set(as_list(statement["Action"]))
    # The exported producer policy is attached by other stacks' roles, not by these.
    used -= {"events:PutEvents"}

    assert [a for a in sorted(used) if not matches(a, allowed)] == []
    assert not [a for a in allowed if "*" in a], "the boundary names each action it allows"
    assert not [a for a in allowed if a.lower().startswith(("iam:", "sts:", "organizations:"))]
    # rds-db:connect as leaseq_* users only, so no role can log in as another application's.
    (connect,) = [s for s in boundary["Statement"] if s["Action"] == "rds-db:connect"]
    assert connect["Resource"] == "arn:aws:rds-db:*:*:dbuser:*/leaseq_*"


def test_the_deployer_may_attach_every_managed_policy_of_the_stacks_roles(
    cfn: dict[str, Any],
) -> None:
    (attach,) = [s for s in deployer_policy()["Statement"]
                 if s["Effect"] == "Allow" and "iam:AttachRolePolicy" in statement_actions(s)]
    allowed = attach["Condition"]["ArnLike"]["iam:PolicyARN"]
    attached = {arn for role in resources_of_type(cfn, "AWS::IAM::Role").values()
                for arn in role["Properties"].get("ManagedPolicyArns", [])
                if isinstance(arn, str)}

    assert XRAY_WRITE_POLICY in attached, "tracing is on, so SAM attaches the X-Ray policy"
    assert [a for a in sorted(attached) if not matches(a, allowed)] == []
    # SAM names the policy AWSXrayWriteOnlyAccess in the aws partition and
    # AWSXRayDaemonWriteAccess elsewhere: either may be attached.
    assert "arn:aws:iam::aws:policy/AWSXRayDaemonWriteAccess" in allowed


# ---- the deployer's policy ---------------------------------------------------------------------

#: The resources the SAM CLI's --resolve-s3 puts in the aws-sam-cli-managed-default stack on
#: a first deploy (samcli/lib/bootstrap/bootstrap.py in aws-sam-cli 1.170.0), with the
#: properties that stack's template sets.
SAM_MANAGED_STACK: dict[str, dict[str, Any]] = {
    "SamCliSourceBucket": {"Type": "AWS::S3::Bucket", "Properties": {
        "PublicAccessBlockConfiguration": {}, "BucketEncryption": {},
        "VersioningConfiguration": {}, "Tags": []}},
    "SamCliSourceBucketBucketPolicy": {"Type": "AWS::S3::BucketPolicy", "Properties": {
        "Bucket": {}, "PolicyDocument": {}}},
}


@dataclass(frozen=True)
class Exemption:
    """A handler permission the deployer policy leaves out on purpose, and why.

    Most are the calls a handler makes only for a property this project never sets: the
    test fails as soon as a resource of the type sets one, so the permission is added when
    it becomes needed, not before.
    """

    actions: tuple[str, ...]
    types: tuple[str, ...]
    reason: str
    unset_properties: tuple[str, ...] = ()
    #: Left out because the policy denies it outright.
    denied: bool = False


EXEMPTIONS = (
    Exemption(("s3:REST.PUT.OBJECT",), ("AWS::Logs::LogGroup",),
              "an S3 REST operation's name in the handler's list, not an IAM action"),
    Exemption(("firehose:TagDeliveryStream", "logs:CreateLogDelivery"), ("AWS::Logs::LogGroup",),
              "log delivery to other services; no delivery is configured here"),
    Exemption(("logs:PutDataProtectionPolicy",), ("AWS::Logs::LogGroup",),
              "data protection policies", ("DataProtectionPolicy",)),
    Exemption(("logs:PutIndexPolicy", "logs:DeleteIndexPolicy"), ("AWS::Logs::LogGroup",),
              "field index policies", ("FieldIndexPolicies",)),
    Exemption(("logs:PutResourcePolicy", "logs:DeleteResourcePolicy"), ("AWS::Logs::LogGroup",),
              "resource policies on log groups", ("ResourcePolicyDocument",)),
    Exemption(("logs:PutBearerTokenAuthentication",), ("AWS::Logs::LogGroup",),
              "bearer token ingestion", ("BearerTokenAuthenticationEnabled",)),
    Exemption(("logs:AssociateKmsKey", "logs:DisassociateKmsKey"), ("AWS::Logs::LogGroup",),
              "customer KMS keys", ("KmsKeyId",)),
    Exemption(("logs:PutLogGroupDeletionProtection",), ("AWS::Logs::LogGroup",),
              "deletion protection of log groups", ("DeletionProtectionEnabled",)),
    Exemption(("kms:*",), ("AWS::Lambda::Function",), "customer KMS keys", ("KmsKeyArn",)),
    Exemption(("elasticfilesystem:DescribeMountTargets", "s3files:ListMountTargets"),
              ("AWS::Lambda::Function",), "file systems", ("FileSystemConfigs",)),
    Exemption(("lambda:PassCapacityProvider",), ("AWS::Lambda::Function",),
              "capacity providers (of other resources)", ("CapacityProviderConfig",)),
    Exemption(("lambda:PutFunctionCodeSigningConfig", "lambda:DeleteFunctionCodeSigningConfig"),
              ("AWS::Lambda::Function",), "code signing", ("CodeSigningConfigArn",)),
    Exemption(("kms:*",), ("AWS::Events::EventBus",), "customer KMS keys",
              ("KmsKeyIdentifier",)),
    Exemption(("events:PutPermission", "events:RemovePermission"), ("AWS::Events::EventBus",),
              "a resource policy opening the bus to other accounts", ("Policy",)),
    Exemption(("ec2:CreateVpcEncryptionControl",), ("AWS::EC2::VPC",),
              "VPC encryption control", ("VpcEncryptionControl",)),
    Exemption(("vpc-lattice:*",), ("AWS::EC2::VPCEndpoint",), "VPC Lattice service networks",
              ("ServiceNetworkArn",)),
    Exemption(("vpce:AllowMultiRegion",), ("AWS::EC2::VPCEndpoint",),
              "endpoints to services in other regions", ("ServiceRegion",)),
    Exemption(("rds:CreateDBInstanceReadReplica", "rds:PromoteReadReplica"),
              ("AWS::RDS::DBInstance",), "read replicas", ("SourceDBInstanceIdentifier",)),
    Exemption(("rds:RestoreDBInstanceFromDBSnapshot",), ("AWS::RDS::DBInstance",),
              "restoring a snapshot", ("DBSnapshotIdentifier",)),
    Exemption(("rds:RestoreDBInstanceToPointInTime",), ("AWS::RDS::DBInstance",),
              "point-in-time restores", ("SourceDBInstanceIdentifier", "SourceDbiResourceId",
                                         "SourceDBInstanceAutomatedBackupsArn", "RestoreTime",
                                         "UseLatestRestorableTime")),
    Exemption(("rds:StartDBInstanceAutomatedBackupsReplication",
               "rds:StopDBInstanceAutomatedBackupsReplication"), ("AWS::RDS::DBInstance",),
              "backups replicated to another region", ("AutomaticBackupReplicationRegion",)),
    Exemption(("rds:AddRoleToDBInstance", "rds:RemoveRoleFromDBInstance"),
              ("AWS::RDS::DBInstance",), "IAM roles for the database", ("AssociatedRoles",)),
    Exemption(("iam:AttachGroupPolicy", "iam:AttachUserPolicy", "iam:DetachGroupPolicy",
               "iam:DetachUserPolicy"), ("AWS::IAM::ManagedPolicy",),
              "attaching policies to users and groups, which the deployer must never do",
              ("Groups", "Users")),
    Exemption(("s3tables:*",), ("AWS::S3::Bucket",), "S3 metadata tables",
              ("MetadataConfiguration", "MetadataTableConfiguration")),
    Exemption(("iam:DeleteRolePermissionsBoundary",), ("AWS::IAM::Role",),
              "a role never loses its permissions boundary", denied=True),
)


def deployed_resources(cfn: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every resource a first deploy creates: both templates and the SAM CLI's own stack."""
    network = load_sam_template(ROOT / "infra" / "network.yaml")
    return {**{f"template.yaml:{n}": r for n, r in cfn["Resources"].items()},
            **{f"network.yaml:{n}": r for n, r in network["Resources"].items()},
            **{f"sam-managed:{n}": r for n, r in SAM_MANAGED_STACK.items()}}


def handler_permissions(type_name: str) -> set[str]:
    """The create, update and delete handlers' documented permissions (cfn-lint's schemas)."""
    if type_name.startswith("Custom::"):
        # CloudFormation invokes a custom resource's ServiceToken with the caller's rights.
        return {"lambda:InvokeFunction"}
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

    schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-1", type_name).schema
    handlers = schema.get("handlers", {})
    return {permission for operation in ("create", "update", "delete")
            for permission in handlers.get(operation, {}).get("permissions", [])}


def exemption_for(type_name: str, action: str) -> Exemption | None:
    for exemption in EXEMPTIONS:
        if type_name in exemption.types and matches(action, list(exemption.actions)):
            return exemption
    return None


def statement_actions(statement: dict[str, Any]) -> list[str]:
    assert "NotAction" not in statement, "NotAction would allow what nobody listed"
    return [str(a) for a in as_list(statement["Action"])]


def allowed(policy: dict[str, Any], action: str) -> bool:
    return any(statement["Effect"] == "Allow" and matches(action, statement_actions(statement))
               for statement in policy["Statement"])


def denied_outright(policy: dict[str, Any], action: str) -> bool:
    return any(statement["Effect"] == "Deny" and "Condition" not in statement
               and matches(action, statement_actions(statement))
               for statement in policy["Statement"])


def test_the_deployer_policy_allows_every_permission_the_resource_handlers_document(
    cfn: dict[str, Any],
) -> None:
    policy = deployer_policy()
    resources = deployed_resources(cfn)
    missing: list[str] = []
    checked = 0

    for type_name in sorted({r["Type"] for r in resources.values()}):
        for action in sorted(handler_permissions(type_name)):
            checked += 1
            exemption = exemption_for(type_name, action)
            if exemption is None:
                if not allowed(policy, action):
                    missing.append(f"{type_name}: {action}")
                continue
            if exemption.denied:
                assert denied_outright(policy, action), (type_name, action)
            for name, resource in resources.items():
                if resource["Type"] == type_name:
                    set_here = set(exemption.unset_properties) & set(resource.get("Properties", {}))
                    assert not set_here, (
                        f"{name} sets {set_here}: {type_name} then needs {action} "
                        f"({exemption.reason}); add it to infra/deployer-policy.json")

    assert checked > 300, "the handlers' permissions were not found in cfn-lint's schemas"
    assert missing == [], "infra/deployer-policy.json lacks what a deploy needs:\n" + "\n".join(
        missing)


def test_every_exemption_names_permissions_the_handlers_really_list() -> None:
    for exemption in EXEMPTIONS:
        for type_name in exemption.types:
            listed = handler_permissions(type_name)
            for action in exemption.actions:
                assert matches(action, sorted(listed)) or any(
                    matches(p, [action]) for p in listed), (type_name, action)


#: Actions by which a deployer could grant a role more than the boundary lets it have.
ROLE_POLICY_WRITES = ("iam:CreateRole", "iam:PutRolePolicy", "iam:AttachRolePolicy",
                      "iam:PutRolePermissionsBoundary", "iam:UpdateAssumeRolePolicy")


def test_the_deployer_policy_grants_no_wildcard_service_and_no_unbounded_role_writes() -> None:
    policy = deployer_policy()

    for statement in policy["Statement"]:
        sid = statement["Sid"]
        actions = statement_actions(statement)
        assert "*" not in actions, sid
        assert not [a for a in actions if re.fullmatch(r"[a-z0-9-]+:\*", a)], sid
        assert not [a for a in actions if a.lower().startswith("iam:") and "*" in a], sid
        if statement["Effect"] != "Allow":
            continue
        for action in actions:
            if matches(action, list(ROLE_POLICY_WRITES)):
                condition = statement.get("Condition", {})
                assert condition.get("StringLike", {}).get("iam:PermissionsBoundary") == (
                    BOUNDARY_ARNS), f"{sid}: {action} without the permissions boundary"
        if "iam:PassRole" in actions:
            assert actions == ["iam:PassRole"], sid
            assert statement["Resource"] == "arn:aws:iam::*:role/leaseq-*", sid
            services = statement["Condition"]["StringEquals"]["iam:PassedToService"]
            assert set(services) == {"lambda.amazonaws.com", "rds.amazonaws.com",
                                     "scheduler.amazonaws.com"}, sid
        if "iam:AttachRolePolicy" in actions:
            assert statement["Condition"]["ArnLike"]["iam:PolicyARN"], sid
        if "lambda:AddPermission" in actions:
            assert statement["Condition"] == {
                "StringEquals": {"lambda:Principal": "events.amazonaws.com"}}, sid
    # Unbounded or differently bounded roles, and boundary edits, are denied outright.
    for action in ("iam:DeleteRolePermissionsBoundary", "iam:CreatePolicyVersion",
                   "iam:SetDefaultPolicyVersion", "iam:DeletePolicy"):
        assert denied_outright(policy, action), action
    (guard,) = [s for s in policy["Statement"] if s["Effect"] == "Deny" and "Condition" in s]
    assert set(guard["Action"]) == {"iam:CreateRole", "iam:PutRolePermissionsBoundary"}
    assert guard["Condition"] == {"StringNotLike": {"iam:PermissionsBoundary": BOUNDARY_ARNS}}
    # The boundary policies themselves are outside what the deployer may create or change.
    for statement in policy["Statement"]:
        if statement["Effect"] == "Allow" and matches("iam:CreatePolicy", statement["Action"]):
            assert not [r for r in as_list(statement["Resource"]) for boundary in BOUNDARY_ARNS
                        if fnmatch.fnmatchcase(boundary, r)], statement["Sid"]


_DESTRUCTIVE = re.compile(
    r":(Delete|Modify|Revoke|Deregister|Reboot|Remove|Disassociate|Authorize|Replace|Update|"
    r"Associate|Put|Set|Stop)")
#: Resources that are this project's by name.
_OWN_RESOURCES = re.compile(
    r"^arn:aws:[a-z0-9-]+:(\*|):(\*|aws)?:("
    r"function:leaseq-\*|layer:leaseq-\*(:\*)?|role/leaseq-\*|policy/leaseq-\*|"
    r"event-bus/leaseq-\*|rule/leaseq-\*(/\*)?|schedule/default/leaseq-\*|alarm:leaseq-\*|"
    r"dashboard/leaseq-\*|log-group:/aws/lambda/leaseq-\*(:\*)?|leaseq-\*|parameter/leaseq/\*|"
    r"stack/leaseq-\*/\*|stack/aws-sam-cli-managed-default/\*|transform/Serverless-2016-10-31|"
    r"secret:rds!\*|role/\*|policy/boundaries/leaseq-(permissions|handlers)-boundary)$"
    r"|^arn:aws:s3:::aws-sam-cli-managed-default-\*(/\*)?$"
    r"|^arn:aws:iam::\*:role/aws-service-role/rds\.amazonaws\.com/AWSServiceRoleForRDS$")
#: The one statement that changes resources neither a name nor a tag ties to the stack: a
#: proxy's target group carries no stack tag of its own (documented in infra/README.md);
#: registering a database with it also needs the database's own stack tag.
_UNTAGGED_EXCEPTIONS = {"ProxyTargetGroupsCarryNoStackTagOfTheirOwn"}


def test_the_deployer_policy_changes_and_deletes_only_the_stacks_resources() -> None:
    policy = deployer_policy()
    stack_tag = {"StringLike": {"aws:ResourceTag/aws:cloudformation:stack-name": "leaseq-*"}}

    for statement in policy["Statement"]:
        if statement["Effect"] != "Allow" or statement["Sid"] in _UNTAGGED_EXCEPTIONS:
            continue
        destructive = [a for a in statement_actions(statement) if _DESTRUCTIVE.search(a)]
        if not destructive:
            continue
        foreign = [r for r in as_list(statement["Resource"]) if not _OWN_RESOURCES.match(r)]
        if foreign:
            assert statement.get("Condition") == stack_tag, (
                f"{statement['Sid']}: {destructive} on {foreign} without the stack-name tag")
    (untagged,) = [s for s in policy["Statement"] if s["Sid"] in _UNTAGGED_EXCEPTIONS]
    assert untagged["Resource"] == "arn:aws:rds:*:*:target-group:*"
    assert set(untagged["Action"]) == {"rds:DeregisterDBProxyTargets",
                                       "rds:ModifyDBProxyTargetGroup",
                                       "rds:RegisterDBProxyTargets"}


@pytest.mark.parametrize("name", [*DEPLOYER_POLICIES, "permissions-boundary.json"])
def test_each_policy_file_is_a_managed_policy_iam_accepts(name: str) -> None:
    document = policy_document(name)

    assert set(document) == {"Version", "Statement"}
    assert document["Version"] == "2012-10-17"
    for statement in document["Statement"]:
        assert statement["Effect"] in {"Allow", "Deny"}
        assert set(statement) <= {"Sid", "Effect", "Action", "Resource", "Condition"}
        assert re.fullmatch(r"[A-Za-z0-9]+", statement["Sid"])
        assert statement["Resource"]
        for action in statement_actions(statement):
            assert re.fullmatch(r"[a-z0-9-]+:[A-Za-z0-9*]+", action), action
    # IAM's managed policy size limit: 6,144 characters, whitespace not counted.
    assert len(re.sub(r"\s", "", json.dumps(document))) <= 6144
    sids = [s["Sid"] for s in deployer_policy()["Statement"]]
    assert len(sids) == len(set(sids))


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


def test_the_dashboard_logs_in_as_its_own_login_and_reads_its_access_lists(
    cfn: dict[str, Any],
) -> None:
    declared = settings_variables() | set(POWERTOOLS_VARIABLES)
    dashboard = function_properties(cfn, "DashboardFunction")
    variables = dashboard["Environment"]["Variables"]
    worker = function_properties(cfn, "WorkerFunction")["Environment"]["Variables"]
    login = ("LEASEQ_DB_HOST", "LEASEQ_DB_PORT", "LEASEQ_DB_NAME", "LEASEQ_DB_USER",
             "LEASEQ_DB_IAM_AUTH", "LEASEQ_DATABASE_SECRET_ARN", "LEASEQ_DB_SSLMODE")
    own = {**worker, "LEASEQ_DB_USER": {"Ref": "DashboardDbUser"},
           "LEASEQ_DATABASE_SECRET_ARN": {"Fn::If": [
               "UsePasswordAuth", {"Ref": "DashboardDbSecretArn"}, {"Ref": "AWS::NoValue"}]}}
    assert {k: variables.get(k) for k in login} == {k: own.get(k) for k in login}
    assert variables["LEASEQ_DASHBOARD_OPERATORS"] == {"Ref": "DashboardOperators"}
    assert variables["LEASEQ_DASHBOARD_TENANT_VIEWERS"] == {"Ref": "DashboardTenantViewers"}
    assert variables["LEASEQ_DASHBOARD_READER_CONNECTIONS"] == {
        "Ref": "DashboardReaderConnections"}
    assert variables["LEASEQ_DASHBOARD_URL_ID"] == {
        "Fn::If": ["DashboardHasUrlId", {"Ref": "DashboardUrlId"}, {"Ref": "AWS::NoValue"}]}
    dashboard_variables = {"LEASEQ_DASHBOARD_OPERATORS", "LEASEQ_DASHBOARD_VIEWERS",
                           "LEASEQ_DASHBOARD_TENANT_VIEWERS",
                           "LEASEQ_DASHBOARD_READER_CONNECTIONS", "LEASEQ_DASHBOARD_URL_ID"}
    assert set(variables) <= declared | dashboard_variables, set(variables) - declared
    group = dashboard["LoggingConfig"]["LogGroup"]["Ref"]
    assert cfn["Resources"][group]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    assert cfn["Resources"][group]["DeletionPolicy"] == "Retain"


def test_the_dashboard_settings_declare_every_variable_the_template_sets() -> None:
    from leaseq_dashboard.settings import DashboardSettings

    aliases = {f.alias for f in DashboardSettings.model_fields.values()}
    assert {"LEASEQ_DASHBOARD_OPERATORS", "LEASEQ_DASHBOARD_VIEWERS",
            "LEASEQ_DASHBOARD_TENANT_VIEWERS", "LEASEQ_DASHBOARD_READER_CONNECTIONS",
            "LEASEQ_DASHBOARD_URL_ID"} <= aliases


def test_the_dashboard_is_reserved_and_by_default_fits_the_operators_allowance(
    sam: dict[str, Any], cfn: dict[str, Any], migrations_app: Any,
) -> None:
    from leaseq_deploy import connection_budget

    dashboard = function_properties(cfn, "DashboardFunction")
    assert dashboard["ReservedConcurrentExecutions"] == {"Ref": "DashboardReservedConcurrency"}
    parameter = sam["Parameters"]["DashboardReservedConcurrency"]
    assert parameter["MinValue"] >= 1  # never unreserved: each execution holds connections
    reserved, readers = (int(sam["Parameters"][p]["Default"]) for p in (
        "DashboardReservedConcurrency", "DashboardReaderConnections"))
    properties = {connection_budget.PROPERTY: {
        key: str(sam["Parameters"][key]["Default"]) if key in sam["Parameters"] else ""
        for key in connection_budget.KEYS}}
    stack = connection_budget.stack_connections(properties)
    assert stack is not None
    assert stack.dashboard == connection_budget.DashboardConnections(reserved, readers)
    assert stack.dashboard.total <= stack.operators


def test_the_dashboards_login_parameter_refuses_group_reader_and_other_logins_names(
    sam: dict[str, Any],
) -> None:
    pattern = re.compile(sam["Parameters"]["DashboardDbUser"]["AllowedPattern"])
    assert pattern.match(sam["Parameters"]["DashboardDbUser"]["Default"])
    for refused in (*DUTY_GROUPS, "leaseq_dashboard", "leaseq_tenant_reader_0123abcd",
                    "service_role", "authenticated", "leaseq_"):
        assert not pattern.match(refused), refused
    (_, own_login) = sam["Rules"]["EachFunctionHasALoginOfItsOwn"]["Assertions"]
    compared = [pair["Fn::Equals"] for pair in own_login["Assert"]["Fn::Not"][0]["Fn::Or"]]
    assert compared == [[{"Ref": "DashboardDbUser"}, {"Ref": p}] for p in LOGIN_PARAMETERS]


def _join_of_secrets(value: dict[str, Any]) -> list[str]:
    return [ref["Ref"] for ref in value["Fn::Join"][1]]


def test_rules_refuse_tenant_viewers_without_iam_auth_and_a_dashboard_without_its_secret(
    sam: dict[str, Any],
) -> None:
    rules = sam["Rules"]
    iam = rules["DashboardTenantViewersNeedIamAuth"]
    assert iam["RuleCondition"]["Fn::And"][1] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "DashboardTenantViewers"}, ""]}]}
    (assertion,) = iam["Assertions"]
    joined, empty = assertion["Assert"]["Fn::Equals"]
    assert empty == ""
    assert _join_of_secrets(joined) == [*SECRET_PARAMETERS, "DashboardDbSecretArn"]
    assert "IAM authentication" in assertion["AssertDescription"]
    (needs_secret,) = rules["DashboardPasswordAuthenticationNeedsItsSecret"]["Assertions"]
    assert needs_secret["Assert"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "DashboardDbSecretArn"}, ""]}]}
    (only_with,) = rules["DashboardSecretOnlyWithPasswordAuthentication"]["Assertions"]
    assert _join_of_secrets(only_with["Assert"]["Fn::Not"][0]["Fn::Equals"][0]) == list(
        SECRET_PARAMETERS)
    assert "DashboardReaderSecretArn" not in sam["Parameters"]


def test_the_migrations_get_the_dashboards_login_tenant_viewers_and_patterns(
    cfn: dict[str, Any],
) -> None:
    properties = cfn["Resources"]["Migrations"]["Properties"]
    for name in ("DashboardDbUser", "DashboardTenantViewers", "DashboardOperators",
                 "DashboardViewers"):
        assert properties[name] == {"Fn::If": ["DashboardOn", {"Ref": name}, ""]}, name
    assert properties["DashboardDbSecretArn"] == {
        "Fn::If": ["DashboardUsesPassword", {"Ref": "DashboardDbSecretArn"}, ""]}
    secrets = next(s for s in statements_of(cfn["Resources"]["MigrationsFunctionRole"])
                   if "Fn::If" in s)["Fn::If"][1]["Resource"]
    assert secrets[-1] == {"Fn::If": ["DashboardUsesPassword", {"Ref": "DashboardDbSecretArn"},
                                      {"Ref": "AWS::NoValue"}]}


def test_the_map_at_the_top_of_the_template_names_headings_the_template_has() -> None:
    """The map of concerns is the newcomer's way in: every heading it quotes must be found
    below it, so a renamed section cannot leave the map pointing nowhere."""
    text = (ROOT / "template.yaml").read_text(encoding="utf-8")
    header = text.split("# Naming:", 1)[0]
    comment = " ".join(line.lstrip("#").strip() for line in header.splitlines()
                       if line.startswith("#"))
    quoted = re.findall(r'"([^"]+)"', comment)
    body = text[len(header):]

    assert len(quoted) >= 15
    assert [h for h in quoted if h not in " ".join(body.split())] == []
