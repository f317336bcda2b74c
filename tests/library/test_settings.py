"""Settings come from the environment once, at the edge, and explain what is wrong."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from leaseq import ConfigurationError, LeaseqSettings

DSN = "postgresql://worker@db.internal/leaseq"


def test_a_database_url_alone_is_enough_and_everything_else_has_a_default() -> None:
    settings = LeaseqSettings.from_env({"DATABASE_URL": DSN})
    assert settings.database.url is not None
    assert settings.database.url.get_secret_value() == DSN
    assert (settings.worker.batch_size, settings.worker.lease_margin_seconds,
            settings.worker.job_timeout_seconds) == (10, 5.0, 30.0)
    assert settings.worker.handlers_module is None
    assert settings.reaper.limit == 1000
    assert settings.database.sslmode == "require"


def test_every_documented_variable_is_read(tmp_path: Path) -> None:
    bundle = tmp_path / "global-bundle.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    settings = LeaseqSettings.from_env({
        "LEASEQ_DB_HOST": "proxy.internal", "LEASEQ_DB_PORT": "6432", "LEASEQ_DB_NAME": "queue",
        "LEASEQ_DB_USER": "leaseq_worker", "LEASEQ_DB_IAM_AUTH": "true",
        "LEASEQ_DB_SSLMODE": "verify-full", "LEASEQ_DB_SSLROOTCERT": str(bundle),
        "LEASEQ_DATABASE_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:1:secret:x",
        "LEASEQ_SECRET_MAX_AGE_SECONDS": "60", "LEASEQ_HANDLERS": "billing.jobs",
        "LEASEQ_BATCH_SIZE": "25", "LEASEQ_LEASE_MARGIN_SECONDS": "3",
        "LEASEQ_JOB_TIMEOUT_SECONDS": "12.5", "LEASEQ_REAPER_LIMIT": "500",
        "LEASEQ_RETENTION_DAYS": "2.5",
        "LEASEQ_WORKER_ID": "blue", "UNRELATED": "ignored",
    })
    db, worker = settings.database, settings.worker
    assert (db.host, db.port, db.name, db.user, db.iam_auth, db.sslmode) == (
        "proxy.internal", 6432, "queue", "leaseq_worker", True, "verify-full")
    assert db.tls.params() == {"sslmode": "verify-full", "sslrootcert": str(bundle)}
    assert (db.secret_arn, db.secret_max_age_seconds) == (
        "arn:aws:secretsmanager:us-east-1:1:secret:x", 60)
    assert (worker.handlers_module, worker.batch_size, worker.lease_margin_seconds,
            worker.job_timeout_seconds, worker.worker_id) == ("billing.jobs", 25, 3.0, 12.5, "blue")
    assert (settings.reaper.limit, settings.reaper.retention) == (500, timedelta(days=2.5))


def test_finished_jobs_are_kept_two_weeks_unless_told_otherwise() -> None:
    assert LeaseqSettings.from_env({"DATABASE_URL": DSN}).reaper.retention == timedelta(days=14)
    kept = LeaseqSettings.from_env({"DATABASE_URL": DSN, "LEASEQ_RETENTION_DAYS": "0"})
    assert kept.reaper.retention is None


def test_empty_variables_count_as_unset() -> None:
    settings = LeaseqSettings.from_env({"DATABASE_URL": DSN, "LEASEQ_BATCH_SIZE": "",
                                        "LEASEQ_HANDLERS": ""})
    assert (settings.worker.batch_size, settings.worker.handlers_module) == (10, None)


def test_no_way_to_the_database_is_a_configuration_error_naming_the_options() -> None:
    with pytest.raises(ConfigurationError, match="DATABASE_URL, or LEASEQ_DATABASE_SECRET_ARN"):
        LeaseqSettings.from_env({})


@pytest.mark.parametrize(("env", "problem"), [
    ({"LEASEQ_BATCH_SIZE": "0"}, "LEASEQ_BATCH_SIZE: Input should be greater than or equal to 1"),
    ({"LEASEQ_BATCH_SIZE": "ten"}, "LEASEQ_BATCH_SIZE: Input should be a valid integer"),
    ({"LEASEQ_REAPER_LIMIT": "10001"}, "LEASEQ_REAPER_LIMIT: Input should be less than"),
    ({"LEASEQ_RETENTION_DAYS": "-1"}, "LEASEQ_RETENTION_DAYS: Input should be greater than"),
    ({"LEASEQ_LEASE_MARGIN_SECONDS": "0.1"}, "LEASEQ_LEASE_MARGIN_SECONDS"),
    ({"LEASEQ_JOB_TIMEOUT_SECONDS": "-1"}, "LEASEQ_JOB_TIMEOUT_SECONDS"),
    ({"LEASEQ_DB_SSLMODE": "on"}, "LEASEQ_DB_SSLMODE"),
    ({"LEASEQ_DB_PORT": "70000"}, "LEASEQ_DB_PORT"),
    ({"LEASEQ_SECRET_MAX_AGE_SECONDS": "-5"}, "LEASEQ_SECRET_MAX_AGE_SECONDS"),
])
def test_an_invalid_value_is_a_configuration_error_naming_the_variable(
        env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        LeaseqSettings.from_env({"DATABASE_URL": DSN, **env})


def test_iam_auth_needs_host_user_and_database_name() -> None:
    with pytest.raises(ConfigurationError, match="needs LEASEQ_DB_HOST, LEASEQ_DB_USER"):
        LeaseqSettings.from_env({"LEASEQ_DB_HOST": "proxy", "LEASEQ_DB_IAM_AUTH": "true"})


def test_iam_auth_refuses_a_connection_without_tls() -> None:
    with pytest.raises(ConfigurationError, match="needs TLS"):
        LeaseqSettings.from_env({"LEASEQ_DB_HOST": "proxy", "LEASEQ_DB_USER": "u",
                                 "LEASEQ_DB_NAME": "d", "LEASEQ_DB_IAM_AUTH": "true",
                                 "LEASEQ_DB_SSLMODE": "prefer"})


def test_the_error_message_never_echoes_a_password() -> None:
    with pytest.raises(ConfigurationError) as caught:
        LeaseqSettings.from_env({"DATABASE_URL": "postgresql://u:hunter2@h/d",
                                 "LEASEQ_BATCH_SIZE": "0"})
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(("env", "both"), [
    ({"LEASEQ_RETRY_BASE_SECONDS": "60", "LEASEQ_RETRY_MAX_SECONDS": "10"},
     ("LEASEQ_RETRY_MAX_SECONDS (10) is less than LEASEQ_RETRY_BASE_SECONDS (60)",)),
    ({"LEASEQ_POLL_MIN_SECONDS": "2", "LEASEQ_POLL_MAX_SECONDS": "1"},
     ("LEASEQ_POLL_MAX_SECONDS (1) is less than LEASEQ_POLL_MIN_SECONDS (2)",)),
    ({"LEASEQ_WORKER_TIMEOUT_SECONDS": "20"},
     ("LEASEQ_WORKER_TIMEOUT_SECONDS (20 s) cannot run a single job",
      "LEASEQ_JOB_TIMEOUT_SECONDS (30 s)", "LEASEQ_LEASE_MARGIN_SECONDS (5 s)")),
])
def test_contradictory_worker_settings_are_refused_naming_both_never_repaired(
        env: dict[str, str], both: tuple[str, ...]) -> None:
    with pytest.raises(ConfigurationError) as refused:
        LeaseqSettings.from_env({"DATABASE_URL": DSN, **env})
    for text in both:
        assert text in refused.value.message


def test_worker_settings_take_their_defaults_and_bounds_from_worker_config() -> None:
    from leaseq import WorkerConfig, WorkerSettings

    settings = LeaseqSettings.from_env({"DATABASE_URL": DSN}).worker
    config = WorkerConfig(owner="w")
    values = settings.config_values()
    for key in ("batch_size", "lease_margin", "job_timeout", "max_lease", "concurrency",
                "record_interval", "poll_min", "poll_max", "poll_idle", "worker_timeout",
                "loop_stall"):
        assert values[key] == getattr(config, key), key
    assert (values["retry_base"], values["retry_max"]) == (
        config.retry.base_delay, config.retry.max_delay)
    assert len(WorkerSettings.CONFIG_FIELDS) == len(values)
    # One lower bound for the lease margin, wherever it is set.
    with pytest.raises(ConfigurationError, match="LEASEQ_LEASE_MARGIN_SECONDS"):
        LeaseqSettings.from_env({"DATABASE_URL": DSN, "LEASEQ_LEASE_MARGIN_SECONDS": "0.4"})
    with pytest.raises(ConfigurationError, match=r"lease_margin must be at least 0\.5"):
        WorkerConfig(owner="w", lease_margin=0.4)
    LeaseqSettings.from_env({"DATABASE_URL": DSN, "LEASEQ_LEASE_MARGIN_SECONDS": "0.5"})
    WorkerConfig(owner="w", lease_margin=0.5)


def test_worker_config_refuses_contradictions_with_both_names() -> None:
    from leaseq import RetryPolicy, WorkerConfig

    with pytest.raises(ConfigurationError, match=r"poll_max \(0.05\) is less than poll_min"):
        WorkerConfig(owner="w", poll_min=0.1, poll_max=0.05)
    with pytest.raises(ConfigurationError, match=r"worker_timeout \(30 s\) cannot run"):
        WorkerConfig(owner="w", worker_timeout=30)
    with pytest.raises(ConfigurationError, match="concurrency must be at least 1"):
        WorkerConfig(owner="w", concurrency=0)
    assert WorkerConfig(owner="w", worker_timeout=36, retry=RetryPolicy()).worker_timeout == 36


def test_the_new_worker_variables_are_read() -> None:
    worker = LeaseqSettings.from_env({
        "DATABASE_URL": DSN, "LEASEQ_WORKER_CONCURRENCY": "50",
        "LEASEQ_RECORD_INTERVAL_SECONDS": "0.5", "LEASEQ_POLL_MIN_SECONDS": "0.05",
        "LEASEQ_POLL_MAX_SECONDS": "2", "LEASEQ_POLL_IDLE_SECONDS": "30",
        "LEASEQ_WORKER_TIMEOUT_SECONDS": "120", "LEASEQ_LOOP_STALL_SECONDS": "0.25",
    }).worker
    assert (worker.concurrency, worker.record_interval_seconds, worker.poll_min_seconds,
            worker.poll_max_seconds, worker.poll_idle_seconds, worker.worker_timeout_seconds,
            worker.loop_stall_seconds) == (50, 0.5, 0.05, 2.0, 30.0, 120.0, 0.25)


def test_the_kind_filter_is_comma_separated_kinds_and_reaches_the_worker_config() -> None:
    from leaseq import WorkerConfig, WorkerSettings

    worker = LeaseqSettings.from_env({
        "DATABASE_URL": DSN, "LEASEQ_KINDS": "report.build, invoice.render ,x"}).worker
    main = LeaseqSettings.from_env({"DATABASE_URL": DSN,
                                    "LEASEQ_EXCLUDE_KINDS": "report.build"}).worker

    assert (worker.kinds, worker.exclude_kinds) == (("report.build", "invoice.render", "x"), None)
    assert (main.kinds, main.exclude_kinds) == (None, ("report.build",))
    values = {k: v for k, v in worker.config_values().items()
              if k not in ("retry_base", "retry_max")}
    config = WorkerConfig(owner="w", setting_names=WorkerSettings.setting_names(), **values)
    assert config.kinds == ("report.build", "invoice.render", "x")
    assert (config.claims("x"), config.claims("send_receipt")) == (True, False)
    assert LeaseqSettings.from_env({"DATABASE_URL": DSN}).worker.kinds is None


@pytest.mark.parametrize(("value", "problem"), [
    ("report.build,,x", "kind 2 of 'report.build,,x' is empty: separate kinds with single commas"),
    ("report.build,", "kind 2 of 'report.build,' is empty"),
    (" , x", "kind 1 of ' , x' is empty"),
    (",".join(f"k{n}" for n in range(101)), "must name 1 to 100 kinds (got 101)"),
    ("x," + "k" * 129, "kind 2 ('kkkk"),
    ("x,\u200b", "kind 2 ('\\u200b') is not a job kind"),  # shown escaped: it is invisible
])
@pytest.mark.parametrize("variable", ["LEASEQ_KINDS", "LEASEQ_EXCLUDE_KINDS"])
def test_a_kind_filter_that_is_not_a_list_of_kinds_is_refused_naming_the_variable(
        variable: str, value: str, problem: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        LeaseqSettings.from_env({"DATABASE_URL": DSN, variable: value})
    assert f"{variable}: " in refused.value.message
    assert problem in refused.value.message


def test_the_kinds_and_the_kinds_to_leave_cannot_both_be_set() -> None:
    from leaseq import WorkerConfig

    with pytest.raises(ConfigurationError) as refused:
        LeaseqSettings.from_env({"DATABASE_URL": DSN, "LEASEQ_KINDS": "a",
                                 "LEASEQ_EXCLUDE_KINDS": "b"})
    assert "LEASEQ_KINDS and LEASEQ_EXCLUDE_KINDS cannot both be set" in refused.value.message
    with pytest.raises(ConfigurationError, match="kinds and exclude_kinds cannot both be set"):
        WorkerConfig(owner="w", kinds=("a",), exclude_kinds=("b",))


@pytest.mark.parametrize(("fields", "problem"), [
    ({"kinds": ()}, "kinds must name 1 to 100 kinds (got 0); leave it unset for every kind"),
    ({"kinds": "report.build"}, "kinds must be a list of job kinds (got 'report.build')"),
    ({"exclude_kinds": ["a", " "]}, "exclude_kinds: kind 2 (' ') is not a job kind"),
    ({"exclude_kinds": ["a", 7]}, "exclude_kinds: kind 2 (7) is not a job kind"),
])
def test_worker_config_refuses_a_kind_filter_that_is_not_a_list_of_kinds(
        fields: dict[str, object], problem: str) -> None:
    from leaseq import WorkerConfig

    with pytest.raises(ConfigurationError) as refused:
        WorkerConfig(owner="w", **fields)  # type: ignore[arg-type]
    assert problem in refused.value.message


def test_worker_config_keeps_a_kind_list_as_a_tuple() -> None:
    from leaseq import WorkerConfig

    config = WorkerConfig(owner="w", exclude_kinds=["a", "b"])  # type: ignore[arg-type]
    assert config.exclude_kinds == ("a", "b")
    assert (config.claims("a"), config.claims("c")) == (False, True)
    assert WorkerConfig(owner="w").claims("anything")


def test_a_hostaddr_is_an_ip_address_for_the_configured_host_with_an_optional_port_of_its_own(
) -> None:
    base = {"LEASEQ_DB_HOST": "leaseq.proxy-abc.eu-west-1.rds.amazonaws.com",
            "LEASEQ_DB_USER": "u", "LEASEQ_DB_NAME": "leaseq", "LEASEQ_DB_IAM_AUTH": "true"}
    db = LeaseqSettings.from_env({**base, "LEASEQ_DB_HOSTADDR": "127.0.0.1",
                                  "LEASEQ_DB_HOSTADDR_PORT": "15432"}).database

    assert db.address_of(base["LEASEQ_DB_HOST"], db.port) == {
        "host": base["LEASEQ_DB_HOST"], "hostaddr": "127.0.0.1", "port": 15432}
    # Another host (one a secret names) is reached as it is.
    assert db.address_of("other.example", 5432) == {"host": "other.example", "port": 5432}
    plain = LeaseqSettings.from_env(base).database
    assert plain.address_of(base["LEASEQ_DB_HOST"], 5432) == {
        "host": base["LEASEQ_DB_HOST"], "port": 5432}
    for bad, named in [
        ({**base, "LEASEQ_DB_HOSTADDR": "localhost"}, "LEASEQ_DB_HOSTADDR"),
        ({**base, "LEASEQ_DB_HOSTADDR_PORT": "15432"}, "set LEASEQ_DB_HOSTADDR too"),
        ({"DATABASE_URL": "postgresql://u@h/d", "LEASEQ_DB_HOSTADDR": "127.0.0.1"},
         "put hostaddr in the URL"),
    ]:
        with pytest.raises(ConfigurationError, match=named):
            LeaseqSettings.from_env(bad)


def test_the_sync_limit_is_read_from_its_variable_and_checked_against_the_concurrency() -> None:
    from leaseq.settings import WorkerSettings

    values = WorkerSettings.model_validate({"LEASEQ_WORKER_CONCURRENCY": "10",
                                            "LEASEQ_SYNC_CONCURRENCY": "1"}).config_values()
    assert (values["concurrency"], values["sync_concurrency"]) == (10, 1)
    assert WorkerSettings.model_validate({}).config_values()["sync_concurrency"] is None
    with pytest.raises(ConfigurationError, match="LEASEQ_SYNC_CONCURRENCY"):
        LeaseqSettings.from_env({"DATABASE_URL": "postgresql://u@h/d",
                                 "LEASEQ_WORKER_CONCURRENCY": "2",
                                 "LEASEQ_SYNC_CONCURRENCY": "3"})
