"""docs/deploy.md, "First deploy, from a clean account": every command of its code blocks,
checked as far as it runs without an AWS account.

The commands are taken out of the section's code blocks (a line ending in a backslash goes
on), and the shell expands each one (with stand-ins for the values earlier steps read from
AWS), so what is checked is the argument list the program would get:

* run as written: ``sam validate --lint``, ``sam build`` (the test's environment and a
  build folder of its own), ``scripts/install-sam``, ``python3 -m venv``;
* run against a stand-in of the stack: every ``leaseq`` command, against outputs of
  ``leaseq-dev`` in moto's CloudFormation, through a real local port forward (a free port
  instead of 15432) to a PostgreSQL that speaks only TLS with a certificate for the proxy's
  name (tests/cli/test_stack_tunnel.py); the Python enqueue against the real enqueue
  function in this process;
* parsed by the program's own parser or model: ``sam deploy``/``delete``/``logs`` by the
  SAM CLI's (with samconfig.toml), ``aws`` commands against botocore's service models,
  ``pip install`` against pyproject.toml's extras, the operator's policy as IAM reads it;
* the cost table's arithmetic and counts against the templates.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tomllib
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from leaseq_cli.main import main
from leaseq_dashboard.local import LocalServer
from moto import mock_aws
from psycopg.rows import dict_row

from tests.cli.test_stack_tunnel import (  # noqa: F401 - fixtures
    Deployed,
    deploy_outputs,
    deployed,
    sign_in_to,
)
from tests.dashboard.client import Client
from tests.functions.conftest import enqueue_app, lambda_env  # noqa: F401 - fixtures
from tests.infra.iam_policy import allows, request, statements
from tests.infra.template_support import (
    ROOT,
    find_sam,
    load_sam_template,
    parameter_values,
    require_sam,
    resources_of_type,
    rule_value,
    sam_environment,
    translate,
)
from tests.sql.calls import claim_one, enqueue
from tests.support.lambda_service import InProcessLambda
from tests.support.port_forward import PortForward, port_forward
from tests.support.tls_server import PROXY_HOST

DOC = ROOT / "docs" / "deploy.md"
SECTION = "## First deploy, from a clean account"
STACK = "leaseq-dev"
#: The local port of the doc's tunnel; the test's forward listens on a free one instead
#: (other runs on this machine may hold 15432).
TUNNEL_PORT = "15432"
#: What earlier steps read from AWS (describe-stacks outputs), as stand-ins of their shape.
STAND_INS = {
    "OPERATOR_SG": "sg-0123456789abcdef0",
    "OPERATOR_HOST": "i-0123456789abcdef0",
    "PROXY": "leaseq-dev-proxy.proxy-c1a2b3c4d5e6.us-east-1.rds.amazonaws.com",
    "ENQUEUE_FUNCTION": "arn:aws:lambda:us-east-1:123456789012:function:leaseq-test-"
                        "EnqueueFunction",
    "SNAPSHOT": "leaseq-dev-database-1a2b3c4d5e6f-snapshot",
    "DEAD_LETTER_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/"
                             "leaseq-dev-EnqueueDeadLetterQueue-1A2B3C4D5E6F",
    "JOB_ID": "00000000-0000-0000-0000-000000000000",
}
#: The AWS CLI's global options (the others belong to the operation).
AWS_GLOBAL_OPTIONS = {"--region": True, "--query": True, "--output": True, "--profile": True,
                      "--no-cli-pager": False}


# ---- the section and its commands -----------------------------------------------------------


def section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end != -1 else None]


def code_blocks(language: str) -> list[str]:
    return [match.group(1) for match in re.finditer(
        rf"^```{language}\n(.*?)^```", section(), flags=re.MULTILINE | re.DOTALL)]


def commands() -> list[str]:
    """Each shell command of the section, continuation lines joined, comments dropped."""
    found = []
    for block in code_blocks("sh"):
        joined = re.sub(r"\\\n\s*", " ", block)
        found += [line.strip() for line in joined.splitlines()
                  if line.strip() and not line.strip().startswith("#")]
    return found


_EXPORT_FROM = re.compile(r"^export (?P<name>[A-Z_]+)=\$\((?P<command>.*)\)$")
_EXPORT = re.compile(r"^export (?P<name>[A-Z_]+)=")


def shell_words(command: str, environment: dict[str, str]) -> list[str]:
    """``command``'s arguments as bash would pass them, with ``environment``'s values;
    an unset variable is an error (set -u), so a doc that uses one unexplained fails."""
    result = subprocess.run(
        ["bash", "-c", 'set -eu; eval "set -- $1"; printf "%s\\0" "$@"', "bash", command],
        capture_output=True, text=True, env={"PATH": os.environ["PATH"], "PWD": str(ROOT),
                                              "HOME": os.environ.get("HOME", "/root"),
                                              **environment}, cwd=ROOT, timeout=30)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout.split("\0")[:-1]


def argument_lists() -> list[tuple[str, list[str]]]:
    """(the command as written, its arguments) for every command but plain exports;
    an export of a command's output contributes that command."""
    found = []
    for command in commands():
        exported = _EXPORT_FROM.match(command)
        if exported:
            found.append((command, shell_words(exported["command"], STAND_INS)))
        elif not _EXPORT.match(command):
            found.append((command, shell_words(command, STAND_INS)))
    return found


