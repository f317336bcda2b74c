"""What the functions tell operators: per-kind job metrics with bounded dimensions, the
correlation id from enqueue on every log line and metric of a job, a cold-start metric,
a failure metric before the error is re-raised, only JSON on stdout and stderr, and
X-Ray traces of the handler."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import pytest
from aws_lambda_powertools.metrics.provider import cold_start
from leaseq import (
    ClaimedJob,
    DatabaseUnavailableError,
    EnqueueRequest,
    JobRecord,
    JobState,
    QueueClient,
    connect,
)
from leaseq_lambda import runtime, telemetry

from tests.conftest import Database
from tests.functions.conftest import ROOT, Output, load_app, load_event
from tests.support.fakes import FakeLambdaContext

JOB_DOCUMENT = ("kind", "service")


def enqueue(app: ModuleType, event: str, request_id: str) -> None:
    answer = app.lambda_handler(load_event(event), FakeLambdaContext(
        function_name="leaseq-enqueue", aws_request_id=request_id))
    assert answer["rejected"] == 0, answer


def test_each_job_has_a_metric_document_by_kind_with_its_correlation_id(
        worker_app: ModuleType, enqueue_app: ModuleType, lambda_env: pytest.MonkeyPatch,
        read_output: Callable[[], Output]) -> None:
    lambda_env.setenv("LEASEQ_METRIC_KINDS", "2")  # charge_card and resize_image, by name
    enqueue(enqueue_app, "enqueue_batch", "req-batch")
    enqueue(enqueue_app, "enqueue_direct", "req-direct")
    read_output()

    worker_app.lambda_handler(load_event("worker_schedule"), FakeLambdaContext())

    out = read_output()
    documents = out.documents(JOB_DOCUMENT)
    assert len(documents) == 4
    finished = {line["job_id"]: line for line in out.messages("job finished")}
    by_kind: dict[str, list[str]] = {}
    for doc in documents:
        (directive,) = doc["_aws"]["CloudWatchMetrics"]
        assert {m["Name"] for m in directive["Metrics"]} == {
            "JobsSucceeded", "JobDuration", "QueueLag"}
        assert doc["JobsSucceeded"] == [1.0]
        assert "tenant_id" not in [d for ds in directive["Dimensions"] for d in ds]
        line = finished[doc["job_id"]]  # the metric leads to the job's log line
        assert (doc["correlation_id"], doc["tenant_id"], doc["attempt"]) == (
            line["correlation_id"], line["tenant_id"], 1)
        assert doc["JobDuration"] == [line["duration_ms"]]
        by_kind.setdefault(doc["kind"], []).append(line["kind"])
    assert by_kind == {"charge_card": ["charge_card"], "resize_image": ["resize_image"],
                       "other": ["send_welcome_email", "send_welcome_email"]}
    assert sorted(doc["correlation_id"] for doc in documents) == [
        "req-batch", "req-batch", "signup-4711", "upload-77"]
    # The totals the alarms watch keep the service dimension alone.
    assert out.metric("JobsSucceeded") == [4]
    assert out.metric("JobsSucceeded", JOB_DOCUMENT) == [1, 1, 1, 1]


def test_an_unknown_kind_is_counted_dead_under_other(
        worker_app: ModuleType, db: Database, read_output: Callable[[], Output]) -> None:
    client = QueueClient(lambda: connect(db.worker_dsn))
    client.enqueue_jobs([EnqueueRequest(tenant_id=uuid.uuid4(), operation_key="typo",
                                        kind="sned_email", payload={}, correlation_id="c-1")])
    client.close()
    read_output()

    worker_app.lambda_handler({}, FakeLambdaContext())

    out = read_output()
    (doc,) = out.documents(JOB_DOCUMENT)
    assert (doc["kind"], doc["JobsDead"], doc["correlation_id"]) == ("other", [1.0], "c-1")
    assert out.metric("JobsDead") == [1]


def test_at_log_level_warning_a_worker_logs_no_line_per_job_and_keeps_every_metric(
        lambda_env: pytest.MonkeyPatch, db: Database, read_output: Callable[[], Output]) -> None:
    # The template's LogLevel parameter (POWERTOOLS_LOG_LEVEL): the cheap setting for a busy
    # queue. Metric documents are printed, not logged, so no log level can drop them.
    lambda_env.setenv("POWERTOOLS_LOG_LEVEL", "WARNING")
    client = QueueClient(lambda: connect(db.worker_dsn))
    client.enqueue_jobs([
        EnqueueRequest(tenant_id=uuid.uuid4(), operation_key=f"ok-{i}", kind="charge_card",
                       payload={"order_id": f"o-{i}", "amount_cents": 100}) for i in range(2)
    ] + [EnqueueRequest(tenant_id=uuid.uuid4(), operation_key="typo", kind="sned_email",
                        payload={})])
    client.close()
    worker_app = load_app("worker")
    read_output()

    worker_app.lambda_handler(load_event("worker_schedule"), FakeLambdaContext())

    out = read_output()
    assert sorted(line["message"] for line in out.logs) == [
        "job finished: dead", "no handler registered for this kind"]
    assert len(out.documents(JOB_DOCUMENT)) == 3
    assert (out.metric("JobsSucceeded"), out.metric("JobsDead")) == ([2], [1])


@pytest.mark.parametrize("disabled", ["false", "true"])
def test_each_job_document_holds_only_its_own_job_even_with_metrics_disabled(
        disabled: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # POWERTOOLS_METRICS_DISABLED (or POWERTOOLS_DEV) makes a flush print nothing and keep
    # what it holds: a long-lived worker's document would grow with every job.
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", disabled)
    job_telemetry = telemetry.JobTelemetry(telemetry.make_logger(), telemetry.make_metrics(),
                                           telemetry.KindDimension(("a", "b"), 2))
    ready = datetime.now(UTC)
    capsys.readouterr()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "dimension already added" must not happen
        for i in range(250):
            job = ClaimedJob(id=uuid.uuid4(), tenant_id=uuid.uuid4(), operation_key=f"k-{i}",
                             kind="ab"[i % 2], payload={}, attempts=1, max_attempts=6,
                             available_at=ready, created_at=ready, lease_owner="w",
                             lease_token=uuid.uuid4(), lease_expires_at=ready)
            job_telemetry(JobRecord(job=job, outcome="succeeded", state=JobState.SUCCEEDED,
                                    duration=0.01, queue_lag=0.02))

    assert job_telemetry._job_metrics.metric_set == {}
    documents = [line for line in _lines(capsys.readouterr().out)
                 if "_aws" in line and "kind" in line]
    if disabled == "true":
        assert documents == []
    else:
        assert [(d["kind"], d["JobsSucceeded"]) for d in documents] == [
            ("ab"[i % 2], [1.0]) for i in range(250)]


def test_the_first_invocation_of_an_environment_emits_a_cold_start_metric(
        reaper_app: ModuleType, read_output: Callable[[], Output]) -> None:
    cold_start.is_cold_start = True  # a new execution environment
    context = FakeLambdaContext(function_name="leaseq-reaper")

    reaper_app.lambda_handler({}, context)
    reaper_app.lambda_handler({}, context)

    out = read_output()
    (doc,) = out.documents(("function_name", "service"))
    assert (doc["ColdStart"], doc["function_name"]) == ([1.0], "leaseq-reaper")


def test_the_enqueue_call_s_id_is_the_correlation_id_of_its_own_lines(
        enqueue_app: ModuleType, read_output: Callable[[], Output]) -> None:
    read_output()
    enqueue(enqueue_app, "enqueue_batch", "req-77")

    logs = read_output().logs
    (summary,) = [line for line in logs if line["message"] == "enqueue finished"]
    assert summary["correlation_id"] == "req-77"
    items = {line["kind"]: line["correlation_id"] for line in logs
             if line["message"] == "job enqueued"}
    assert items == {"charge_card": "req-77", "send_welcome_email": "req-77",
                     "resize_image": "upload-77"}  # an item's own id wins


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("app_name", ["worker", "reaper", "enqueue"])
def test_a_failed_invocation_counts_itself_re_raises_and_writes_only_json(
        lambda_env: pytest.MonkeyPatch, app_name: str, capfd: pytest.CaptureFixture[str]
        ) -> None:
    from tests.functions.conftest import load_app

    lambda_env.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    app = load_app(app_name)
    event = load_event({"worker": "worker_schedule", "reaper": "reaper_schedule",
                        "enqueue": "enqueue_direct"}[app_name])
    capfd.readouterr()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # A ResourceWarning here is the garbage collector finalising another test's
        # object (a pipe of a process it ran), not a line this invocation writes.
        warnings.simplefilter("ignore", ResourceWarning)
        with pytest.raises(DatabaseUnavailableError):
            app.lambda_handler(event, FakeLambdaContext())

    assert [str(w.message) for w in caught] == []  # "No application metrics" would be one
    captured = capfd.readouterr()
    out, err = _lines(captured.out), _lines(captured.err)  # each line must parse as JSON
    assert err == []
    emf = [doc for doc in out if "_aws" in doc]
    (totals,) = [doc for doc in emf if doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"]
                 == [["service"]]]
    assert (totals["InvocationFailed"], totals["error"]) == ([1.0], "DatabaseUnavailableError")
    (by_error,) = [doc for doc in emf if "error" in
                   doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]]
    assert by_error["InvocationFailed"] == [1.0]
    assert by_error["error"] == "DatabaseUnavailableError"
    assert any(line.get("level") == "ERROR" for line in out if "_aws" not in line)


def test_an_unexpected_error_is_logged_with_its_traceback_and_counted(
        worker_app: ModuleType, monkeypatch: pytest.MonkeyPatch,
        read_output: Callable[[], Output]) -> None:
    def broken() -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(runtime, "get", broken)

    with pytest.raises(RuntimeError, match="a bug"):
        worker_app.lambda_handler({}, FakeLambdaContext())

    out = read_output()
    (line,) = out.messages("invocation failed: unexpected error")
    assert (line["level"], line["error_type"]) == ("ERROR", "RuntimeError")
    assert "Traceback" in line["exception"]
    assert out.metric("InvocationFailed") == [1]
    assert out.metric("InvocationFailed", ("error", "service")) == [1]


_TRACED = """
import json, sys
from tests.functions.conftest import load_app
from tests.support.fakes import FakeLambdaContext
app = load_app("worker")
print(json.dumps(app.lambda_handler({}, FakeLambdaContext())), file=sys.stderr)
"""


def test_in_lambda_with_tracing_on_the_handler_is_traced_with_its_counts(
        db: Database) -> None:
    # A fresh process: Powertools' Tracer keeps its configuration for the whole process.
    daemon = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    daemon.bind(("127.0.0.1", 0))
    daemon.settimeout(10)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LEASEQ_", "POWERTOOLS_"))}
    env.update({
        "DATABASE_URL": db.worker_dsn, "LEASEQ_HANDLERS": "tests.functions.handlers",
        "POWERTOOLS_SERVICE_NAME": "leaseq", "POWERTOOLS_METRICS_NAMESPACE": "Leaseq",
        "AWS_LAMBDA_FUNCTION_NAME": "leaseq-worker", "LAMBDA_TASK_ROOT": str(ROOT),
        "AWS_XRAY_DAEMON_ADDRESS": f"127.0.0.1:{daemon.getsockname()[1]}",
        "_X_AMZN_TRACE_ID": "Root=1-5759e988-bd862e3fe1be46a994272793;"
                            "Parent=53995c3f42cd8ad8;Sampled=1",
        "AWS_DEFAULT_REGION": "us-east-1", "PYTHONPATH": str(ROOT)})
    try:
        done = subprocess.run([sys.executable, "-c", _TRACED], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        datagram, _ = daemon.recvfrom(65_535)
    finally:
        daemon.close()
    header, body = datagram.decode().split("\n", 1)
    assert json.loads(header) == {"format": "json", "version": 1}
    segment = json.loads(body)
    assert segment["name"] == "## lambda_handler"
    assert segment["trace_id"] == "1-5759e988-bd862e3fe1be46a994272793"
    annotations = segment["annotations"]
    assert (annotations["Service"], annotations["ColdStart"]) == ("leaseq", True)
    assert (annotations["claimed"], annotations["stopped"]) == (0, "queue_empty")
