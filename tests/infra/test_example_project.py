"""examples/handler-project: a team's handlers on leaseq without editing leaseq's template.

It is copied outside the checkout with the release's sdist unpacked into its ``leaseq/``,
as its README tells a user, and built there with `sam build` (its two handlers layers,
one per architecture because msgpack is compiled, and the leaseq stack of the release
nested in it), linted, and its handlers module
is loaded by leaseq's own registry loader on Python 3.13 from the built layers of this
machine's architecture, as the worker would load it; the other architecture's layer is
checked by its wheels' tags and the ELF headers of its shared objects. What the project
grants its handlers (an S3 action, a secret) is checked to reach leaseq's parameters with
values they accept, and to fit the workers' boundary an administrator makes for them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.infra.iam_policy import allows, request, statements
from tests.infra.template_support import (
    ROOT,
    load_sam_template,
    parameter_values,
    require_lambda_python,
    rule_value,
    sam_environment,
)
from tests.infra.test_sam_build import (
    LAYERS,
    elf_machine,
    host_layer,
    run_isolated,
    runtime_provided_dir,
    sam_build,
    tag_problem,
    wheel_tags,
)
from tests.support.release import built_release

PROJECT = ROOT / "examples" / "handler-project"
#: What leaseq's layer carries; a handlers layer that shipped them would shadow leaseq's.
LEASEQ_PACKAGES = ("leaseq", "leaseq_lambda", "leaseq_dashboard", "leaseq_deploy", "psycopg",
                   "psycopg_binary", "pydantic", "pydantic_core", "aws_lambda_powertools")
#: handlers layer -> leaseq's layer of the same architecture
HANDLERS_LAYERS = {"HandlersLayerX8664": "LeaseqLayerX8664",
                   "HandlersLayerArm64": "LeaseqLayerArm64"}
ACCOUNT = "123456789012"
BUCKET = "invoices-archive-example"
SECRET = f"arn:aws:secretsmanager:eu-west-1:{ACCOUNT}:secret:invoices/signing-key-AbCdEf"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example as a user has it: a copy of its own, far from leaseq's checkout, with
    the release's sdist unpacked into leaseq/ (its README's two commands)."""
    release = built_release(tmp_path_factory.mktemp("dist"))
    copy = tmp_path_factory.mktemp("user") / "handler-project"
    assert not copy.resolve().is_relative_to(ROOT)
    shutil.copytree(PROJECT, copy, ignore=shutil.ignore_patterns("leaseq", ".aws-sam"))
    release.unpack_sdist(copy / "leaseq")
    return copy


