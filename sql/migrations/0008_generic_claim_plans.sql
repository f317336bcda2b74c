-- leaseq 0008: the claim functions plan their statements once per session, not per call.
--
-- PL/pgSQL caches each statement's plan, but a statement with parameters is planned
-- again for every call (a "custom" plan) for as long as the planner's estimate of the
-- reusable "generic" plan looks costlier. The claim statements always look costlier
-- generically (their LIMIT and due-time cut-off are parameters), so every claim paid
-- for planning its statements: measured with bench/, about 15% of the server's CPU per
-- job in a no-op drain. Their best plan does not depend on the values: walk
-- jobs_claimable_idx of one tenant in (available_at, created_at, id) order, lock with
-- SKIP LOCKED, stop at the limit; the tenant list is a loose index scan of the same
-- index. tests/sql/test_query_plans.py checks exactly those plans, on a large table.
--
-- finish_jobs is left alone: the same measurement found no gain there.

alter function app.ready_tenants(integer)
  set plan_cache_mode = force_generic_plan;
alter function app.claim_locked_jobs(uuid[], text, interval, timestamptz)
  set plan_cache_mode = force_generic_plan;
alter function app.claim_jobs(uuid, text, integer, interval)
  set plan_cache_mode = force_generic_plan;
alter function app.claim_ready_jobs(text, integer, interval)
  set plan_cache_mode = force_generic_plan;