def by_program(program: str) -> list[list[str]]:
    return [words for _, words in argument_lists() if words[0] == program]


def test_the_walkthrough_has_every_step_and_no_command_the_test_does_not_know() -> None:
    programs = {words[0] for _, words in argument_lists()}
    headings = re.findall(r"^### (\d+)\. ", section(), flags=re.MULTILINE)

    assert headings == [str(n) for n in range(11)]
    assert programs == {"python3", ".venv/bin/pip", "scripts/install-sam", "sam", "aws",
                        "leaseq"}
    # Plain exports set only what later commands use (PATH) or read from AWS.
    exports = [_EXPORT.match(c)["name"] for c in commands()  # type: ignore[index]
               if _EXPORT.match(c) and not _EXPORT_FROM.match(c)]
    assert exports == ["PATH"]
    assert {_EXPORT_FROM.match(c)["name"] for c in commands()  # type: ignore[index]
            if _EXPORT_FROM.match(c)} <= set(STAND_INS)


# ---- run as written ---------------------------------------------------------------------------


def test_the_local_setup_commands_run_or_name_what_exists(tmp_path: Path) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extras = set(pyproject["project"]["optional-dependencies"])

    (venv,) = by_program("python3")
    assert venv == ["python3", "-m", "venv", ".venv"]
    made = subprocess.run(["python3", "-m", "venv", "--without-pip", ".venv"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / ".venv" / "bin" / "python").exists()
    (pip,) = by_program(".venv/bin/pip")
    assert pip[:3] == [".venv/bin/pip", "install", "-e"]
    target, wanted = re.fullmatch(r"(\.)\[([a-z,]+)\]", pip[3]).groups()  # type: ignore[union-attr]
    assert (ROOT / target / "pyproject.toml").is_file()
    assert set(wanted.split(",")) <= extras
    # The extra brings the command line with the dashboard and the AWS clients the steps use.
    (brings,) = [part for part in pyproject["project"]["optional-dependencies"]["local"]
                 if part.startswith("leaseq[")]
    assert set(brings[len("leaseq["):-1].split(",")) == {"lambda", "dashboard"}
    (install,) = by_program("scripts/install-sam")
    require_sam()
    ran = subprocess.run(install, cwd=ROOT, capture_output=True, text=True,
                         env=sam_environment(), timeout=600)
    assert ran.returncode == 0, ran.stderr


def test_sam_validate_with_lint_runs_as_written() -> None:
    (validate,) = [w for w in by_program("sam") if w[1] == "validate"]
    assert validate == ["sam", "validate", "--lint"]

    result = subprocess.run([require_sam(), *validate[1:]], cwd=ROOT, capture_output=True,
                            text=True, env=sam_environment(), timeout=300)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "is a valid SAM Template" in result.stdout + result.stderr


def test_sam_build_runs_as_written_in_a_folder_of_its_own(tmp_path: Path) -> None:
    (build,) = [w for w in by_program("sam") if w[1] == "build"]
    assert build == ["sam", "build"]

    # The same command; its output goes to the test's folder, not the checkout's .aws-sam.
    result = subprocess.run(
        [require_sam(), *build[1:], "--build-dir", str(tmp_path / "build"), "--cache-dir",
         str(tmp_path / "cache")], cwd=ROOT, capture_output=True, text=True,
        env=sam_environment(), timeout=600)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for built in ("LeaseqLayerX8664", "LeaseqLayerArm64", "CertificatesLayer",
                  "WorkerFunction", "MigrationsFunction"):
        assert (tmp_path / "build" / built).is_dir(), built


# ---- the SAM CLI's own parser ---------------------------------------------------------------


def sam_parses(words: list[str]) -> dict[str, Any]:
    """The options the SAM CLI's click command makes of ``words``, with samconfig.toml
    read as ``sam`` reads it in the checkout; a usage error fails."""
    sam_cli = find_sam()
    assert sam_cli is not None
    python = Path(sam_cli).parent / "python"
    code = (
        "import sys, json, importlib\n"
        "command = sys.argv[1]\n"
        "cli = importlib.import_module(f'samcli.commands.{command}.command').cli\n"
        "ctx = cli.make_context(command, sys.argv[2:])\n"
        "print(json.dumps({k: v if not isinstance(v, tuple) else list(v)"
        " for k, v in ctx.params.items()}, default=str))\n")
    result = subprocess.run([str(python), "-c", code, *words[1:]], cwd=ROOT,
                            capture_output=True, text=True, env=sam_environment(), timeout=120)
    assert result.returncode == 0, f"{shlex.join(words)}: {result.stderr[-2000:]}"
    parsed: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return parsed


def test_every_other_sam_command_is_accepted_by_the_sam_clis_own_parser() -> None:
    require_sam()
    others = [w for w in by_program("sam") if w[1] not in ("validate", "build")]
    assert {w[1] for w in others} == {"deploy", "delete", "logs"}

    for words in others:
        parsed = sam_parses(words)
        if words[1] == "deploy" and "--template-file" in words:
            template = ROOT / words[words.index("--template-file") + 1]
            assert template.is_file(), template
            assert parsed["stack_name"] == words[words.index("--stack-name") + 1]
        if words[1] == "deploy" and "--config-env" in words:
            assert parsed["config_env"] == "dev"
            assert parsed["stack_name"] == STACK  # from samconfig.toml's dev environment
    # The stack's deploy: its overrides are template parameters with values they accept.
    (deploy,) = [w for w in others if w[1] == "deploy" and "--config-env" in w]
    given = dict(item.split("=", 1) for item in deploy[deploy.index("--parameter-overrides")
                                                       + 1:])
    parameters = load_sam_template()["Parameters"]
    assert set(given) <= set(parameters)
    for name, value in given.items():
        pattern = parameters[name].get("AllowedPattern")
        assert pattern is None or re.fullmatch(pattern, value), (name, value)
        assert value in [str(v) for v in parameters[name].get("AllowedValues", [value])], (
            name, value)
    assert given["HandlersModule"] == "leaseq_lambda.demo_handlers"
    assert given["OperatorSecurityGroupId"] == STAND_INS["OPERATOR_SG"]


def test_what_the_doc_says_the_overrides_leave_is_the_dev_environments_values() -> None:
    """--parameter-overrides replaces samconfig.toml's list: every dev value the command
    does not give again must be the template's default, as the doc says."""
    config = tomllib.loads((ROOT / "samconfig.toml").read_text(encoding="utf-8"))
    dev = dict(item.split("=", 1) for item in shlex.split(
        config["dev"]["deploy"]["parameters"]["parameter_overrides"]))
    (deploy,) = [w for w in by_program("sam") if w[1] == "deploy" and "--config-env" in w]
    given = dict(item.split("=", 1) for item in deploy[deploy.index("--parameter-overrides")
                                                       + 1:])
    defaults = {name: str(p.get("Default", "")) for name, p in
                load_sam_template()["Parameters"].items()}

    assert {name: value for name, value in dev.items()
            if name not in given and defaults[name] != value} == {}


# ---- the AWS CLI commands against botocore's models ---------------------------------------


def aws_problems(words: list[str]) -> list[str]:
    """Why the AWS CLI would refuse ``words`` by its service's model, or nothing."""
    import botocore.session
    from botocore import xform_name

    session = botocore.session.get_session()
    service, operation_name = words[1], words[2]
    model = session.get_service_model(service)
    operations = {xform_name(name, "-"): name for name in model.operation_names}
    if operation_name not in operations:
        return [f"{service} has no operation {operation_name}"]
    operation = model.operation_model(operations[operation_name])
    members = {xform_name(name, "-"): (name, shape)
               for name, shape in operation.input_shape.members.items()}
    problems, given, index = [], set(), 3
    while index < len(words):
        word = words[index]
        if not word.startswith("--"):
            problems.append(f"{word!r}: not an option")
            index += 1
            continue
        option = word[2:]
        index += 1
        if word in AWS_GLOBAL_OPTIONS:
            index += AWS_GLOBAL_OPTIONS[word]
            continue
        if option not in members:
            problems.append(f"--{option}: no member of {operation.name}'s input")
            continue
        name, shape = members[option]
        given.add(name)
        values = []
        while index < len(words) and not words[index].startswith("--"):
            values.append(words[index])
            index += 1
        if not values and shape.type_name != "boolean":
            problems.append(f"--{option} has no value")
        if shape.type_name not in ("list", "map", "structure") and len(values) > 1:
            problems.append(f"--{option} takes one value, got {values}")
        for value in values:
            if value.startswith("file://") and not (ROOT / value[7:]).is_file():
                problems.append(f"--{option}: {value} does not exist")
            if shape.type_name in ("map", "structure") and value.startswith("{"):
                document = json.loads(value)
                assert isinstance(document, dict), option
    missing = [m for m in operation.input_shape.required_members if m not in given]
    problems += [f"{operation.name} needs --{xform_name(m, '-')}" for m in missing]
    return problems


def test_every_aws_command_fits_its_services_model() -> None:
    found = by_program("aws")

    assert len(found) >= 15
    for words in found:
        assert aws_problems(words) == [], shlex.join(words)


def test_the_model_check_refuses_what_the_aws_cli_would() -> None:
    """The checker above must be able to fail."""
    assert aws_problems(["aws", "iam", "create-policy", "--policy-name", "x"])  # no document
    assert aws_problems(["aws", "iam", "create-policie", "--policy-name", "x"])
    assert aws_problems(["aws", "sqs", "delete-queue", "--queue-name", "x"])
    assert aws_problems(["aws", "iam", "create-policy", "--policy-name", "x",
                         "--policy-document", "file://infra/missing.json"])
    assert aws_problems(["aws", "logs", "delete-log-group", "--log-group-name", "a", "b"])


def test_the_tunnel_command_forwards_the_local_port_to_the_proxy_on_5432() -> None:
    (session,) = [w for w in by_program("aws") if w[1:3] == ["ssm", "start-session"]]
    parameters = json.loads(session[session.index("--parameters") + 1])

    assert session[session.index("--document-name") + 1] == (
        "AWS-StartPortForwardingSessionToRemoteHost")
    assert session[session.index("--target") + 1] == STAND_INS["OPERATOR_HOST"]
    assert parameters == {"host": [STAND_INS["PROXY"]], "portNumber": ["5432"],
                          "localPortNumber": [TUNNEL_PORT]}
    for words in by_program("leaseq"):
        assert words[words.index("--tunnel") + 1] == TUNNEL_PORT, words


def test_the_operators_policy_is_a_policy_iam_reads_and_grants_exactly_the_walk(
) -> None:
    (block,) = code_blocks("json")
    document = json.loads(block)
    policy = statements([document])
    login = ("arn:aws:rds-db:us-east-1:123456789012:dbuser:prx-0123456789abcdef0/"
             "leaseq_operator_login")

    assert document["Version"] == "2012-10-17"
    assert allows(policy, request("rds-db:connect", login))
    assert not allows(policy, request("rds-db:connect", login.replace(
        "leaseq_operator_login", "leaseq_worker_login")))
    assert allows(policy, request(
        "ssm:StartSession", "arn:aws:ec2:us-east-1:123456789012:instance/i-0123456789abcdef0",
        "arn:aws:ssm:us-east-1::document/AWS-StartPortForwardingSessionToRemoteHost"))
    assert not allows(policy, request(
        "ssm:StartSession", "arn:aws:ec2:us-east-1:123456789012:instance/i-0123456789abcdef0",
        "arn:aws:ssm:us-east-1::document/AWS-StartSSHSession"))
    assert allows(policy, request("cloudformation:DescribeStacks",
                                  "arn:aws:cloudformation:us-east-1:1:stack/leaseq-dev/abc"))
    assert not allows(policy, request("rds-db:connect", "*"))
    # Its own sessions' data channel, and no other's: the session is named by the caller.
    (own,) = [s for s in document["Statement"] if s["Sid"] == "OwnSessionsOnly"]
    assert own["Resource"] == "arn:aws:ssm:*:*:session/${aws:userid}-*"
    assert "ssmmessages:OpenDataChannel" in own["Action"]
    # The template's output is the resource the policy names.
    outputs = translate(load_sam_template())["Outputs"]
    assert "OperatorDbConnectResource" in outputs
    assert login.endswith("/" + str(load_sam_template()["Parameters"]["OperatorDbUser"][
        "Default"]))


# ---- leaseq against a stand-in of the stack, through a real tunnel ------------------------


@pytest.fixture
def walkthrough_stack(deployed: Deployed,  # noqa: F811
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Deployed, PortForward]]:
    sign_in_to(deployed, monkeypatch)
    with mock_aws(), port_forward("127.0.0.2", deployed.server.port) as forward:
        deploy_outputs(PROXY_HOST, STACK)
        yield deployed, forward


