"""The stack's database TLS, from its parameters to what each function's libpq is told.

Every function's LEASEQ_DB_SSLMODE, LEASEQ_DB_SSLROOTCERT and LEASEQ_DB_HOST are read from
the template as aws-sam-translator expands it, resolved for a deploy (the database created
here behind its proxy, an existing one through a proxy, an existing one reached directly),
and handed to leaseq.store.tls as the function would at cold start. The default stack must
verify every connection, the migrations' login as the RDS master user first of all; and
the template's Rules must refuse, before anything is created, exactly the parameter values
that would leave a function refusing to connect (or connecting unverified without the
opt-out by name).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import product
from pathlib import Path
from typing import Any

import pytest
from leaseq import ConfigurationError
from leaseq.store import tls

from tests.infra.template_support import (
    load_sam_template,
    parameter_values,
    rule_refusals,
    rule_value,
    stand_in_rds_bundle,
    translate,
)
from tests.support.tls_server import INSTANCE_HOST

PROXY_HOST = "leaseq-test-proxy.proxy-c1a2b3c4d5e6.eu-west-1.rds.amazonaws.com"
BUNDLE_IN_LAYER = "/opt/rds/global-bundle.pem"
OWNER_SECRET = "arn:aws:secretsmanager:eu-west-1:111122223333:secret:leaseq/owner"
#: Deploys by where the database is, as parameters.
TOPOLOGIES: dict[str, dict[str, str]] = {
    "created here, behind its proxy": {},
    "existing, through a proxy": {
        "ExistingDbEndpoint": INSTANCE_HOST, "ExistingDbProxyEndpoint": PROXY_HOST,
        "ExistingDbResourceId": "prx-0123abcd",
        "SchemaOwnerSecretArn": OWNER_SECRET},
    "existing, reached directly": {
        "ExistingDbEndpoint": INSTANCE_HOST, "ExistingDbResourceId": "db-0123ABCD",
        "SchemaOwnerSecretArn": OWNER_SECRET},
}
#: What GetAtt returns once deployed, for the attributes the functions' hosts use.
ATTRIBUTES = {("Database", "Endpoint.Address"): INSTANCE_HOST,
              ("DatabaseProxy", "Endpoint"): PROXY_HOST}
TLS_RULES = {"DirectConnectionsVerifyTheServer", "UnverifiedTlsTakesNoRootCert",
             "SystemRootsNeedVerifyFull", "VerifyCaNeedsDirectConnections"}


@pytest.fixture(scope="module")
def sam() -> dict[str, Any]:
    return load_sam_template()


@pytest.fixture(scope="module")
def cfn(sam: dict[str, Any]) -> dict[str, Any]:
    return translate(sam)


def resolved(value: Any, parameters: dict[str, Any], conditions: dict[str, Any]) -> Any:
    """A function's environment value once deployed (None: the variable is left out)."""
    if isinstance(value, str | int | float):
        return str(value)
    ((function, argument),) = value.items()
    if function == "Ref":
        return None if argument == "AWS::NoValue" else parameters[argument]
    if function == "Fn::If":
        name, then, otherwise = argument
        chosen = then if rule_value(conditions[name], parameters, conditions) else otherwise
        return resolved(chosen, parameters, conditions)
    if function == "Fn::GetAtt":
        return ATTRIBUTES[tuple(argument)]
    raise NotImplementedError(f"{function} in a TLS variable: teach resolved() it")


def connections(cfn: dict[str, Any], **given: str) -> Iterator[tuple[str, str, Any, Any]]:
    """(function, host, LEASEQ_DB_SSLMODE, LEASEQ_DB_SSLROOTCERT) of every function that
    connects by host, for a deploy with these parameters."""
    parameters = parameter_values(cfn, **given)
    for name, resource in cfn["Resources"].items():
        if resource["Type"] != "AWS::Lambda::Function":
            continue
        variables = resource["Properties"].get("Environment", {}).get("Variables", {})
        if "LEASEQ_DB_SSLMODE" not in variables:
            continue
        values = {key: resolved(variables.get(key, {"Ref": "AWS::NoValue"}), parameters,
                                cfn["Conditions"])
                  for key in ("LEASEQ_DB_HOST", "LEASEQ_DB_SSLMODE", "LEASEQ_DB_SSLROOTCERT")}
        yield (name, values["LEASEQ_DB_HOST"], values["LEASEQ_DB_SSLMODE"] or None,
               values["LEASEQ_DB_SSLROOTCERT"] or None)


