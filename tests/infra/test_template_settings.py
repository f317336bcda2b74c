"""The template's parameters against the settings they fill: one default, one range.

Every parameter that reaches a ``LEASEQ_*`` variable of a function fills a setting, found
by the variable's name: the alias of a pydantic field of ``leaseq.settings`` or
``leaseq_dashboard.settings``. Its ``Default`` is the setting's default, unless
``DEPLOYMENT_DEFAULTS`` below says why a deployment starts elsewhere; and every value
the parameter lets a deployer choose (``MinValue``, ``MaxValue``, each of
``AllowedValues``) is one the setting accepts. A template that allows a value the library
refuses would let a stack deploy whose functions fail at cold start: a bug of the
template. Literal values the template writes into these variables are checked the same
way.

Each field is checked on its own (its type and range, as ``from_env`` reads it). The
rules that relate two settings (a function timeout that cannot fit the job timeout) are
the library's and the template's Rules' business, checked in
``tests/library/test_settings.py`` and ``tests/infra/test_template.py``. A ``Number``
parameter cannot refuse a fraction: for a whole-number setting (BatchSize,
WorkerConcurrency, ReaperLimit, DbPort) the library refuses one at cold start, naming the
variable.
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.fields import FieldInfo

from tests.infra.template_support import load_sam_template, translate

#: Parameters whose default is not the library's, and why: the library's default fits any
#: caller, a deployment of this stack starts from its own.
DEPLOYMENT_DEFAULTS: dict[str, tuple[Any, str]] = {
    "MaxWorkers": (
        4.0, "a deployed stack fans out and wakes by default; the library alone (a worker "
             "outside Lambda, the command line) has no function to start, so its default "
             "is 0, the pool off"),
    "WorkerTimeoutSeconds": (
        60.0, "the worker function's Lambda timeout, which the library cannot know: "
              "without the variable it reads the time left at the first invocation"),
    "WorkerConcurrency": (
        10.0, "a deployed worker runs async handlers ten at a time while they wait on I/O "
              "(one connection either way); def handlers keep one at a time through "
              "SyncHandlerConcurrency. The library alone runs one job at a time unless asked"),
    "SyncHandlerConcurrency": (
        1.0, "def handlers one at a time, interrupted at their budget, as before the event "
             "loop; the library's default (unset) lets them share every slot of "
             "LEASEQ_WORKER_CONCURRENCY, as they did"),
    "SlowQueueName": (
        "slow", "the slow worker's named queue; the library's default queue is the one "
                "the main worker drains"),
    "SlowJobTimeoutSeconds": (
        600.0, "the slow worker exists for kinds that need longer than the main worker's "
               "30 s budget"),
    "DbSslRootCert": (
        "/opt/rds/global-bundle.pem",
        "the RDS CA bundle the stack's certificates layer is built with; the library alone "
        "knows no bundle's location, and without one refuses a host across a network "
        "rather than guess"),
    "DbName": ("leaseq", "the database the stack creates; the library has no default "
                         "database name (a DSN or a secret may carry it)"),
    "WorkerDbUser": ("leaseq_worker_login", "a login per function, named by the stack"),
    "ReaperDbUser": ("leaseq_reaper_login", "a login per function, named by the stack"),
    "EnqueueDbUser": ("leaseq_enqueue_login", "a login per function, named by the stack"),
    "DashboardDbUser": ("leaseq_dashboard_login", "a login per function, named by the stack"),
}

#: LEASEQ_* variables the template sets that no settings model reads, and who reads them.
NOT_SETTINGS: dict[str, str] = {
    "LEASEQ_HANDLERS_ENVIRONMENT": "the handlers' own settings, a JSON object read by "
                                   "leaseq_lambda.handlers_environment() in the handlers "
                                   "module",
}

#: Variables the template sets ahead of the library: checked as settings once a settings
#: model declares them. (The kind filter was here while the slow worker used it; the slow
#: worker now drains a named queue, LEASEQ_QUEUE.)
PENDING: dict[str, str] = {}

#: Parameters that must be found filling their setting, so that a walk of the template
#: that found nothing cannot pass.
EXPECTED = {
    "BatchSize": "LEASEQ_BATCH_SIZE",
    "LeaseMarginSeconds": "LEASEQ_LEASE_MARGIN_SECONDS",
    "JobTimeoutSeconds": "LEASEQ_JOB_TIMEOUT_SECONDS",
    "SlowJobTimeoutSeconds": "LEASEQ_JOB_TIMEOUT_SECONDS",
    "WorkerTimeoutSeconds": "LEASEQ_WORKER_TIMEOUT_SECONDS",
    "WorkerConcurrency": "LEASEQ_WORKER_CONCURRENCY",
    "SyncHandlerConcurrency": "LEASEQ_SYNC_CONCURRENCY",
    "RecordIntervalSeconds": "LEASEQ_RECORD_INTERVAL_SECONDS",
    "WorkerPollIdleSeconds": "LEASEQ_POLL_IDLE_SECONDS",
    "ReaperLimit": "LEASEQ_REAPER_LIMIT",
    "JobRetentionDays": "LEASEQ_RETENTION_DAYS",
    "DbPort": "LEASEQ_DB_PORT",
    "DbSslMode": "LEASEQ_DB_SSLMODE",
    "WorkerDbUser": "LEASEQ_DB_USER",
    "DashboardOperators": "LEASEQ_DASHBOARD_OPERATORS",
    "EnqueueTenants": "LEASEQ_ENQUEUE_TENANTS",
}


@dataclass(frozen=True)
class Setting:
    """One settings field, found by the variable it is read from."""

    model: type[BaseModel]
    name: str
    info: FieldInfo

    @property
    def variable(self) -> str:
        return str(self.info.alias)

    def __str__(self) -> str:
        return f"{self.model.__name__}.{self.name} ({self.variable})"

    def read(self, text: str) -> Any:
        """``text`` as the setting reads it from the environment, or ValidationError.

        The field alone: its type and its range, without the model's rules that relate
        it to other fields."""
        probe = create_model(f"Probe_{self.name}", __config__=ConfigDict(frozen=True),
                             value=(self.info.annotation, copy.deepcopy(self.info)))
        return probe.model_validate({self.variable: text}).value  # type: ignore[attr-defined]

    def accepts(self, text: str) -> str | None:
        """None when the setting accepts ``text``, else pydantic's reason."""
        try:
            self.read(text)
        except ValidationError as exc:
            return "; ".join(error["msg"] for error in exc.errors())
        return None

    @property
    def default(self) -> Any:
        return self.info.get_default(call_default_factory=True)

    def bounded(self) -> tuple[bool, bool]:
        """Whether the setting has a lower and an upper bound."""
        kinds = [type(m) for m in self.info.metadata]
        low = any(k in (annotated_types.Ge, annotated_types.Gt) for k in kinds)
        high = any(k in (annotated_types.Le, annotated_types.Lt) for k in kinds)
        return low, high

    def one_of(self) -> bool:
        """Whether the setting takes one of a fixed set of words (a Literal)."""
        annotation = self.info.annotation
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        members = typing.get_args(annotation) if union else (annotation,)
        return any(typing.get_origin(m) is typing.Literal for m in members)


