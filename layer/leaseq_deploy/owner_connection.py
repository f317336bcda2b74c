"""Where the schema owner's credentials come from, and how its connection is checked.

In AWS the owner is the RDS master user, whose RDS-managed secret holds only ``username``
and ``password``; host, port and database name come from the function's environment
(``LEASEQ_DB_HOST``, ``LEASEQ_DB_PORT``, ``LEASEQ_DB_NAME``), and a secret that carries them
too fills what the environment leaves out. ``DATABASE_URL`` (a plain DSN) short-circuits all
of it for local runs.

The owner connects directly to the database, never through RDS Proxy, with the most
powerful login of the stack, so its TLS follows the runtime's rules (leaseq.store.tls): over a
network the server is verified (``verify-full`` against ``LEASEQ_DB_SSLROOTCERT``, which the
template sets to the RDS CA bundle of the certificates layer) or the connection is refused
before anything is sent, unless the deployer chose ``DbSslMode=require-unverified``, which
is logged as a warning. A refusal names the template parameters as well as the variables.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, get_args

from leaseq.base.errors import ConfigurationError
from leaseq.settings import DatabaseSettings, variable
from leaseq.store.tls import SslSetting, choose_tls
from psycopg.conninfo import make_conninfo

#: The variables the owner's connection reads, named where the functions' database settings
#: declare them: the same names mean the same thing to the migrations and to every function.
VARIABLES = {field: variable(DatabaseSettings, field) for field in (
    "url", "secret_arn", "host", "name", "port", "sslmode", "sslrootcert")}

#: Reads a Secrets Manager secret (JSON) by ARN.
SecretReader = Callable[[str], Mapping[str, Any]]

#: Where a deployer changes the owner's TLS: the template parameters behind the variables.
IN_THE_STACK = (
    "In the stack these are the parameters DbSslRootCert (LEASEQ_DB_SSLROOTCERT; its "
    "default, /opt/rds/global-bundle.pem, is the RDS CA bundle the certificates layer is "
    "built with) and DbSslMode (LEASEQ_DB_SSLMODE; require-unverified connects without "
    "checking the server, as the RDS master user: not recommended)")


def secrets_manager_reader(client: Any = None) -> SecretReader:
    """A reader backed by boto3 (the Lambda runtime provides it; moto stands in for tests)."""

    def read(secret_arn: str) -> Mapping[str, Any]:
        nonlocal client
        if client is None:
            import boto3

            client = boto3.client("secretsmanager")
        value = client.get_secret_value(SecretId=secret_arn)
        document = json.loads(value["SecretString"])
        if not isinstance(document, dict):
            raise ConfigurationError(f"secret {secret_arn} is not a JSON object")
        return document

    return read


def owner_dsn_from_environment(environ: Mapping[str, str], read_secret: SecretReader) -> str:
    """Build the schema owner's DSN; never logs or returns the password elsewhere."""
    url = environ.get(VARIABLES["url"])
    if url:
        return url
    secret_arn = environ.get(VARIABLES["secret_arn"])
    if not secret_arn:
        raise ConfigurationError(
            "no schema owner credentials: set LEASEQ_DATABASE_SECRET_ARN (a secret with "
            "username and password) or DATABASE_URL"
        )
    secret = read_secret(secret_arn)
    missing = [key for key in ("username", "password") if not secret.get(key)]
    if missing:
        raise ConfigurationError(f"secret {secret_arn} lacks {', '.join(missing)}")
    host = environ.get(VARIABLES["host"]) or secret.get("host")
    dbname = environ.get(VARIABLES["name"]) or secret.get("dbname")
    if not host or not dbname:
        raise ConfigurationError(
            "the database is unknown: set LEASEQ_DB_HOST and LEASEQ_DB_NAME (or put host and "
            "dbname in the secret)"
        )
    port = environ.get(VARIABLES["port"]) or secret.get("port") or 5432
    # The runtime's rules (leaseq.store.tls): an empty setting is unset, a CA file alone means
    # verify-full, and a host across a network with nothing to verify it is refused.
    try:
        tls = choose_tls(
            host=str(host),
            sslmode=ssl_mode(environ.get(VARIABLES["sslmode"]) or None),
            sslrootcert=environ.get(VARIABLES["sslrootcert"]) or None,
            environ=environ,
        )
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc.message}. {IN_THE_STACK}") from exc
    return make_conninfo(
        host=str(host),
        port=str(port),
        dbname=str(dbname),
        user=str(secret["username"]),
        password=str(secret["password"]),
        **tls.params(),
    )


def ssl_mode(value: str | None) -> SslSetting | None:
    """``LEASEQ_DB_SSLMODE`` as one of its values, refused by name when it is none of them."""
    if value is None:
        return None
    modes: tuple[SslSetting, ...] = get_args(SslSetting)
    for mode in modes:
        if value == mode:
            return mode
    raise ConfigurationError(
        f"LEASEQ_DB_SSLMODE={value} is not an sslmode leaseq knows: use one of "
        f"{', '.join(modes)}")
