"""The functions of a SAM template, as the local Lambda service runs them.

``template.yaml`` stays the one definition of every function: handler, code folder,
timeout, memory, environment, reserved concurrency, asynchronous retry settings and
schedules are read from it, with ``Globals`` applied as SAM applies them. Intrinsic
functions are resolved where the template alone decides the answer: parameters (their
defaults or the given overrides), pseudo parameters, conditions, ``!If``, ``!Sub``,
``!Join``, ``!Select``, ``!Split``, and ``!Ref`` / ``!GetAtt ....Arn`` of the template's
own functions (their local name and ARN). What exists only once deployed, such as an RDS
Proxy endpoint or an SSM parameter, stays *unresolved*: the variable is left out and the
reason is kept, so the service can say what it overrides (see ``overrides.py``).

The YAML loader is written here rather than borrowed: CloudFormation's short tags
(``!Ref``, ``!GetAtt``, ``!Sub``...) are a handful of PyYAML constructors, whereas
cfn-lint's loader would bring the whole linter and its data into a runtime tool.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

#: The account id and region of local ARNs unless the service is told otherwise.
DEFAULT_ACCOUNT = "123456789012"
DEFAULT_REGION = "us-east-1"
#: Lambda's own defaults for what a template leaves out.
DEFAULT_TIMEOUT = 3
DEFAULT_MEMORY = 128
DEFAULT_MAX_RETRY_ATTEMPTS = 2
DEFAULT_MAX_EVENT_AGE = 21_600
FUNCTION_TYPES = ("AWS::Serverless::Function",)


class TemplateError(Exception):
    """The template cannot be run locally; the message names the resource and the fix."""


# The loader ------------------------------------------------------------------------------


class _CloudFormationLoader(yaml.SafeLoader):
    """PyYAML's safe loader plus CloudFormation's short tags, read as their long forms."""


def _short_tag(long_name: str) -> Any:
    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> dict[str, Any]:
        value: Any
        if isinstance(node, yaml.ScalarNode):
            value = loader.construct_scalar(node)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            assert isinstance(node, yaml.MappingNode)
            value = loader.construct_mapping(node, deep=True)
        if long_name == "Fn::GetAtt" and isinstance(value, str):
            value = value.split(".", 1)
        return {long_name: value}

    return construct


for _name in ("Ref", "Condition"):
    _CloudFormationLoader.add_constructor(f"!{_name}", _short_tag(_name))
for _name in ("And", "Base64", "Cidr", "Equals", "FindInMap", "GetAZs", "GetAtt", "If",
              "ImportValue", "Join", "Length", "Not", "Or", "Select", "Split", "Sub",
              "ToJsonString", "Transform",
              # The functions of a template's Rules (read, never evaluated here).
              "Contains", "EachMemberEquals", "EachMemberIn", "RefAll", "ValueOf",
              "ValueOfAll"):
    _CloudFormationLoader.add_constructor(f"!{_name}", _short_tag(f"Fn::{_name}"))


def load_yaml(text: str) -> Any:
    """Parse CloudFormation YAML (short tags become ``{"Fn::...": ...}``)."""
    return yaml.load(text, Loader=_CloudFormationLoader)  # noqa: S506 - a SafeLoader subclass


# Resolving intrinsic functions -----------------------------------------------------------


@dataclass(frozen=True)
class Unresolved:
    """A value only AWS knows (a deployed resource's attribute, an SSM parameter...)."""

    reason: str


class _NoValue:
    """``!Ref AWS::NoValue``: the property is removed."""

    def __repr__(self) -> str:
        return "AWS::NoValue"


NO_VALUE = _NoValue()


def function_arn(name: str, region: str = DEFAULT_REGION, account: str = DEFAULT_ACCOUNT) -> str:
    """The ARN a local function answers to (and that ``!GetAtt Fn.Arn`` resolves to)."""
    return f"arn:aws:lambda:{region}:{account}:function:{name}"


class _Resolver:
    def __init__(self, template: Mapping[str, Any], parameters: Mapping[str, Any],
                 region: str, account: str, stack_name: str) -> None:
        self.resources: Mapping[str, Any] = template.get("Resources") or {}
        self.condition_definitions: Mapping[str, Any] = template.get("Conditions") or {}
        self.parameters = parameters
        self.region = region
        self.account = account
        self.pseudo: dict[str, Any] = {
            "AWS::Region": region, "AWS::AccountId": account, "AWS::StackName": stack_name,
            "AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": f"arn:aws:cloudformation:{region}:{account}:stack/{stack_name}/local",
            "AWS::NoValue": NO_VALUE,
        }
        self._conditions: dict[str, Any] = {}

    def is_function(self, name: str) -> bool:
        resource = self.resources.get(name)
        return isinstance(resource, Mapping) and resource.get("Type") in FUNCTION_TYPES

    def condition(self, name: str) -> Any:
        if name not in self._conditions:
            if name not in self.condition_definitions:
                raise TemplateError(f"condition {name!r} is not defined in Conditions")
            self._conditions[name] = Unresolved(f"condition {name} (evaluating)")
            self._conditions[name] = self.resolve(self.condition_definitions[name])
        return self._conditions[name]

    def ref(self, name: str) -> Any:
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        if self.is_function(name):
            return name
        return Unresolved(f"!Ref {name}")

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            items = [self.resolve(item) for item in value]
            return [item for item in items if item is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, arg),) = value.items()
            if key == "Ref":
                return self.ref(str(arg))
            if key == "Condition":
                return self.condition(str(arg))
            if key == "Fn::GetAtt":
                resource, attribute = [*list(arg), ""][:2]
                if self.is_function(resource) and attribute == "Arn":
                    return function_arn(resource, self.region, self.account)
                return Unresolved(f"!GetAtt {resource}.{attribute}")
            if key == "Fn::If":
                chosen = self.condition(str(arg[0]))
                if isinstance(chosen, Unresolved):
                    return chosen
                return self.resolve(arg[1] if chosen else arg[2])
            if key == "Fn::Equals":
                left, right = (self.resolve(side) for side in arg)
                return _first_unresolved(left, right) or _text(left) == _text(right)
            if key in ("Fn::And", "Fn::Or", "Fn::Not"):
                parts = [self.resolve(part) for part in arg]
                missing = _first_unresolved(*parts)
                if missing:
                    return missing
                if key == "Fn::Not":
                    return not parts[0]
                return all(parts) if key == "Fn::And" else any(parts)
            if key == "Fn::Sub":
                return self.substitute(arg)
            if key == "Fn::Join":
                delimiter, items = arg[0], self.resolve(arg[1])
                if isinstance(items, Unresolved):
                    return items
                return _first_unresolved(*items) or str(delimiter).join(_text(i) for i in items)
            if key == "Fn::Select":
                index, items = self.resolve(arg[0]), self.resolve(arg[1])
                return _first_unresolved(index, items) or items[int(index)]
            if key == "Fn::Split":
                delimiter, text = arg[0], self.resolve(arg[1])
                return _first_unresolved(text) or _text(text).split(str(delimiter))
            if key.startswith("Fn::"):
                return Unresolved(f"!{key[4:]} (not resolved locally)")
        resolved = {k: self.resolve(v) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not NO_VALUE}

    def substitute(self, arg: Any) -> Any:
        text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
        local = {name: self.resolve(v) for name, v in dict(variables).items()}
        missing: list[Unresolved] = []

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in local:
                found = local[name]
            elif "." in name:
                found = self.resolve({"Fn::GetAtt": name.split(".", 1)})
            else:
                found = self.ref(name)
            if isinstance(found, Unresolved):
                missing.append(found)
                return ""
            return _text(found)

        result = re.sub(r"\$\{([^}]+)\}", replace, str(text))
        return missing[0] if missing else result