def dead_job(stand_in: Deployed) -> uuid.UUID:
    """A dead job of the demo kind the walkthrough redrives, in the stand-in's database."""
    params = stand_in.server.params("127.0.0.1") | {"dbname": "leaseq_tunnel"}
    with psycopg.connect(**params, sslmode="verify-full",  # type: ignore[arg-type]
                         sslrootcert=str(stand_in.server.ca_file), autocommit=True,
                         row_factory=dict_row) as conn:
        tenant = uuid.UUID("5b1f0c64-2f7e-4a53-9d3e-0c1a2b3c4d5e")
        enqueue(conn, tenant, f"first-deploy/crm-{uuid.uuid4()}", kind="sync_crm")
        lease = claim_one(conn, tenant)
        conn.execute("select app.discard_job(%s, %s, %s, %s, %s)",
                     (tenant, lease["id"], lease["lease_owner"], lease["lease_token"],
                      psycopg.types.json.Jsonb({"code": "DISCARDED",
                                                "message": "no CRM account"})))
        return uuid.UUID(str(lease["id"]))


def test_every_leaseq_command_runs_against_the_stack_through_the_tunnel(
    walkthrough_stack: tuple[Deployed, PortForward], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stand_in, forward = walkthrough_stack
    job_id = dead_job(stand_in)
    pages: list[int] = []

    def serve_one_page(server: LocalServer) -> None:
        server.start()
        try:
            pages.append(Client(server.url).enter(server.login_url).get("/").status)
        finally:
            server.httpd.shutdown()

    monkeypatch.setattr(LocalServer, "serve_forever", serve_one_page)
    found = [words for _, words in argument_lists() if words[0] == "leaseq"]
    assert [w[1] for w in found] == ["status", "dead", "jobs", "dead", "dashboard"]

    for words in found:
        arguments = [str(job_id) if w == STAND_INS["JOB_ID"] else
                     str(forward.port) if w == TUNNEL_PORT else w for w in words[1:]]
        if arguments[0] == "dashboard":
            arguments += ["--port", "0"]
        capsys.readouterr()
        code = main(arguments)
        out, err = capsys.readouterr()
        assert code == 0, f"{shlex.join(words)}: {err}"
        if arguments[:2] == ["dead", "list"]:
            assert str(job_id) in out
        if arguments[0] == "jobs":
            assert "no CRM account" in out

    assert pages == [200]
    assert forward.carried
    assert {(host, port) for host, port, _ in stand_in.tokens} == {(PROXY_HOST, 5432)}


def test_the_python_enqueue_runs_against_the_enqueue_function(
    enqueue_app: ModuleType, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    (block,) = code_blocks("python")
    service = InProcessLambda(enqueue_app)
    monkeypatch.setenv("ENQUEUE_FUNCTION", service.arn)
    from leaseq_lambda import producer

    monkeypatch.setattr(producer, "_lambda_client", lambda: service)

    def printed() -> list[str]:
        # The function runs in this process: its JSON log lines are on stdout too.
        return [word for line in capsys.readouterr().out.splitlines()
                if not line.startswith("{") for word in line.split()]

    exec(compile(block, "docs/deploy.md", "exec"), {})  # noqa: S102 - the doc's own code
    first = printed()
    exec(compile(block, "docs/deploy.md", "exec"), {})  # noqa: S102
    again = printed()

    assert first[:2] == ["0", "created"]
    assert first[3:5] == ["1", "created"]
    assert again == [first[0], "existing", first[2], first[3], "existing", first[5]]
    assert [call["event"]["jobs"][1]["kind"] for call in service.calls] == ["sync_crm"] * 2
    # The demo handlers registered for the kinds it enqueues.
    from leaseq_lambda import demo_handlers

    assert {"send_welcome_email", "sync_crm"} <= set(demo_handlers.registry.kinds)


# ---- the cost table ------------------------------------------------------------------------


_MONEY = re.compile(r"\$([0-9.]+)")


def cost_rows() -> list[dict[str, str]]:
    table = section()[section().index("### 9."):section().index("### 10.")]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True))
            for row in rows[2:]]


