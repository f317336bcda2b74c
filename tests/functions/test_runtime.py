"""leaseq_lambda.runtime: how the functions log in (DSN, Secrets Manager, RDS IAM token),
where their handlers come from, and what an execution environment keeps."""

from __future__ import annotations

import ast
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import boto3
import pytest
from leaseq import ConfigurationError, DatabaseError, EnqueueRequest, Registry, connect
from leaseq.store.duties import ProducerClient, ReaperClient, WorkerClient
from leaseq_lambda import runtime
from leaseq_lambda.context import LambdaDeadline, owner_id
from moto import mock_aws
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import Database
from tests.functions.conftest import load_event
from tests.library.support import jobs
from tests.support.fakes import FakeLambdaContext
from tests.support.postgres import WORKER, Conn

SECRET_NAME = "leaseq/runtime"


@pytest.fixture
def aws(lambda_env: pytest.MonkeyPatch) -> Iterator[None]:
    with mock_aws():
        yield


def _dsn_parts(db: Database) -> dict[str, Any]:
    parts = conninfo_to_dict(db.worker_dsn)
    return {"host": parts["host"], "port": int(parts.get("port") or 5432),
            "dbname": parts["dbname"]}


def _use_secret(env: pytest.MonkeyPatch, secret: dict[str, Any] | str) -> tuple[Any, str]:
    client = boto3.client("secretsmanager")
    value = secret if isinstance(secret, str) else json.dumps(secret)
    arn = client.create_secret(Name=SECRET_NAME, SecretString=value)["ARN"]
    env.delenv("DATABASE_URL")
    env.setenv("LEASEQ_DATABASE_SECRET_ARN", arn)
    env.setenv("LEASEQ_DB_SSLMODE", "disable")  # the test server has no TLS
    return client, arn


# Secrets Manager ---------------------------------------------------------------------------


def test_the_functions_log_in_with_a_secret_in_the_rds_shape(
        aws: None, lambda_env: pytest.MonkeyPatch, db: Database, enqueue_app: ModuleType,
        owner: Conn) -> None:
    # The test server trusts its roles, so any password is accepted.
    _use_secret(lambda_env, {"username": WORKER, "password": "from-the-secret",
                             "engine": "postgres", **_dsn_parts(db)})

    answer = enqueue_app.lambda_handler(load_event("enqueue_direct"), FakeLambdaContext())

    assert answer["created"] == 1
    assert len(jobs(owner)) == 1
    assert runtime.get().settings.database.secret_max_age_seconds == 300


def test_host_and_database_from_the_environment_win_over_the_secrets_own(
        aws: None, lambda_env: pytest.MonkeyPatch, db: Database,
        reaper_app: ModuleType) -> None:
    parts = _dsn_parts(db)
    # An RDS-managed secret names the instance; the functions must go through the proxy.
    _use_secret(lambda_env, {"username": WORKER, "password": "p", "host": "instance.invalid",
                             "port": parts["port"], "dbname": "not_this_one"})
    lambda_env.setenv("LEASEQ_DB_HOST", parts["host"])
    lambda_env.setenv("LEASEQ_DB_NAME", parts["dbname"])

    assert reaper_app.lambda_handler({}, FakeLambdaContext())["status"] == "ok"


def test_a_rotated_secret_is_read_again_when_the_cached_one_is_refused(
        aws: None, lambda_env: pytest.MonkeyPatch, db: Database,
        reaper_app: ModuleType) -> None:
    parts = _dsn_parts(db)
    client, arn = _use_secret(lambda_env, {"username": "retired_login", "password": "old",
                                           **parts})
    lambda_env.setenv("LEASEQ_SECRET_MAX_AGE_SECONDS", "3600")

    with pytest.raises(DatabaseError, match="retired_login"):
        reaper_app.lambda_handler({}, FakeLambdaContext())

    # Rotation: the secret now holds a working login, but the old one is still cached.
    client.put_secret_value(SecretId=arn, SecretString=json.dumps(
        {"username": WORKER, "password": "new", **parts}))

    assert reaper_app.lambda_handler({}, FakeLambdaContext())["status"] == "ok"