@pytest.fixture(scope="module")
def built(project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sam_build(project / "template.yaml", tmp_path_factory.mktemp("example-build"),
                     project)


def application() -> dict[str, Any]:
    resource: dict[str, Any] = load_sam_template(PROJECT / "template.yaml")["Resources"][
        "Leaseq"]
    return resource


def handlers_layer(leaseq_layer: str) -> str:
    """The handlers layer of the same architecture as ``leaseq_layer``."""
    return {v: k for k, v in HANDLERS_LAYERS.items()}[leaseq_layer]


def host_sites(built: Path) -> list[Path]:
    """The handlers layer and leaseq's layer of this machine's architecture, in order."""
    leaseq = host_layer()
    return [built / handlers_layer(leaseq) / "python", built / "Leaseq" / leaseq / "python"]


@pytest.mark.parametrize("layer", list(HANDLERS_LAYERS))
def test_each_handlers_layer_holds_the_module_and_wheels_for_its_own_architecture_only(
    built: Path, layer: str,
) -> None:
    arch, machine = LAYERS[HANDLERS_LAYERS[layer]]
    site = built / layer / "python"

    assert (site / "invoice_handlers.py").read_bytes() == (
        PROJECT / "handlers" / "invoice_handlers.py").read_bytes()
    tags = wheel_tags(site)
    assert {name.split("-")[0] for name in tags} == {"humanize", "msgpack"}
    problems = {dist: [tag_problem(tag, arch) for tag in dist_tags]
                for dist, dist_tags in tags.items()}
    assert {dist: found for dist, found in problems.items() if None not in found} == {}
    (msgpack_tags,) = [dist_tags for dist, dist_tags in tags.items()
                       if dist.startswith("msgpack-")]
    assert all(tag.startswith("cp313-cp313-") for tag in msgpack_tags), msgpack_tags
    # The compiled part: ELF for this machine type, named for CPython 3.13 on it.
    shared = [p for p in site.rglob("*.so*") if p.is_file()]
    assert shared, "msgpack's C extension is missing"
    assert {p.name: elf_machine(p) for p in shared if elf_machine(p) != machine} == {}
    for extension in shared:
        assert extension.name.endswith(f".cpython-313-{arch}-linux-gnu.so"), extension.name
    assert [name for name in LEASEQ_PACKAGES if (site / name).exists()] == []


def test_the_handlers_makefile_refuses_a_wheel_for_another_architecture(
    tmp_path: Path,
) -> None:
    """The check in handlers/Makefile must be able to fail: an aarch64 wheel in the x86_64
    layer (here: one built for aarch64 given as x86_64's requirement) stops the build."""
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    makefile = (PROJECT / "handlers" / "Makefile").read_text(encoding="utf-8")
    # pip fetches the aarch64 wheels; the check is the x86_64 layer's, as written.
    assert "$(call platforms,$(WHEEL_ARCH))" in makefile
    (handlers / "Makefile").write_text(makefile.replace(
        "$(call platforms,$(WHEEL_ARCH))", "$(call platforms,aarch64)"), encoding="utf-8")
    (handlers / "requirements.txt").write_text("msgpack==1.2.4\n", encoding="utf-8")
    (handlers / "invoice_handlers.py").write_text("registry = None\n", encoding="utf-8")

    result = subprocess.run(["make", "-C", str(handlers), "build-HandlersLayerX8664",
                             f"ARTIFACTS_DIR={tmp_path / 'out'}"], capture_output=True,
                            text=True, env=sam_environment(), timeout=300)

    assert result.returncode != 0
    assert "neither pure Python nor for CPython 3.13 on x86_64" in result.stdout + result.stderr


def test_the_leaseq_stack_is_built_as_the_nested_application(built: Path) -> None:
    nested = built / "Leaseq"

    for name in ("LeaseqLayerX8664", "LeaseqLayerArm64", "WorkerFunction", "MigrationsFunction"):
        assert (nested / name).is_dir(), name
    for name in HANDLERS_LAYERS:
        assert (built / name / "python" / "invoice_handlers.py").is_file(), name
    assert (nested / "LeaseqLayerX8664" / "python" / "leaseq" / "_sql" / "migrations").is_dir()
    parent = (built / "template.yaml").read_text(encoding="utf-8")
    assert "Leaseq/template.yaml" in parent


def test_the_worker_loads_the_example_handlers_from_the_two_layers_on_python313(
    built: Path,
) -> None:
    found = run_isolated(
        require_lambda_python(),
        "import os\n"
        "os.environ['LEASEQ_HANDLERS_ENVIRONMENT'] = json.dumps({'CURRENCY': 'CHF'})\n"
        "from leaseq_lambda.runtime import load_registry\n"
        "registry = load_registry('invoice_handlers')\n"
        "import invoice_handlers, humanize, msgpack\n"
        "from msgpack import _cmsgpack\n"
        "print(json.dumps({'kinds': sorted(registry.kinds), 'count': len(registry),"
        " 'currency': invoice_handlers.CURRENCY, 'compiled': _cmsgpack.__file__,"
        " 'packer': msgpack.Packer.__module__,"
        " 'humanize': humanize.__file__, 'slow': registry.get('report.monthly').timeout}))",
        host_sites(built),
    )

    assert found["kinds"] == ["invoice.render", "report.monthly"]
    assert found["count"] == 2
    assert found["currency"] == "CHF"
    assert found["slow"] == 600
    handlers = str(host_sites(built)[0])
    assert str(found["humanize"]).startswith(handlers)
    # msgpack runs its C extension from the layer, not its pure-Python fallback.
    assert str(found["compiled"]).startswith(handlers)
    assert found["packer"] == "msgpack._cmsgpack"


def test_an_invoice_is_archived_signed_with_the_granted_action_and_secret(
    built: Path, tmp_path: Path,
) -> None:
    """invoice.render with ARCHIVE_BUCKET and SIGNING_KEY_SECRET, on Python 3.13 from the
    built layers and the runtime's boto3: botocore's Stubber answers the two calls as the
    services would and checks the requests against the services' own shapes."""
    found = run_isolated(
        require_lambda_python(),
        "import os, uuid, hmac, hashlib, types\n"
        f"os.environ['LEASEQ_HANDLERS_ENVIRONMENT'] = json.dumps({{'CURRENCY': 'EUR',"
        f" 'ARCHIVE_BUCKET': {BUCKET!r}, 'SIGNING_KEY_SECRET': {SECRET!r}}})\n"
        "import boto3, msgpack\n"
        "from botocore.stub import Stubber, ANY\n"
        "from aws_lambda_powertools.utilities.parameters import SecretsProvider\n"
        "import invoice_handlers as h\n"
        "s3 = boto3.client('s3', region_name='eu-west-1', aws_access_key_id='t',"
        " aws_secret_access_key='t')\n"
        "sm = boto3.client('secretsmanager', region_name='eu-west-1', aws_access_key_id='t',"
        " aws_secret_access_key='t')\n"
        "sent = []\n"
        "s3.meta.events.register('before-parameter-build.s3.PutObject',"
        " lambda params, **_: sent.append(dict(params)))\n"
        "with Stubber(s3) as s3_stub, Stubber(sm) as sm_stub:\n"
        f"    sm_stub.add_response('get_secret_value', {{'SecretString': 'k3y', 'ARN': {SECRET!r},"
        f" 'Name': 'invoices/signing-key'}}, {{'SecretId': {SECRET!r}}})\n"
        f"    s3_stub.add_response('put_object', {{}}, {{'Bucket': {BUCKET!r},"
        " 'Key': ANY, 'Body': ANY, 'ContentType': 'application/msgpack'})\n"
        "    h.s3_client, h.secrets = s3, SecretsProvider(boto3_client=sm)\n"
        "    job = types.SimpleNamespace(id=uuid.UUID('12345678-1234-5678-1234-567812345678'))\n"
        "    result = h.render_invoice(h.Invoice(customer='Ada', amount_cents=123456),"
        " types.SimpleNamespace(job=job))\n"
        "    s3_stub.assert_no_pending_responses(); sm_stub.assert_no_pending_responses()\n"
        "doc = msgpack.unpackb(sent[0]['Body'])\n"
        "signature = doc.pop('hmac_sha256')\n"
        "expected = hmac.new(b'k3y', msgpack.packb(doc, use_bin_type=True),"
        " hashlib.sha256).hexdigest()\n"
        "print(json.dumps({'result': result, 'key': sent[0]['Key'], 'doc': doc,"
        " 'signed': signature == expected}))",
        [*host_sites(built), runtime_provided_dir(tmp_path)],
        cwd=tmp_path,
    )

    assert found["key"] == "invoices/INV-12345678.msgpack"
    assert found["doc"] == {"invoice": "INV-12345678", "customer": "Ada",
                            "amount_cents": 123456, "currency": "EUR"}
    assert found["signed"] is True
    assert found["result"]["text"] == "Ada owes 1,234 EUR"
    assert found["result"]["archived_bytes"] > 0


def test_both_workers_start_with_the_example_handlers_and_the_stacks_defaults(
    built: Path,
) -> None:
    """The main worker (LEASEQ_EXCLUDE_KINDS, WorkerTimeoutSeconds) and the slow worker
    (LEASEQ_KINDS, SlowWorkerTimeoutSeconds) accept the example's registry; without
    SlowKinds the main worker would refuse report.monthly's 600 s timeout."""
    leaseq = load_sam_template()["Parameters"]
    slow_kinds = application()["Properties"]["Parameters"]["SlowKinds"]
    common = {"LEASEQ_LEASE_MARGIN_SECONDS": str(leaseq["LeaseMarginSeconds"]["Default"])}
    main = {**common, "LEASEQ_EXCLUDE_KINDS": slow_kinds,
            "LEASEQ_JOB_TIMEOUT_SECONDS": str(leaseq["JobTimeoutSeconds"]["Default"]),
            "LEASEQ_WORKER_TIMEOUT_SECONDS": str(leaseq["WorkerTimeoutSeconds"]["Default"])}
    slow = {**common, "LEASEQ_KINDS": slow_kinds,
            "LEASEQ_JOB_TIMEOUT_SECONDS": str(leaseq["SlowJobTimeoutSeconds"]["Default"]),
            "LEASEQ_WORKER_TIMEOUT_SECONDS": str(leaseq["SlowWorkerTimeoutSeconds"]["Default"])}
    alone = {key: value for key, value in main.items() if key != "LEASEQ_EXCLUDE_KINDS"}
    found = run_isolated(
        require_lambda_python(),
        "from leaseq import ConfigurationError, WorkerConfig\n"
        "from leaseq.drain.budget import check_registry\n"
        "from leaseq.settings import WorkerSettings\n"
        "from leaseq_lambda.runtime import load_registry\n"
        "registry = load_registry('invoice_handlers')\n"
        "def starts(env):\n"
        "    values = WorkerSettings.model_validate(env).config_values()\n"
        "    values.pop('retry_base'); values.pop('retry_max')\n"
        "    try:\n"
        "        check_registry(registry, WorkerConfig(owner='w', **values))\n"
        "    except ConfigurationError as exc:\n"
        "        return exc.message\n"
        "    return 'ok'\n"
        f"print(json.dumps({{'main': starts({main!r}), 'slow': starts({slow!r}),"
        f" 'alone': starts({alone!r})}}))",
        host_sites(built),
    )

    assert (found["main"], found["slow"]) == ("ok", "ok")
    assert "kind 'report.monthly' needs 606 s" in str(found["alone"])


def example_conditions(**given: str) -> dict[str, bool]:
    example = load_sam_template(PROJECT / "template.yaml")
    values = parameter_values(example, **given)
    return {name: bool(rule_value(condition, values, example["Conditions"]))
            for name, condition in example["Conditions"].items()}


def given_to_leaseq(**given: str) -> dict[str, Any]:
    """The nested application's parameters as CloudFormation resolves them for ``given``;
    references to the project's own resources stay {"Ref": ...}."""
    example = load_sam_template(PROJECT / "template.yaml")
    values = parameter_values(example, **given)
    values.update({"AWS::Partition": "aws", "AWS::AccountId": ACCOUNT})
    conditions = example_conditions(**given)

    def resolve(value: Any) -> Any:
        if isinstance(value, dict) and "Fn::If" in value:
            condition, when_true, when_false = value["Fn::If"]
            return resolve(when_true if conditions[condition] else when_false)
        if isinstance(value, dict) and set(value) == {"Ref"} and value["Ref"] in values:
            return values[value["Ref"]]
        if isinstance(value, dict) and "Fn::Sub" in value:
            return rule_value(value, values)
        return value

    return {name: resolve(value) for name, value in application()["Properties"][
        "Parameters"].items()}


@pytest.mark.parametrize("given", [
    {}, {"ArchiveBucketName": BUCKET}, {"SigningKeySecretArn": SECRET},
    {"ArchiveBucketName": BUCKET, "SigningKeySecretArn": SECRET, "Architecture": "arm64"}],
    ids=["defaults", "archive", "signing", "both-arm64"])
def test_the_example_gives_the_stack_parameters_it_has_with_values_it_accepts(
    given: dict[str, str],
) -> None:
    leaseq = load_sam_template()["Parameters"]
    resolved = given_to_leaseq(**given)
    # What CloudFormation makes of the project's own resources' references.
    made = {"HandlersLayerX8664": f"arn:aws:lambda:eu-west-1:{ACCOUNT}:layer:"
                                  "leaseq-example-handlers:1",
            "HandlersLayerArm64": f"arn:aws:lambda:eu-west-1:{ACCOUNT}:layer:"
                                  "leaseq-example-handlers:1",
            "HandlersPolicy": f"arn:aws:iam::{ACCOUNT}:policy/"
                              "leaseq-example-HandlersPolicy-1A2B3C4D5E6F"}

    assert application()["Properties"]["Location"] == "leaseq/template.yaml"
    assert set(resolved) <= set(leaseq)
    for name, value in resolved.items():
        text = made[value["Ref"]] if isinstance(value, dict) else value
        pattern = leaseq[name].get("AllowedPattern")
        assert pattern is None or re.fullmatch(pattern, text), (name, text)
    layer = "HandlersLayerArm64" if given.get("Architecture") == "arm64" else "HandlersLayerX8664"
    assert resolved["HandlersLayerArn"] == {"Ref": layer}
    assert resolved["Architecture"] == given.get("Architecture", "x86_64")
    assert (PROJECT / "handlers" / f"{resolved['HandlersModule']}.py").is_file()
    settings = json.loads(resolved["HandlersEnvironment"])
    assert settings == {"CURRENCY": "EUR", "ARCHIVE_BUCKET": given.get("ArchiveBucketName", ""),
                        "SIGNING_KEY_SECRET": given.get("SigningKeySecretArn", "")}
    # Each grant goes with the workers' boundary an administrator extends for it.
    assert resolved["WorkerManagedPolicyArns"] == (
        {"Ref": "HandlersPolicy"} if "ArchiveBucketName" in given else "")
    assert resolved["HandlersSecretArns"] == given.get("SigningKeySecretArn", "")
    assert resolved["WorkerPermissionsBoundaryArn"] == (
        f"arn:aws:iam::{ACCOUNT}:policy/boundaries/leaseq-handlers-boundary" if given and set(
            given) != {"Architecture"} else "")
    config = tomllib.loads((PROJECT / "samconfig.toml").read_text(encoding="utf-8"))
    assert config["default"]["global"]["parameters"]["stack_name"].startswith("leaseq-")
    assert "CAPABILITY_AUTO_EXPAND" in config["default"]["deploy"]["parameters"]["capabilities"]
    for name in HANDLERS_LAYERS:
        layer_resource = load_sam_template(PROJECT / "template.yaml")["Resources"][name]
        assert layer_resource["Properties"]["LayerName"] == {
            "Fn::Sub": "${AWS::StackName}-handlers"}


def test_what_the_example_grants_fits_the_workers_boundary_made_with_the_same_values() -> None:
    from tests.infra.test_boundary_stack import resolved as boundary_document

    example = load_sam_template(PROJECT / "template.yaml")
    (grant,) = example["Resources"]["HandlersPolicy"]["Properties"]["PolicyDocument"][
        "Statement"]
    resource = rule_value(grant["Resource"], {"AWS::Partition": "aws",
                                              "ArchiveBucketName": BUCKET})
    boundary_stack = load_sam_template(ROOT / "infra" / "permissions-boundary.yaml")
    workers = statements([boundary_document(
        boundary_stack, "HandlersBoundary", HandlerActions=grant["Action"],
        HandlerResources=resource, HandlerSecretArns=SECRET)])
    stack_boundary = statements([boundary_document(boundary_stack, "PermissionsBoundary")])
    put = request("s3:PutObject", f"arn:aws:s3:::{BUCKET}/invoices/INV-1.msgpack")
    read = request("secretsmanager:GetSecretValue", SECRET)

    assert grant["Action"] == "s3:PutObject"
    assert allows(workers, put)
    assert allows(workers, read)
    # Without the administrator's extension, IAM would deny both, whatever the policy says.
    assert not allows(stack_boundary, put)
    assert not allows(stack_boundary, read)
    # The grant is that prefix of that bucket only.
    assert not allows(statements([{"Statement": [grant | {"Resource": resource}]}]),
                      request("s3:PutObject", f"arn:aws:s3:::{BUCKET}/other/x"))


def test_the_example_names_no_file_outside_its_own_folder() -> None:
    """A user copies the project anywhere: no path of its template leaves the folder."""
    paths = [value for value in _strings(load_sam_template(PROJECT / "template.yaml"))
             if len(value) > 1 and not any(c.isspace() for c in value)
             and (value.startswith((".", "/")) or value.endswith((".yaml", "/")))]

    assert "leaseq/template.yaml" in paths
    assert [p for p in paths if ".." in Path(p).parts or Path(p).is_absolute()] == []


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def test_cfn_lint_finds_nothing_in_the_example(project: Path) -> None:
    lint = subprocess.run(
        [sys.executable, "-c", "import sys; from cfnlint.runner import main; sys.exit(main())",
         "template.yaml", "--include-checks", "I", "--append-rules",
         "cfn_lint_serverless.rules"],
        cwd=project, capture_output=True, text=True, env=sam_environment(), timeout=180)

    assert lint.returncode == 0, lint.stdout + lint.stderr
