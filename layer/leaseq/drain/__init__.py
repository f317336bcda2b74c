"""The worker's drain: claim jobs, run their handlers within the time left, and record
every outcome. ``worker`` picks a strategy (``in_turn`` or ``slots``); both take the
steps in ``steps``; nothing below calls back up."""