def evaluate(arithmetic: str) -> Decimal:
    """``730 h x 2 x $0.015`` (with the multiplication sign): the product of its numbers
    (units are words)."""
    total = Decimal(1)
    for factor in arithmetic.split("×"):
        number = re.search(r"\$?([0-9]+(?:\.[0-9]+)?)", factor.replace(",", ""))
        assert number is not None, factor
        total *= Decimal(number.group(1))
    return total


def test_each_cost_lines_arithmetic_gives_its_amount_and_the_amounts_the_total() -> None:
    rows = cost_rows()
    lines = [row for row in rows if row["Stack"] != "all"]
    (total,) = [row for row in rows if row["Stack"] == "all"]

    assert len(lines) >= 15
    for row in lines:
        amount = Decimal(_MONEY.search(row["Per month"]).group(1))  # type: ignore[union-attr]
        assert evaluate(row["Arithmetic"]).quantize(Decimal("0.01")) == amount, row
    amounts = [Decimal(_MONEY.search(row["Per month"]).group(1))  # type: ignore[union-attr]
               for row in lines]
    stated = Decimal(_MONEY.search(total["Per month"]).group(1))  # type: ignore[union-attr]
    assert sum(amounts) == stated
    relay = sum(a for a, row in zip(amounts, lines, strict=True)
                if row["Stack"] == "admin-leaseq-operator-access")
    assert f"the total is ${stated - relay}" in section()
    assert {row["Stack"] for row in lines} == {STACK, "leaseq-network",
                                               "admin-leaseq-operator-access"}


