"""What each ``leaseq`` subcommand does. Parsing lives in main.py, output in render.py."""

from leaseq_cli.commands.dashboard import cmd_dashboard
from leaseq_cli.commands.database import (
    cmd_db_start,
    cmd_db_status,
    cmd_db_stop,
    cmd_db_url,
    cmd_migrate,
)
from leaseq_cli.commands.enqueue import cmd_enqueue, cmd_enqueue_resubmit
from leaseq_cli.commands.limits import (
    cmd_limits_list,
    cmd_limits_remove,
    cmd_limits_set,
    cmd_limits_sync,
)
from leaseq_cli.commands.operate import cmd_cancel, cmd_dead_retry, cmd_prune
from leaseq_cli.commands.queues import cmd_queues_list, cmd_queues_pause, cmd_queues_resume
from leaseq_cli.commands.run import cmd_demo, cmd_drain, cmd_reap
from leaseq_cli.commands.schedules import (
    cmd_schedules_add,
    cmd_schedules_list,
    cmd_schedules_pause,
    cmd_schedules_remove,
    cmd_schedules_resume,
    cmd_schedules_sync,
)
from leaseq_cli.commands.views import cmd_dead_list, cmd_jobs_show, cmd_status

__all__ = [
    "cmd_cancel",
    "cmd_dashboard",
    "cmd_db_start",
    "cmd_db_status",
    "cmd_db_stop",
    "cmd_db_url",
    "cmd_dead_list",
    "cmd_dead_retry",
    "cmd_demo",
    "cmd_drain",
    "cmd_enqueue",
    "cmd_enqueue_resubmit",
    "cmd_jobs_show",
    "cmd_limits_list",
    "cmd_limits_remove",
    "cmd_limits_set",
    "cmd_limits_sync",
    "cmd_migrate",
    "cmd_prune",
    "cmd_queues_list",
    "cmd_queues_pause",
    "cmd_queues_resume",
    "cmd_reap",
    "cmd_schedules_add",
    "cmd_schedules_list",
    "cmd_schedules_pause",
    "cmd_schedules_remove",
    "cmd_schedules_resume",
    "cmd_schedules_sync",
    "cmd_status",
]