def cold_start_tls(host: str, mode: Any, rootcert: Any) -> tls.TlsOptions:
    """What leaseq.store.tls chooses in the function, with the certificates layer's bundle (a
    stand-in) at /opt/rds and the system roots pointed at it too."""
    bundle = str(stand_in_rds_bundle())
    return tls.choose_tls(host=host, sslmode=mode,
                          sslrootcert=bundle if rootcert == BUNDLE_IN_LAYER else rootcert,
                          environ={"SSL_CERT_FILE": bundle})


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_the_default_stack_verifies_every_connection_the_master_login_first(
    cfn: dict[str, Any], sam: dict[str, Any], topology: str,
) -> None:
    given = TOPOLOGIES[topology]
    assert rule_refusals(sam, **given) == []
    found = {}
    for function, host, mode, rootcert in connections(cfn, **given):
        options = cold_start_tls(host, mode, rootcert)
        assert options.sslmode == "verify-full", (function, host)
        assert not options.unverified_by_choice, function
        found[function] = (host, rootcert)

    # The migrations log in as the RDS master user (or the schema owner) to the instance
    # itself, verified against the RDS CA bundle of the certificates layer.
    assert found["MigrationsFunction"] == (INSTANCE_HOST, BUNDLE_IN_LAYER)
    through_proxy = topology != "existing, reached directly"
    expected = (PROXY_HOST, None) if through_proxy else (INSTANCE_HOST, BUNDLE_IN_LAYER)
    for function in ("WorkerFunction", "ReaperFunction", "EnqueueFunction"):
        assert found[function] == expected, function  # the proxy: the system roots


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_the_rules_refuse_exactly_the_tls_parameters_a_function_would_refuse(
    cfn: dict[str, Any], sam: dict[str, Any], topology: str,
) -> None:
    modes = sam["Parameters"]["DbSslMode"]["AllowedValues"]
    for mode, rootcert in product(modes, ["", BUNDLE_IN_LAYER, "system"]):
        given = {**TOPOLOGIES[topology], "DbSslMode": mode, "DbSslRootCert": rootcert}
        refused = rule_refusals(sam, **given)
        assert set(refused) <= TLS_RULES, refused
        problems = []
        for function, host, fn_mode, fn_rootcert in connections(cfn, **given):
            try:
                options = cold_start_tls(host, fn_mode, fn_rootcert)
            except ConfigurationError as exc:
                problems.append(f"{function}: {exc.message}")
                continue
            # What connects is verified, or unverified because the deployer said so.
            if options.sslmode not in ("verify-full", "verify-ca"):
                assert options.unverified_by_choice, (function, given)
                assert mode == "require-unverified", (function, given)
        assert bool(refused) == bool(problems), (given, refused, problems)


def test_an_empty_root_cert_without_the_opt_out_is_refused_naming_the_fix(
    sam: dict[str, Any],
) -> None:
    assert rule_refusals(sam, DbSslRootCert="") == ["DirectConnectionsVerifyTheServer"]
    assert rule_refusals(sam, DbSslRootCert="", DbSslMode="require-unverified") == []
    assert rule_refusals(sam, DbSslMode="require-unverified") == ["UnverifiedTlsTakesNoRootCert"]
    (assertion,) = sam["Rules"]["DirectConnectionsVerifyTheServer"]["Assertions"]
    for named in ("RDS master user", BUNDLE_IN_LAYER, "DbSslMode=require-unverified"):
        assert named in assertion["AssertDescription"], named


def test_plain_require_is_no_longer_a_value_of_the_stack(sam: dict[str, Any]) -> None:
    # A stack that had DbSslMode=require fails its next update on AllowedValues, before
    # any change: the deployer chooses verify-full (the default) or the opt-out by name.
    assert "require" not in sam["Parameters"]["DbSslMode"]["AllowedValues"]
    assert "require-unverified" in sam["Parameters"]["DbSslMode"]["AllowedValues"]


def test_the_layer_path_of_the_bundle_is_where_the_certificates_build_puts_it(
    sam: dict[str, Any],
) -> None:
    import importlib.util

    script = Path(sam["Resources"]["CertificatesLayer"]["Properties"]["ContentUri"])
    spec = importlib.util.spec_from_file_location(
        "certificates_build_layer", Path(__file__).resolve().parents[2] / script /
        "build_layer.py")
    assert spec is not None
    assert spec.loader is not None
    build_layer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_layer)

    # A layer's content is mounted at /opt.
    assert f"/opt/{build_layer.BUNDLE_PATH}" == sam["Parameters"]["DbSslRootCert"]["Default"]
