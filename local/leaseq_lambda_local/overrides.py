"""What differs locally: the values that exist only in AWS, and the process environment.

A function's variables are the template's (``Environment.Variables`` with ``Globals``
applied) with these local overrides, in this order:

1. **Database.** Every database variable of the template (``LEASEQ_DB_*``,
   ``LEASEQ_DATABASE_SECRET_ARN``; in AWS an RDS Proxy host, an IAM login or a secret) is
   replaced by ``DATABASE_URL``: the runtime role's DSN for the runtime functions, the
   schema owner's for a function that serves a ``Custom::`` resource (the migrations).
2. **Handlers.** ``LEASEQ_HANDLERS``, when one is given (the template leaves it to the
   deployer's ``HandlersModule`` parameter).
3. **Explicit variables**, in the shape of ``sam local --env-vars``: ``{"Parameters":
   {...}}`` for every function, ``{"FunctionLogicalId": {...}}`` for one.

Variables still unresolved after that (they name a deployed resource) are left out and
reported. The process then gets what Lambda sets for every function: ``LAMBDA_TASK_ROOT``,
``AWS_LAMBDA_FUNCTION_NAME`` / ``_VERSION`` / ``_MEMORY_SIZE``, ``AWS_LAMBDA_LOG_GROUP_NAME``,
``AWS_REGION``, ``AWS_EXECUTION_ENV``, ``TZ=:UTC``; placeholder credentials (no IAM here,
and a function must never reach real AWS with the developer's own); and
``AWS_ENDPOINT_URL_LAMBDA`` pointing back at this service, so a function's boto3 Lambda
client invokes its siblings here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from leaseq_lambda_local.template import FunctionSpec

#: Placeholder credentials: boto3 signs with them; nothing checks them locally.
PLACEHOLDER_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "LOCALLAMBDAKEY",
                           "AWS_SECRET_ACCESS_KEY": "local-lambda-service-secret",
                           "AWS_SESSION_TOKEN": "local-lambda-service-token"}
#: Variables of the parent process a runtime keeps (everything else is Lambda's or the
#: template's).
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")


def is_database_variable(name: str) -> bool:
    """A variable that says where and how to log in to the database."""
    return name in ("DATABASE_URL", "LEASEQ_DATABASE_SECRET_ARN") or name.startswith("LEASEQ_DB_")


def function_variables(spec: FunctionSpec, *, database_url: str | None = None,
                       owner_database_url: str | None = None, handlers: str | None = None,
                       env_vars: Mapping[str, Mapping[str, str]] | None = None,
                       ) -> tuple[dict[str, str], list[str]]:
    """The function's variables after the local overrides, and a line per override."""
    variables = dict(spec.environment)
    notes: list[str] = []
    unresolved = dict(spec.unresolved_environment)
    url = owner_database_url if spec.custom_resource_provider else database_url
    if url:
        replaced = sorted(k for k in {*variables, *unresolved} if is_database_variable(k))
        for key in replaced:
            variables.pop(key, None)
            unresolved.pop(key, None)
        variables["DATABASE_URL"] = url
        role = "schema owner" if spec.custom_resource_provider else "runtime role"
        notes.append(f"DATABASE_URL ({role}) instead of {', '.join(replaced) or 'nothing'}")
    if handlers and not spec.custom_resource_provider:
        variables["LEASEQ_HANDLERS"] = handlers
        notes.append(f"LEASEQ_HANDLERS={handlers}")
    explicit = {**(env_vars or {}).get("Parameters", {}), **(env_vars or {}).get(spec.name, {})}
    for key, value in explicit.items():
        variables[key] = str(value)
        unresolved.pop(key, None)
    if explicit:
        notes.append(f"from --env-vars: {', '.join(sorted(explicit))}")
    for key, reason in sorted(unresolved.items()):
        notes.append(f"{key} left out: {reason} exists only in AWS")
    return variables, notes


def process_environment(spec: FunctionSpec, variables: Mapping[str, str], *,
                        endpoint_url: str, region: str, python_path: Sequence[Path]
                        ) -> dict[str, str]:
    """The complete environment of one runtime process."""
    env = {key: os.environ[key] for key in INHERITED if key in os.environ}
    env.update(PLACEHOLDER_CREDENTIALS)
    env["AWS_ENDPOINT_URL_LAMBDA"] = endpoint_url
    env.update(variables)
    path = [str(spec.code_dir), *(str(p) for p in python_path)]
    env.update({
        "LAMBDA_TASK_ROOT": str(spec.code_dir),
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(path)),
        "AWS_EXECUTION_ENV": f"AWS_Lambda_python{sys.version_info.major}."
                             f"{sys.version_info.minor}",
        "AWS_LAMBDA_FUNCTION_NAME": spec.name,
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{spec.name}",
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        "TZ": ":UTC",
        # Lambda's own runtime is not a preview; say nothing about it on newer Pythons.
        "LAMBDA_DISABLE_PREVIEW_WARN": "1",
    })
    return env
