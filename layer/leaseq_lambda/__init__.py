"""Lambda adapters of leaseq: the only package that imports Powertools or boto3.

* ``context``   LambdaDeadline (the invocation's remaining time) and the worker owner id;
* ``events``    pydantic models of the schedule ticks and enqueue events;
* ``runtime``   cold-start composition: settings, connection, handlers registry;
* ``telemetry`` Powertools logger and EMF metrics, fed by the library's reports;
* ``enqueue``   the enqueue function's per-item results;
* ``invoker``   the Lambda client for invoking other functions (honours
  ``AWS_ENDPOINT_URL_LAMBDA``).
* ``producer``  the producers' client: the enqueue function and the enqueue event bus;
* ``dead_letters`` the enqueue dead-letter queue's records, and resubmitting them;
* ``handlers_config`` the handlers' settings from the stack (``handlers_environment``);
* ``demo_handlers`` the demo's job handlers, for a first deployed stack and ``leaseq demo``.

The functions in ``functions/*/app.py`` are thin handlers built from these.
"""

from leaseq_lambda.handlers_config import handlers_environment

__all__ = ["handlers_environment"]
