"""The ground every duty stands on: the values that cross the library's boundary (jobs,
results, schedules, pool sizes), the SQL contract's bounds, deadlines, and the one
exception tree. Nothing here talks to PostgreSQL or runs a handler."""
