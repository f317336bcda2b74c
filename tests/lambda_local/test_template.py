"""Reading template.yaml: short tags, intrinsics, Globals, what is left to AWS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from leaseq_lambda_local.overrides import function_variables
from leaseq_lambda_local.template import TemplateError, load_template, load_yaml, rate_seconds

from tests.lambda_local.conftest import REPO


def test_the_real_template_gives_each_function_its_lambda_settings() -> None:
    functions = load_template(REPO / "template.yaml").functions

    worker = functions["WorkerFunction"]
    assert (worker.handler, worker.code_dir) == ("app.lambda_handler", REPO / "functions/worker")
    assert (worker.timeout_seconds, worker.memory_mb, worker.reserved_concurrency) == (60, 512, 5)
    assert (worker.max_retry_attempts, worker.max_event_age_seconds) == (0, 60)
    # FunctionName !Sub ${AWS::StackName}-worker: the name fan-out and wake invoke it by.
    assert worker.aliases == {"leaseq-local-worker"}
    assert worker.environment["LEASEQ_WORKER_FUNCTION"] == "leaseq-local-worker"
    assert worker.environment["LEASEQ_MAX_WORKERS"] == "4"
    (tick,) = worker.schedules
    assert (tick.kind, tick.expression, tick.period_seconds, tick.enabled) == (
        "ScheduleV2", "rate(1 minute)", 60, True)
    assert worker.environment["POWERTOOLS_SERVICE_NAME"] == "leaseq"  # from Globals
    assert worker.environment["LEASEQ_DB_IAM_AUTH"] == "true"  # a condition, evaluated
    assert worker.unresolved_environment == {"LEASEQ_DB_HOST": "!GetAtt DatabaseProxy.Endpoint"}
    assert "LEASEQ_HANDLERS" not in worker.environment  # !If to AWS::NoValue: removed
    enqueue = functions["EnqueueFunction"]
    assert (enqueue.max_retry_attempts, enqueue.max_event_age_seconds, enqueue.schedules) == (
        2, 3600, ())
    assert enqueue.ignored_events == ("EnqueueEvent (EventBridgeRule)",)
    # !Ref WorkerFunction: the worker's local name, which the service answers to as well.
    assert enqueue.environment["LEASEQ_WORKER_FUNCTION"] == "WorkerFunction"
    assert functions["MigrationsFunction"].custom_resource_provider
    assert not worker.custom_resource_provider
    # The CA bundles' layer holds no Python; on the path it changes nothing.
    assert load_template(REPO / "template.yaml").layer_dirs == (
        REPO / "certificates", REPO / "layer")


def test_parameter_overrides_flow_through_conditions_and_refs() -> None:
    functions = load_template(REPO / "template.yaml", {
        "WorkerReservedConcurrency": "0", "WorkerTimeoutSeconds": "120",
        "HandlersModule": "shop.handlers", "SchedulesState": "DISABLED"}).functions

    worker = functions["WorkerFunction"]
    assert worker.reserved_concurrency is None  # ReserveWorker false: AWS::NoValue
    assert worker.timeout_seconds == 120
    assert worker.environment["LEASEQ_HANDLERS"] == "shop.handlers"
    assert not worker.schedules[0].enabled
    with pytest.raises(TemplateError, match="NoSuchParameter"):
        load_template(REPO / "template.yaml", {"NoSuchParameter": "1"})


def test_short_tags_read_as_their_long_forms() -> None:
    document = load_yaml(
        "a: !Ref P\nb: !GetAtt Res.Attr.Deep\nc: !Sub 'x-${P}'\n"
        "d: !If [Cond, 1, 2]\ne: !Join [',', [!Ref P, b]]\nf: !Select [0, !Split [',', 'x,y']]\n")

    assert document == {
        "a": {"Ref": "P"}, "b": {"Fn::GetAtt": ["Res", "Attr.Deep"]}, "c": {"Fn::Sub": "x-${P}"},
        "d": {"Fn::If": ["Cond", 1, 2]}, "e": {"Fn::Join": [",", [{"Ref": "P"}, "b"]]},
        "f": {"Fn::Select": [0, {"Fn::Split": [",", "x,y"]}]}}


def test_intrinsics_resolve_where_the_template_alone_decides(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "t.yaml").write_text("""
Parameters:
  Stage: {Type: String, Default: dev}
  Names: {Type: CommaDelimitedList, Default: 'a,b'}
Conditions:
  IsDev: !Equals [!Ref Stage, dev]
  NotDev: !Not [!Condition IsDev]