@pytest.mark.parametrize(("secret", "problem"), [
    ("not json at all", "is not JSON"),
    ('["a", "list"]', "must be a JSON object with username and password"),
    ({"username": WORKER}, "lacks password"),
])
def test_an_unusable_secret_is_a_configuration_error(
        aws: None, lambda_env: pytest.MonkeyPatch, db: Database, reaper_app: ModuleType,
        secret: dict[str, Any] | str, problem: str) -> None:
    if isinstance(secret, dict):
        secret = {**secret, **_dsn_parts(db)}
    _use_secret(lambda_env, secret)
    with pytest.raises(ConfigurationError, match=problem):
        reaper_app.lambda_handler({}, FakeLambdaContext())


def test_a_secret_that_cannot_be_read_is_a_configuration_error_naming_what_to_check(
        aws: None, lambda_env: pytest.MonkeyPatch, reaper_app: ModuleType) -> None:
    lambda_env.delenv("DATABASE_URL")
    lambda_env.setenv("LEASEQ_DATABASE_SECRET_ARN",
                      "arn:aws:secretsmanager:us-east-1:123456789012:secret:missing-AbCdEf")
    with pytest.raises(ConfigurationError, match="GetSecretValue permission"):
        reaper_app.lambda_handler({}, FakeLambdaContext())


# RDS IAM authentication ---------------------------------------------------------------------


