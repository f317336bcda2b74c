"""Worker processes: each drains jobs with one queue's own worker code.

Every worker speaks the same line protocol with the orchestrator on stdin/stdout:
it prints ``ready`` once connected, waits for ``go``, drains, prints ``done <jobs> <peak RSS KiB>``,
then keeps its connections open until ``quit`` so the server-side meters can be read
while its backends still exist.
"""
