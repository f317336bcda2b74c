-- leaseq 0016: a duty group for the web dashboard, leaseq_dashboard.
--
-- Until now the deployed dashboard logged in as an operator (leaseq_operator): anyone
-- who could make it run a statement could prune every finished job at any age, or
-- cancel and redrive by tenant or kind filter, although its pages only read and act on
-- the jobs a person ticked. The new group gets exactly what the pages use
-- (sql/functions/read.sql and operate.sql grant it beside each function):
--   the operator reads   queue_depth, job_activity, list_jobs, get_job, job_timeline;
--   the by-id actions    redrive_jobs_by_id, cancel_jobs_by_id (1 .. 1000 ids a call,
--                        never a filter, never "every job").
-- No prune, no cancel or redrive by filter, no enqueue, no claim, no table.
--
-- Cluster-wide and NOLOGIN, created when absent, as the groups of 0010 are (the schema
-- owner needs CREATEROLE for that). A role that already exists under this name and can
-- log in is refused: the name is a group's, and a login by that name would be the
-- group. service_role does not become a member: it is the legacy group of the runtime
-- duties, and the dashboard is none of them.

do $$
begin
  if exists (select 1 from pg_catalog.pg_roles
             where rolname = 'leaseq_dashboard' and rolcanlogin) then
    raise exception using
      errcode = '55000',
      message = 'role leaseq_dashboard can log in, but that name is the NOLOGIN duty group of the web dashboard',
      hint = 'Move what logs in as leaseq_dashboard to a login of another name (the deployment template''s default is leaseq_dashboard_login), then make it NOLOGIN (ALTER ROLE leaseq_dashboard NOLOGIN) or drop it, and re-run the migration.';
  end if;
  if not exists (select 1 from pg_catalog.pg_roles where rolname = 'leaseq_dashboard') then
    create role leaseq_dashboard nologin;
  end if;
exception when insufficient_privilege then
  raise exception using
    errcode = '42501',
    message = format('role %I cannot create the duty group role leaseq_dashboard', current_user),
    hint = 'Create it once as an administrator (CREATE ROLE leaseq_dashboard NOLOGIN) or grant CREATEROLE to the schema owner, then re-run the migration.';
end
$$;

grant usage on schema app to leaseq_dashboard;
