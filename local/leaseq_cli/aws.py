"""Reach a deployed stack from the command line: its outputs, and a login with no password.

``--stack NAME`` reads the stack's outputs (CloudFormation DescribeStacks): the host and
port operators connect to, the database, and the operators' login (``OperatorDbUser``).
The password is an RDS IAM authentication token, signed locally with the caller's AWS
credentials (``generate_db_auth_token``, no network call) and valid for 15 minutes to
open a connection; a fresh one is made for every connection. The database accepts it only
if the caller's IAM identity may ``rds-db:connect`` on the stack's output
``OperatorDbConnectResource``. The connection is ``sslmode=verify-full``: the server's
certificate must chain to a trusted root (``system``, the operating system's store, which
trusts the certificates of RDS Proxy endpoints; for a database instance reached directly,
pass the RDS certificate bundle with ``--sslrootcert``) and name the host. ``system`` is
resolved to the OS bundle's file by :func:`leaseq.store.tls.system_roots`, as the functions do:
the psycopg-binary wheel's own OpenSSL looks for it where no OS keeps it.

From outside the VPC, ``--tunnel [ADDRESS:]PORT`` connects through a port forward on this
machine (Session Manager's ``AWS-StartPortForwardingSessionToRemoteHost``, or SSH) with
libpq's ``hostaddr``: the TCP connection goes to the forward's address and port, while
``host`` stays the stack's host name, which TLS verifies the certificate against (and
sends as SNI), and which the IAM token is signed for, with the stack's own port, as RDS
checks it.

boto3 is imported only here, when ``--stack`` or ``enqueue resubmit`` is used, so the
local commands need no AWS packages.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from leaseq.store.tls import SYSTEM, check_ca_file, system_roots
from psycopg.conninfo import make_conninfo

from leaseq_cli.failures import CliError, ExitCode, UsageError

__all__ = [
    "AwsClients",
    "StackDatabase",
    "stack_database",
    "stack_outputs",
]

#: The outputs of template.yaml that --stack reads.
HOST_OUTPUT = "OperatorDbHost"
PORT_OUTPUT = "OperatorDbPort"
NAME_OUTPUT = "DbName"
USER_OUTPUT = "OperatorDbUser"
CONNECT_RESOURCE_OUTPUT = "OperatorDbConnectResource"


def _boto3_client(service: str, **options: Any) -> Any:
    try:
        import boto3
    except ModuleNotFoundError as exc:
        raise UsageError("reaching AWS needs boto3: pip install 'leaseq[lambda]'") from exc
    return boto3.client(service, **options)  # type: ignore[call-overload]


@dataclass
class AwsClients:
    """The boto3 clients the command line uses, made on first use; replaceable in tests."""

    region: str | None = None
    factory: Callable[..., Any] | None = None
    _made: dict[str, Any] = field(default_factory=dict)

    def client(self, service: str) -> Any:
        if service not in self._made:
            factory = self.factory or _boto3_client
            self._made[service] = factory(service, region_name=self.region) \
                if self.region else factory(service)
        return self._made[service]


def _aws_failure(exc: Exception, doing: str) -> CliError:
    """An AWS error as one line: what was being done, and the service's own words."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return CliError(f"{doing}: no AWS credentials (set AWS_PROFILE, or run "
                        "`aws sso login` / `aws configure`)", ExitCode.DATABASE)
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return CliError(f"{doing}: {error.get('Code')}: {error.get('Message')}",
                        ExitCode.DATABASE)
    assert isinstance(exc, BotoCoreError)
    return CliError(f"{doing}: {exc}", ExitCode.DATABASE)


def stack_outputs(stack: str, clients: AwsClients) -> dict[str, str]:
    """OutputKey -> OutputValue of a deployed stack."""
    cloudformation = clients.client("cloudformation")  # first: says so if boto3 is missing
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        answer = cloudformation.describe_stacks(StackName=stack)
    except (BotoCoreError, ClientError) as exc:
        raise _aws_failure(exc, f"cannot read stack {stack!r}") from exc
    (found,) = answer["Stacks"]
    return {str(o["OutputKey"]): str(o["OutputValue"]) for o in found.get("Outputs", [])}


def required(outputs: Mapping[str, str], stack: str, *names: str) -> list[str]:
    """The outputs named, or a usage error saying which the stack lacks and why."""
    missing = [name for name in names if not outputs.get(name)]
    if missing:
        raise UsageError(
            f"stack {stack!r} has no output {', '.join(missing)}: it is not a leaseq stack, or "
            "was deployed from an older template (deploy this version first)")
    return [outputs[name] for name in names]


@dataclass(frozen=True)
class StackDatabase:
    """The stack's database as the operators' login reaches it, with an IAM token."""

    stack: str
    host: str
    port: int
    dbname: str
    user: str
    clients: AwsClients
    #: The trusted roots: a PEM bundle, or ``system``; the mode is always verify-full.
    sslrootcert: str = "system"
    #: A local port forward to ``host:port`` (address, port), or None to connect directly.
    tunnel: tuple[str, int] | None = None

    def token(self) -> str:
        """A fresh RDS IAM authentication token for this login (signed locally)."""
        rds = self.clients.client("rds")
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            token: str = rds.generate_db_auth_token(
                DBHostname=self.host, Port=self.port, DBUsername=self.user)
        except (BotoCoreError, ClientError) as exc:
            raise _aws_failure(exc, "cannot sign an IAM authentication token") from exc
        return token

    def dsn(self) -> str:
        """A connection string with a token made now (valid 15 minutes to connect).

        Through a tunnel, ``hostaddr`` and the tunnel's port say where to connect; the
        host name, and with it the certificate check, stay the stack's.
        """
        roots = system_roots(os.environ) if self.sslrootcert == SYSTEM else check_ca_file(
            self.sslrootcert, "--sslrootcert")
        where: dict[str, Any] = {"host": self.host, "port": self.port}
        if self.tunnel is not None:
            where.update(hostaddr=self.tunnel[0], port=self.tunnel[1])
        return make_conninfo("", **where, dbname=self.dbname, user=self.user,
                             password=self.token(), sslmode="verify-full", sslrootcert=roots,
                             connect_timeout=10)

    @property
    def description(self) -> str:
        through = "" if self.tunnel is None else (
            f" through {self.tunnel[0]}:{self.tunnel[1]}")
        return (f"stack {self.stack} ({self.user}@{self.host}:{self.port}/{self.dbname}"
                f"{through}, IAM authentication)")


def stack_database(stack: str, clients: AwsClients, *, sslrootcert: str = "system",
                   tunnel: tuple[str, int] | None = None) -> StackDatabase:
    """Where the operators' login of ``stack`` connects, from the stack's outputs."""
    outputs = stack_outputs(stack, clients)
    if outputs.get(USER_OUTPUT) and not outputs.get(CONNECT_RESOURCE_OUTPUT):
        raise UsageError(
            f"stack {stack!r} uses password authentication (no {CONNECT_RESOURCE_OUTPUT} "
            "output): set DATABASE_URL with the operators' password from the secret "
            "OperatorDbSecretArn instead of --stack")
    host, port, dbname, user, _ = required(outputs, stack, HOST_OUTPUT, PORT_OUTPUT,
                                           NAME_OUTPUT, USER_OUTPUT, CONNECT_RESOURCE_OUTPUT)
    try:
        port_number = int(port)
    except ValueError:
        raise UsageError(f"stack {stack!r}: output {PORT_OUTPUT} is not a port: {port!r}"
                         ) from None
    return StackDatabase(stack, host, port_number, dbname, user, clients,
                         sslrootcert=sslrootcert, tunnel=tunnel)
