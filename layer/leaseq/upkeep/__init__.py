"""The reaper's upkeep: end sessions past their caps, expire leases, tick schedules, and
delete finished jobs past their retention."""
