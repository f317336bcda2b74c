"""A local Lambda service: the template's functions, run as Lambda runs them.

Each execution environment is a process running awslambdaric (the real runtime interface
client) against a Runtime API of its own; the service serves the Lambda Invoke API on
127.0.0.1 for boto3 (``endpoint_url`` or ``AWS_ENDPOINT_URL_LAMBDA``), honours timeouts,
reserved concurrency and ``EventInvokeConfig``, queues asynchronous invokes and fires the
schedules. A developer tool: it never ships in the Lambda layer. See docs/local-lambda.md.

* ``template``     the functions of a SAM template, intrinsics resolved where possible;
* ``overrides``    the local values for what exists only in AWS; the process environment;
* ``runtime_api``  the Runtime API one environment's runtime talks to;
* ``environment``  one execution environment (process, deadline, freeze, kill);
* ``service``      warm pools, concurrency, the asynchronous queue, statistics;
* ``invoke_api``   the Invoke API over HTTP, plus ``/local/stats``;
* ``schedules``    the template's schedules, fired as asynchronous invokes;
* ``watchdog``     kills the environments of a service that died without closing them;
* ``server``       all of it together: ``LocalLambda(LocalConfig(...))``.
"""

from leaseq_lambda_local.server import LocalConfig, LocalLambda, LogWriter
from leaseq_lambda_local.template import FunctionSpec, Template, TemplateError, load_template

__all__ = ["FunctionSpec", "LocalConfig", "LocalLambda", "LogWriter", "Template",
           "TemplateError", "load_template"]