class RecordingConnect:
    """A connect function that notes what it was asked, then opens a real connection
    (the test server cannot check IAM tokens, so it connects as the worker role)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.calls: list[dict[str, Any]] = []

    def __call__(self, dsn: str, **kwargs: Any) -> Any:
        self.calls.append({"dsn": dsn, **kwargs})
        return connect(self.db.worker_dsn, application_name=kwargs["application_name"])


def test_iam_auth_connects_with_a_fresh_token_per_connection_over_tls(
        aws: None, lambda_env: pytest.MonkeyPatch, db: Database, reaper_app: ModuleType,
        admin: Conn) -> None:
    lambda_env.delenv("DATABASE_URL")
    for key, value in {"LEASEQ_DB_HOST": "leaseq-proxy.proxy-abc.us-east-1.rds.amazonaws.com",
                       "LEASEQ_DB_PORT": "5432", "LEASEQ_DB_NAME": "leaseq",
                       "LEASEQ_DB_USER": "leaseq_runtime", "LEASEQ_DB_IAM_AUTH": "true"}.items():
        lambda_env.setenv(key, value)
    recording = RecordingConnect(db)
    runtime.reset(runtime.Dependencies(connect=recording))

    assert reaper_app.lambda_handler({}, FakeLambdaContext())["status"] == "ok"
    admin.execute("select pg_terminate_backend(%s)",
                  (runtime.get().client.connection.info.backend_pid,))
    assert reaper_app.lambda_handler({}, FakeLambdaContext())["status"] == "ok"

    assert len(recording.calls) == 2
    for call in recording.calls:
        token = call["password"]
        assert token.startswith("leaseq-proxy.proxy-abc.us-east-1.rds.amazonaws.com:5432/?")
        assert "Action=connect" in token
        assert "DBUser=leaseq_runtime" in token
        assert {k: call[k] for k in ("dsn", "host", "port", "dbname", "user", "sslmode")} == {
            "dsn": "", "host": "leaseq-proxy.proxy-abc.us-east-1.rds.amazonaws.com",
            "port": 5432, "dbname": "leaseq", "user": "leaseq_runtime",
            "sslmode": "verify-full"}  # an RDS Proxy host: its ACM certificate is verified
        assert Path(call["sslrootcert"]).is_file()  # against the system's bundle of roots
        assert call["application_name"] == "leaseq leaseq-test"


def test_iam_auth_through_a_hostaddr_signs_for_the_host_and_connects_to_the_address(
        aws: None, lambda_env: pytest.MonkeyPatch, db: Database, reaper_app: ModuleType) -> None:
    proxy = "leaseq-proxy.proxy-abc.us-east-1.rds.amazonaws.com"
    lambda_env.delenv("DATABASE_URL")
    for key, value in {"LEASEQ_DB_HOST": proxy, "LEASEQ_DB_PORT": "5432",
                       "LEASEQ_DB_HOSTADDR": "127.0.0.1", "LEASEQ_DB_HOSTADDR_PORT": "15432",
                       "LEASEQ_DB_NAME": "leaseq", "LEASEQ_DB_USER": "leaseq_runtime",
                       "LEASEQ_DB_IAM_AUTH": "true"}.items():
        lambda_env.setenv(key, value)
    recording = RecordingConnect(db)
    runtime.reset(runtime.Dependencies(connect=recording))

    assert reaper_app.lambda_handler({}, FakeLambdaContext())["status"] == "ok"

    (call,) = recording.calls
    # The token is for the proxy's own name and port; the connection goes to the forward.
    assert call["password"].startswith(f"{proxy}:5432/?")
    assert {k: call[k] for k in ("host", "hostaddr", "port", "sslmode")} == {
        "host": proxy, "hostaddr": "127.0.0.1", "port": 15432, "sslmode": "verify-full"}


def test_a_dsn_takes_precedence_and_is_used_as_given(
        lambda_env: pytest.MonkeyPatch, db: Database, reaper_app: ModuleType) -> None:
    lambda_env.setenv("LEASEQ_DATABASE_SECRET_ARN", "arn:unused")
    recording = RecordingConnect(db)
    runtime.reset(runtime.Dependencies(connect=recording))

    reaper_app.lambda_handler({}, FakeLambdaContext())

    assert recording.calls == [{"dsn": db.worker_dsn, "application_name": "leaseq leaseq-test"}]


# The oldest-ready metric ---------------------------------------------------------------------


def test_the_oldest_ready_age_sees_a_tenant_sorting_after_10000_others(
        lambda_env: pytest.MonkeyPatch, owner: Conn) -> None:
    """It read the first 10,000 tenants in tenant_id order and missed the ones after."""
    client = runtime.get().client
    for start in range(0, 10_000, 1000):
        client.enqueue_jobs([
            EnqueueRequest(tenant_id=uuid.UUID(int=n + 1), operation_key="young", kind="echo",
                           payload={})
            for n in range(start, start + 1000)])
    last = uuid.UUID("ffffffff-ffff-ffff-ffff-ffffffffffff")
    client.enqueue_jobs([EnqueueRequest(tenant_id=last, operation_key="old", kind="echo",
                                        payload={})])
    owner.execute("update app.jobs set available_at = clock_timestamp() - interval '1 day'"
                  " where tenant_id = %s", (last,))

    age = runtime.get().oldest_ready_age()

    assert 86_400 <= age < 86_400 + 60


def test_the_oldest_ready_age_is_zero_when_nothing_is_ready(
        lambda_env: pytest.MonkeyPatch) -> None:
    assert runtime.get().oldest_ready_age() == 0.0


# Handlers module ----------------------------------------------------------------------------


def test_the_handlers_module_may_name_another_attribute() -> None:
    registry = runtime.load_registry("tests.functions.alternate_handlers:jobs")
    assert registry.kinds == ["alternate.kind"]


def test_a_handlers_module_that_fails_to_import_is_reported_with_its_error() -> None:
    def failing(name: str) -> ModuleType:
        raise RuntimeError("boom at import")

    with pytest.raises(ConfigurationError, match="failed: RuntimeError: boom at import"):
        runtime.load_registry("billing.jobs", failing)


def test_a_registry_attribute_of_the_wrong_type_is_reported() -> None:
    fake = SimpleNamespace(registry={"email": print})
    with pytest.raises(ConfigurationError, match=r"found dict"):
        runtime.load_registry("billing.jobs", lambda name: fake)  # type: ignore[arg-type,return-value]


def test_the_handlers_module_is_imported_once_per_execution_environment(
        lambda_env: pytest.MonkeyPatch) -> None:
    imported: list[str] = []
    registry = Registry()
    registry.register("k", lambda payload, ctx: None)

    def importer(name: str) -> ModuleType:
        imported.append(name)
        return SimpleNamespace(registry=registry)  # type: ignore[return-value]

    runtime.reset(runtime.Dependencies(import_module=importer))
    first = runtime.get().worker("a:1")
    second = runtime.get().worker("a:2")

    assert imported == ["tests.functions.handlers"]
    assert first.registry is second.registry is registry
    assert (first.config.owner, second.config.owner) == ("a:1", "a:2")
    assert first.client is second.client


# Execution environment ----------------------------------------------------------------------


def test_reset_closes_the_cached_connection_and_the_next_get_builds_anew(
        lambda_env: pytest.MonkeyPatch) -> None:
    rt = runtime.get()
    rt.check()
    conn = rt.client.connection

    runtime.reset()

    assert conn.closed
    assert runtime.get() is not rt


def test_the_functions_client_replaces_a_connection_idle_past_leaseq_db_max_idle_seconds(
        lambda_env: pytest.MonkeyPatch, admin: Conn) -> None:
    """The variable reaches the client the functions use: a connection unused for longer
    is pinged before its next use, and one the server has cut is replaced."""
    lambda_env.setenv("LEASEQ_DB_MAX_IDLE_SECONDS", "0.05")
    rt = runtime.get()
    rt.check()
    first_pid = rt.client.connection.info.backend_pid
    cut = admin.execute("select pg_terminate_backend(%s) as done", (first_pid,)).fetchone()
    assert cut is not None
    assert cut["done"]
    time.sleep(0.1)  # idle past the setting

    rt.check()

    assert rt.client.reconnects == 2
    assert rt.client.connection.info.backend_pid != first_pid


def test_the_worker_owner_is_the_function_or_worker_id_and_the_request_id() -> None:
    context = FakeLambdaContext(function_name="leaseq-worker", aws_request_id="r-1")
    assert owner_id(context) == "leaseq-worker:r-1"
    assert owner_id(context, "blue") == "blue:r-1"
    request_id = str(uuid.uuid4())
    long = owner_id(FakeLambdaContext(aws_request_id=request_id), "x" * 500)
    assert len(long) == 200
    assert long.endswith(f":{request_id}")


def test_the_lambda_deadline_follows_the_contexts_remaining_time() -> None:
    assert 59.0 < LambdaDeadline(FakeLambdaContext(remaining_ms=60_000)).remaining() <= 60.0
    assert LambdaDeadline(FakeLambdaContext(remaining_ms=-5)).remaining() == 0.0


# One face per duty ----------------------------------------------------------------------------


def test_each_duty_gets_one_face_over_the_environments_one_client(
        lambda_env: pytest.MonkeyPatch) -> None:
    rt = runtime.get()

    faces = {type(face): face for face in
             (rt.producer_client(), rt.worker_client(), rt.reaper_client())}

    assert set(faces) == {ProducerClient, WorkerClient, ReaperClient}
    assert all(face.client is rt.client for face in faces.values())
    assert rt.producer_client() is rt.producer_client()
    assert not hasattr(rt.producer_client(), "claim_jobs")


HANDLER_FACES = {"enqueue": "producer_client", "worker": "worker_client",
                 "reaper": "reaper_client"}


@pytest.mark.parametrize(("handler", "face"), sorted(HANDLER_FACES.items()))
def test_a_functions_handler_reaches_the_queue_only_through_its_duty_face(
        handler: str, face: str) -> None:
    """A handler that read the runtime's all-duties ``client`` (or another duty's face)
    could call what its login is not granted; the reader would not see it."""
    source = (Path(runtime.__file__).parent / "handlers" / f"{handler}.py").read_text()
    used = {node.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute)
            and node.attr in {"client", *HANDLER_FACES.values()}}

    assert used == {face}