def alarms_at_the_defaults() -> tuple[int, int]:
    """(alarms, metrics they watch) that the template creates with its defaults."""
    sam = load_sam_template()
    values = parameter_values(sam)
    conditions = {name: bool(rule_value(c, values, sam["Conditions"]))
                  for name, c in sam["Conditions"].items()}
    alarms = [a for a in resources_of_type(translate(sam), "AWS::CloudWatch::Alarm").values()
              if conditions.get(a.get("Condition", ""), True)]
    watched = sum(len([m for m in a["Properties"]["Metrics"] if "MetricStat" in m])
                  if "Metrics" in a["Properties"] else 1 for a in alarms)
    return len(alarms), watched


def test_the_cost_tables_counts_are_the_templates() -> None:
    rows = {row["What"]: row for row in cost_rows()}
    alarms, metrics = alarms_at_the_defaults()
    (alarm_row,) = [row for what, row in rows.items() if what.startswith("CloudWatch alarms")]
    network = load_sam_template(ROOT / "infra" / "network.yaml")["Resources"]
    relay = load_sam_template(ROOT / "infra" / "operator-access.yaml")["Resources"]

    assert f"{alarms} alarms watching {metrics} metrics" in alarm_row["What"]
    assert alarm_row["Arithmetic"].startswith(f"{metrics} ×")
    assert f"{alarms} alarms" in section()
    interface = [r for r in network.values() if r["Type"] == "AWS::EC2::VPCEndpoint"
                 and r["Properties"]["VpcEndpointType"] == "Interface"]
    zones = {len(r["Properties"]["SubnetIds"]) for r in interface}
    (endpoint_row,) = [row for row in rows.values() if row["Stack"] == "leaseq-network"
                       and "interface endpoints" in row["What"]]
    assert endpoint_row["Arithmetic"] == f"730 h × {len(interface) * zones.pop()} × $0.01"
    ssm = [r for r in relay.values() if r["Type"] == "AWS::EC2::VPCEndpoint"]
    (relay_row,) = [row for row in rows.values() if row["Stack"] == "admin-leaseq-operator-access"
                    and "endpoints" in row["What"]]
    assert relay_row["Arithmetic"] == f"730 h × {len(ssm)} × $0.01"
    instance = relay["OperatorHost"]["Properties"]
    assert load_sam_template(ROOT / "infra" / "operator-access.yaml")["Parameters"][
        "InstanceType"]["Default"] in rows["t4g.nano relay"]["What"]
    volume = instance["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"]
    assert rows["its 8 GiB gp3 volume"]["Arithmetic"].startswith(f"{volume} GB")
    template = load_sam_template()["Parameters"]
    assert template["DbInstanceClass"]["Default"] in rows[
        "RDS for PostgreSQL db.t4g.micro, one zone"]["What"]
    assert template["DbAllocatedStorage"]["Default"] == 20
    assert template["WorkerPollIdleSeconds"]["Default"] == 10