def settings_by_variable() -> dict[str, Setting]:
    """Every settings field of the library and the dashboard, by its variable."""
    from leaseq import settings
    from leaseq_dashboard.settings import DashboardSettings

    models: list[type[BaseModel]] = [
        m for m in vars(settings).values()
        if isinstance(m, type) and issubclass(m, BaseModel) and m is not BaseModel]
    models.append(DashboardSettings)
    found: dict[str, Setting] = {}
    for model in models:
        for name, info in model.model_fields.items():
            if info.alias:
                assert info.alias not in found, f"{info.alias} is read by two settings"
                found[info.alias] = Setting(model, name, info)
    return found


def text(value: Any) -> str:
    """A parameter's value as the function's environment gets it."""
    return value if isinstance(value, str) else f"{value:g}" if isinstance(
        value, float) else str(value)


@dataclass(frozen=True)
class Feed:
    """A variable of a function that a parameter (or a literal) fills."""

    function: str
    variable: str
    parameter: str | None
    literal: Any = None


def sources(value: Any, parameters: dict[str, Any], where: str) -> Iterator[tuple[str, Any]]:
    """What a variable's value can be: ("parameter", name), ("literal", value), or
    nothing for the resources' own attributes and an unset variable."""
    if isinstance(value, str | int | float):
        yield "literal", value
    elif isinstance(value, dict) and set(value) == {"Ref"}:
        if value["Ref"] in parameters:
            yield "parameter", value["Ref"]
    elif isinstance(value, dict) and set(value) == {"Fn::If"}:
        for branch in value["Fn::If"][1:]:
            yield from sources(branch, parameters, where)
    elif isinstance(value, dict) and set(value) == {"Fn::GetAtt"}:
        return
    else:
        refs = [p for p in parameters if f"'{p}'" in repr(value) or f"${{{p}}}" in repr(value)]
        assert not refs, (f"{where}: parameters {refs} reach it through {list(value)}, "
                          "which this test cannot follow; pass them with !Ref or !If")