def _first_unresolved(*values: Any) -> Unresolved | None:
    for value in values:
        if isinstance(value, Unresolved):
            return value
        if isinstance(value, list):
            found = _first_unresolved(*value)
            if found:
                return found
    return None


def _text(value: Any) -> str:
    """A scalar as CloudFormation passes it on: strings as they are, true/false in lower case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# Functions --------------------------------------------------------------------------------

_RATE = re.compile(r"^rate\((\d+) (minute|minutes|hour|hours|day|days)\)$")
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86_400}


def rate_seconds(expression: str) -> float | None:
    """The period of an EventBridge ``rate(...)`` expression; None for ``cron(...)``."""
    match = _RATE.match(expression.strip())
    if match is None:
        return None
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2).rstrip("s")]


@dataclass(frozen=True)
class Schedule:
    """One ``Schedule`` (EventBridge rule) or ``ScheduleV2`` (EventBridge Scheduler) event."""

    event_name: str
    kind: Literal["Schedule", "ScheduleV2"]
    expression: str
    period_seconds: float | None
    enabled: bool
    input: str | None


@dataclass(frozen=True)
class FunctionSpec:
    """Everything the service needs to run one function as Lambda would."""

    name: str
    handler: str
    code_dir: Path
    runtime: str
    timeout_seconds: int
    memory_mb: int
    environment: Mapping[str, str]
    #: Variables the template sets to something only AWS knows: name → why.
    unresolved_environment: Mapping[str, str]
    reserved_concurrency: int | None
    max_retry_attempts: int
    max_event_age_seconds: int
    schedules: tuple[Schedule, ...] = ()
    #: A ``Custom::`` resource's ServiceToken names this function (it provisions, e.g.
    #: the migrations): locally it gets the schema owner's database login.
    custom_resource_provider: bool = False
    #: Other names it answers to (its FunctionName property, if any).
    aliases: frozenset[str] = field(default_factory=frozenset)
    #: Events the service does not emulate (EventBridge rules on a bus, APIs...).
    ignored_events: tuple[str, ...] = ()


@dataclass(frozen=True)
class Template:
    """The runnable functions of a template and where it lives."""

    path: Path
    functions: Mapping[str, FunctionSpec]
    region: str
    account: str
    #: The local ContentUri folders of the template's layers, which Lambda would put on
    #: the functions' path (``/opt/python``).
    layer_dirs: tuple[Path, ...] = ()


def _parameter_values(template: Mapping[str, Any],
                      overrides: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, definition in (template.get("Parameters") or {}).items():
        kind = str(definition.get("Type", "String"))
        if name in overrides:
            raw: Any = overrides[name]
        elif "Default" in definition and not kind.startswith("AWS::SSM::Parameter"):
            raw = definition["Default"]
        else:
            values[name] = Unresolved(f"parameter {name} (no default usable locally)")
            continue
        if kind == "CommaDelimitedList" or kind.startswith("List<"):
            values[name] = [] if _text(raw) == "" else [p.strip() for p in _text(raw).split(",")]
        else:
            values[name] = _text(raw)
    unknown = sorted(set(overrides) - set(values))
    if unknown:
        raise TemplateError(f"parameter overrides name unknown parameters: {', '.join(unknown)}")
    return values


def _merged(globals_: Mapping[str, Any], properties: Mapping[str, Any]) -> dict[str, Any]:
    merged = {**globals_, **properties}
    global_env = (globals_.get("Environment") or {}).get("Variables") or {}
    own_env = (properties.get("Environment") or {}).get("Variables") or {}
    merged["Environment"] = {"Variables": {**global_env, **own_env}}
    return merged


def _integer(value: Any, what: str) -> int:
    if isinstance(value, Unresolved):
        raise TemplateError(f"{what} is {value.reason}: give it a value with a parameter override")
    try:
        return int(_text(value))
    except ValueError as exc:
        raise TemplateError(f"{what} must be a whole number, not {value!r}") from exc


def _schedules(name: str, events: Mapping[str, Any]) -> tuple[list[Schedule], list[str]]:
    schedules: list[Schedule] = []
    ignored: list[str] = []
    for event_name, event in events.items():
        kind = event.get("Type")
        props = event.get("Properties") or {}
        if kind not in ("Schedule", "ScheduleV2"):
            ignored.append(f"{event_name} ({kind})")
            continue
        # SAM names the expression Schedule on a rule, ScheduleExpression on Scheduler.
        expression = props.get("Schedule" if kind == "Schedule" else "ScheduleExpression")
        if not isinstance(expression, str):
            raise TemplateError(f"{name}.Events.{event_name}: ScheduleExpression is "
                                f"{getattr(expression, 'reason', expression)!r}")
        state = props.get("State", "ENABLED")
        enabled = props.get("Enabled", True)
        if isinstance(state, Unresolved) or isinstance(enabled, Unresolved):
            raise TemplateError(f"{name}.Events.{event_name}: its state is not known locally")
        payload = props.get("Input")
        schedules.append(Schedule(
            event_name, kind, expression, rate_seconds(expression),
            _text(state).upper() == "ENABLED" and _text(enabled).lower() != "false",
            payload if isinstance(payload, str) else None))
    return schedules, ignored


def _function(name: str, properties: Mapping[str, Any], root: Path,
              providers: set[str]) -> FunctionSpec:
    runtime = _text(properties.get("Runtime", ""))
    if not runtime.startswith("python"):
        raise TemplateError(f"{name}: runtime {runtime or '(none)'!r}; only Python functions "
                            "run in the local service")
    handler = properties.get("Handler")
    if not isinstance(handler, str) or "." not in handler:
        raise TemplateError(f"{name}: Handler must be module.function, not {handler!r}")
    code_uri = properties.get("CodeUri")
    if not isinstance(code_uri, str) or code_uri.startswith("s3://"):
        raise TemplateError(f"{name}: CodeUri must be a local folder, not {code_uri!r}")
    code_dir = (root / code_uri).resolve()
    if not code_dir.is_dir():
        raise TemplateError(f"{name}: CodeUri {code_uri} is not a folder next to the template")
    environment: dict[str, str] = {}
    unresolved: dict[str, str] = {}
    for key, value in properties["Environment"]["Variables"].items():
        if isinstance(value, Unresolved):
            unresolved[key] = value.reason
        else:
            environment[key] = _text(value)
    reserved = properties.get("ReservedConcurrentExecutions")
    invoke_config = properties.get("EventInvokeConfig") or {}
    schedules, ignored = _schedules(name, properties.get("Events") or {})
    own_name = properties.get("FunctionName")
    return FunctionSpec(
        name=name, handler=handler, code_dir=code_dir, runtime=runtime,
        timeout_seconds=_integer(properties.get("Timeout", DEFAULT_TIMEOUT), f"{name}.Timeout"),
        memory_mb=_integer(properties.get("MemorySize", DEFAULT_MEMORY), f"{name}.MemorySize"),
        environment=environment, unresolved_environment=unresolved,
        reserved_concurrency=None if reserved is None else _integer(
            reserved, f"{name}.ReservedConcurrentExecutions"),
        max_retry_attempts=_integer(invoke_config.get("MaximumRetryAttempts",
                                                      DEFAULT_MAX_RETRY_ATTEMPTS),
                                    f"{name}.EventInvokeConfig.MaximumRetryAttempts"),
        max_event_age_seconds=_integer(invoke_config.get("MaximumEventAgeInSeconds",
                                                         DEFAULT_MAX_EVENT_AGE),
                                       f"{name}.EventInvokeConfig.MaximumEventAgeInSeconds"),
        schedules=tuple(schedules), custom_resource_provider=name in providers,
        aliases=frozenset({own_name} if isinstance(own_name, str) else ()),
        ignored_events=tuple(ignored))


def _providers(resources: Mapping[str, Any]) -> set[str]:
    """Functions that serve a custom resource: ``ServiceToken: !GetAtt Fn.Arn``."""
    found: set[str] = set()
    for resource in resources.values():
        if str(resource.get("Type", "")).startswith("Custom::") or \
                resource.get("Type") == "AWS::CloudFormation::CustomResource":
            token = (resource.get("Properties") or {}).get("ServiceToken")
            if isinstance(token, dict) and "Fn::GetAtt" in token:
                found.add(str(token["Fn::GetAtt"][0]))
    return found


def load_template(path: Path, parameter_overrides: Mapping[str, str] | None = None, *,
                  region: str = DEFAULT_REGION, account: str = DEFAULT_ACCOUNT,
                  stack_name: str = "leaseq-local") -> Template:
    """Read ``path`` and return its Python functions, resolved as far as a template can be."""
    try:
        document = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TemplateError(f"cannot read {path}: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("Resources"), dict):
        raise TemplateError(f"{path} has no Resources")
    parameters = _parameter_values(document, parameter_overrides or {})
    resolver = _Resolver(document, parameters, region, account, stack_name)
    globals_ = resolver.resolve(((document.get("Globals") or {}).get("Function")) or {})
    providers = _providers(document["Resources"])
    functions: dict[str, FunctionSpec] = {}
    for name, resource in document["Resources"].items():
        if resource.get("Type") not in FUNCTION_TYPES:
            continue
        condition = resource.get("Condition")
        if condition is not None and resolver.condition(condition) is not True:
            continue
        properties = _merged(globals_, resolver.resolve(resource.get("Properties") or {}))
        functions[name] = _function(name, properties, path.parent, providers)
    # One folder once, however many layers build from it (one per architecture, say).
    layers = tuple(dict.fromkeys(
        (path.parent / str(resource["Properties"]["ContentUri"])).resolve()
        for resource in document["Resources"].values()
        if resource.get("Type") == "AWS::Serverless::LayerVersion"
        and isinstance((resource.get("Properties") or {}).get("ContentUri"), str)
        and (path.parent / str(resource["Properties"]["ContentUri"])).is_dir()))
    return Template(path.resolve(), functions, region, account, layers)
