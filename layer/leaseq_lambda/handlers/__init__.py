"""The Lambda functions' handlers, one module per function, each exposing ``lambda_handler``.

* ``worker``  the scheduled worker: pool join, drain, fan-out and hand-over;
* ``reaper``  the scheduled reaper pass;
* ``enqueue`` the enqueue function (direct invoke and EventBridge).

``functions/<name>/app.py`` (the template's ``Handler: app.lambda_handler``) re-exports
the module's handler, and ``leaseq drain`` and ``leaseq reap`` import the same modules.
This package imports none of them itself: a function pays only for its own module at
its cold start.
"""