def feeds(cfn: dict[str, Any]) -> list[Feed]:
    """Every LEASEQ_* variable of every function, with what fills it."""
    parameters = cfn["Parameters"]
    found = []
    for name, resource in cfn["Resources"].items():
        if resource["Type"] != "AWS::Lambda::Function":
            continue
        variables = resource["Properties"].get("Environment", {}).get("Variables", {})
        for variable, value in variables.items():
            if not variable.startswith("LEASEQ_") and variable != "DATABASE_URL":
                continue
            for kind, source in sources(value, parameters, f"{name} {variable}"):
                found.append(Feed(name, variable, source if kind == "parameter" else None,
                                  source if kind == "literal" else None))
    return found


def problems(cfn: dict[str, Any]) -> list[str]:
    """Each way the template's parameters disagree with the settings they fill."""
    settings = settings_by_variable()
    parameters = cfn["Parameters"]
    found: list[str] = []
    checked: set[tuple[str, str]] = set()
    for feed in feeds(cfn):
        where = f"{feed.function} {feed.variable}"
        setting = settings.get(feed.variable)
        if setting is None:
            if feed.variable not in NOT_SETTINGS and feed.variable not in PENDING:
                found.append(f"{where}: no settings field reads this variable")
            continue
        if feed.parameter is None:
            reason = setting.accepts(text(feed.literal))
            if reason is not None:
                found.append(f"{where} = {feed.literal!r}: {setting} refuses it: {reason}")
            continue
        if (feed.parameter, feed.variable) in checked:
            continue
        checked.add((feed.parameter, feed.variable))
        found += parameter_problems(feed.parameter, parameters[feed.parameter], setting)
    return found


def parameter_problems(name: str, parameter: dict[str, Any], setting: Setting) -> list[str]:
    """How one parameter disagrees with the setting it fills."""
    found = []
    default = text(parameter.get("Default", ""))
    # The library reads an empty variable as unset: its own default applies.
    if default != "":
        reason = setting.accepts(default)
        if reason is not None:
            found.append(f"{name}: its Default {default!r} is refused by {setting}: {reason}")
        else:
            value = setting.read(default)
            if name in DEPLOYMENT_DEFAULTS:
                listed = DEPLOYMENT_DEFAULTS[name][0]
                if value != listed or value == setting.default:
                    found.append(f"{name}: DEPLOYMENT_DEFAULTS lists {listed!r}, the template "
                                 f"says {value!r} and {setting} defaults to "
                                 f"{setting.default!r}: update the table")
            elif value != setting.default:
                found.append(f"{name}: Default {value!r} differs from the default of "
                             f"{setting} ({setting.default!r}); make them one, or list "
                             "the parameter in DEPLOYMENT_DEFAULTS with the reason")
    allowed = [text(v) for v in parameter.get("AllowedValues", [])]
    for value in allowed:
        reason = setting.accepts(value) if value != "" else None
        if reason is not None:
            found.append(f"{name}: AllowedValues has {value!r}, which {setting} refuses: "
                         f"{reason}")
    if setting.one_of() and not allowed:
        found.append(f"{name}: {setting} takes one of a few words; give AllowedValues")
    if parameter.get("Type") == "Number" and not allowed:
        low, high = setting.bounded()
        for key, needed in (("MinValue", low), ("MaxValue", high)):
            if key not in parameter:
                if needed:
                    found.append(f"{name}: {setting} is bounded, so the parameter needs a "
                                 f"{key} inside its range")
                continue
            reason = setting.accepts(text(parameter[key]))
            if reason is not None:
                found.append(f"{name}: {key} {parameter[key]!r} lets a deployer choose a "
                             f"value {setting} refuses: {reason}")
    return found