Resources:
  Other:
    Type: AWS::Serverless::Function
    Properties: {Runtime: python3.12, Handler: app.h, CodeUri: code/}
  Fn:
    Type: AWS::Serverless::Function
    Properties:
      Runtime: python3.12
      Handler: app.h
      CodeUri: code/
      Environment:
        Variables:
          SUB: !Sub '${AWS::Region}/${Stage}/${Other}/${!Literal}'
          ARN: !GetAtt Other.Arn
          PICK: !Select [1, !Ref Names]
          JOINED: !Join ['-', [!Ref Stage, !If [NotDev, prod, dev]]]
          AWS_ONLY: !GetAtt Queue.Arn
          FLAG: true
          NUMBER: 5
  Skipped:
    Type: AWS::Serverless::Function
    Condition: NotDev
    Properties: {Runtime: python3.12, Handler: app.h, CodeUri: code/}
""")
    template = load_template(tmp_path / "t.yaml", region="eu-west-1", account="111122223333")

    fn = template.functions["Fn"]
    assert fn.environment == {
        "SUB": "eu-west-1/dev/Other/${Literal}",
        "ARN": "arn:aws:lambda:eu-west-1:111122223333:function:Other",
        "PICK": "b", "JOINED": "dev-dev", "FLAG": "true", "NUMBER": "5"}
    assert fn.unresolved_environment == {"AWS_ONLY": "!GetAtt Queue.Arn"}
    assert (fn.timeout_seconds, fn.memory_mb, fn.max_retry_attempts) == (3, 128, 2)
    assert sorted(template.functions) == ["Fn", "Other"]  # Skipped's condition is false


@pytest.mark.parametrize(("problem", "message"), [
    ("Runtime: nodejs20.x\n      Handler: app.h\n      CodeUri: code/", "only Python"),
    ("Runtime: python3.12\n      Handler: app.h\n      CodeUri: s3://b/k.zip", "local folder"),
    ("Runtime: python3.12\n      Handler: apph\n      CodeUri: code/", "module.function"),
])
def test_a_function_that_cannot_run_locally_is_refused_with_the_reason(
    tmp_path: Path, problem: str, message: str,
) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "t.yaml").write_text(
        f"Resources:\n  Fn:\n    Type: AWS::Serverless::Function\n    Properties:\n"
        f"      {problem}\n")

    with pytest.raises(TemplateError, match=message):
        load_template(tmp_path / "t.yaml")


def test_rates_are_read_and_cron_is_left_unfired() -> None:
    assert [rate_seconds(e) for e in ("rate(1 minute)", "rate(5 minutes)", "rate(2 hours)",
                                      "rate(1 day)", "cron(0 12 * * ? *)")] == [
        60, 300, 7200, 86400, None]


def test_local_overrides_replace_every_database_variable_and_add_explicit_ones() -> None:
    functions = load_template(REPO / "template.yaml").functions
    env_vars = {"Parameters": {"TRACE": "1"}, "WorkerFunction": {"LEASEQ_BATCH_SIZE": "3"}}

    worker, notes = function_variables(functions["WorkerFunction"], database_url="dsn-worker",
                                       owner_database_url="dsn-owner", handlers="h.mod",
                                       env_vars=env_vars)
    owner, _ = function_variables(functions["MigrationsFunction"], database_url="dsn-worker",
                                  owner_database_url="dsn-owner", handlers="h.mod")
    untouched, left = function_variables(functions["ReaperFunction"])

    assert {k: worker[k] for k in ("DATABASE_URL", "LEASEQ_HANDLERS", "TRACE",
                                   "LEASEQ_BATCH_SIZE")} == {
        "DATABASE_URL": "dsn-worker", "LEASEQ_HANDLERS": "h.mod", "TRACE": "1",
        "LEASEQ_BATCH_SIZE": "3"}
    assert not [k for k in worker if k.startswith("LEASEQ_DB_")]
    assert owner["DATABASE_URL"] == "dsn-owner"
    assert "LEASEQ_HANDLERS" not in owner
    assert len(notes) == 3
    assert "DATABASE_URL" not in untouched
    assert left == ["LEASEQ_DB_HOST left out: !GetAtt DatabaseProxy.Endpoint exists only in AWS"]
    assert json.dumps(worker)  # plain strings


def test_the_real_template_reads_with_every_short_tag_its_rules_use() -> None:
    """The Rules' functions (!Contains, !EachMemberIn, ...) are read, never evaluated."""
    from leaseq_lambda_local.template import load_yaml

    document = load_yaml((REPO / "template.yaml").read_text(encoding="utf-8"))

    rules = document["Rules"]
    assert "WorkerTimeoutFitsTheDefaultJobTimeout" in rules
    assertion = rules["WorkerTimeoutFitsTheDefaultJobTimeout"]["Assertions"][0]["Assert"]
    assert "Fn::Contains" in assertion["Fn::Not"][0]
