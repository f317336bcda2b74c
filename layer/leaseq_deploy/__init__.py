"""The deploy: the migrations custom resource that CloudFormation calls on every create and
update of the stack. It applies ``sql/`` as the schema owner, writes the worker pool's
limits, and makes each function's login a member of its one duty group (the dashboard's
reader logins too), after checking what the stack asks of the database.

It stands on top of the layer: it provisions the logins of every function, the
dashboard's among them, so it knows their names; no runtime code imports it. Its handler
is :mod:`leaseq_deploy.function`; importing the package, the handler and
:mod:`leaseq_deploy.cfn_response` needs the standard library alone, so a request is
answered even when the rest of the layer cannot be imported.
"""