@pytest.fixture(scope="module")
def cfn() -> dict[str, Any]:
    return translate(load_sam_template())


def test_every_parameter_defaults_to_its_settings_default_and_allows_only_what_it_accepts(
    cfn: dict[str, Any],
) -> None:
    assert problems(cfn) == []


def test_each_parameter_is_found_filling_its_setting(cfn: dict[str, Any]) -> None:
    settings = settings_by_variable()
    filled = {(f.parameter, f.variable) for f in feeds(cfn) if f.parameter is not None}

    for parameter, variable in EXPECTED.items():
        assert (parameter, variable) in filled, (parameter, variable)
        assert variable in settings, variable
    for parameter, (_, reason) in DEPLOYMENT_DEFAULTS.items():
        assert any(p == parameter for p, _ in filled), f"{parameter} fills no setting"
        assert reason
    # A pending variable stops being pending once a settings model reads it.
    for variable in [*NOT_SETTINGS, *PENDING]:
        assert any(f.variable == variable for f in feeds(cfn)), f"{variable} is set nowhere"
    for variable in NOT_SETTINGS:
        assert variable not in settings, f"{variable} is a setting now: drop it from the table"


@pytest.mark.parametrize(("parameter", "change", "expected"), [
    ("BatchSize", {"MaxValue": 101}, "MaxValue 101 lets a deployer choose a value"),
    ("RecordIntervalSeconds", {"MinValue": 0}, "MinValue 0 lets a deployer choose"),
    ("LeaseMarginSeconds", {"Default": 4}, "Default 4.0 differs from the default of "
                                           "WorkerSettings.lease_margin_seconds"),
    ("JobRetentionDays", {"MaxValue": None}, "needs a MaxValue"),
    ("DbSslMode", {"AllowedValues": ["", "require-unverified", "verify-every-thing"]},
     "AllowedValues has 'verify-every-thing'"),
    ("WorkerTimeoutSeconds", {"Default": 900}, "DEPLOYMENT_DEFAULTS lists 60.0"),
])
def test_a_parameter_the_library_would_refuse_is_reported_by_name(
    cfn: dict[str, Any], parameter: str, change: dict[str, Any], expected: str,
) -> None:
    changed = copy.deepcopy(cfn)
    for key, value in change.items():
        if value is None:
            del changed["Parameters"][parameter][key]
        else:
            changed["Parameters"][parameter][key] = value

    found = problems(changed)

    assert any(p.startswith(f"{parameter}: ") and expected in p for p in found), found


def test_a_literal_the_template_writes_is_read_by_its_setting(cfn: dict[str, Any]) -> None:
    literals = {(f.variable, f.literal) for f in feeds(cfn) if f.parameter is None}
    assert ("LEASEQ_DB_PORT", "5432") in literals
    assert {("LEASEQ_DB_IAM_AUTH", "true"), ("LEASEQ_DB_IAM_AUTH", "false")} <= literals

    changed = copy.deepcopy(cfn)
    variables = changed["Resources"]["ReaperFunction"]["Properties"]["Environment"]["Variables"]
    variables["LEASEQ_DB_PORT"] = "0"

    assert any(p.startswith("ReaperFunction LEASEQ_DB_PORT = '0'") for p in problems(changed))
