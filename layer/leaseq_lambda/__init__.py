"""Lambda adapters of leaseq: the only package that imports Powertools or boto3.

* ``context``   LambdaDeadline (the invocation's remaining time) and the worker owner id;
* ``events``    pydantic models of the schedule ticks and enqueue events;
* ``runtime``   cold-start composition: settings, connection, handlers registry;
* ``telemetry`` Powertools logger and EMF metrics, fed by the library's reports;
* ``enqueue``   the enqueue function's per-item results;
* ``invoker``   the Lambda client for invoking other functions (honours
  ``AWS_ENDPOINT_URL_LAMBDA``).

The functions in ``functions/*/app.py`` are thin handlers built from these.
"""
