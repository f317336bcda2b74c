-- leaseq 0010: one group role per duty, so a login may do only what its duty needs.
--
-- Until now producers, workers, reapers and operators' tools shared service_role: any
-- runtime login could prune every finished job at once, cancel every tenant's jobs, or
-- enqueue into (and probe the operation keys of) any tenant. The groups (cluster-wide,
-- NOLOGIN, created when absent; the schema owner needs CREATEROLE for that, as the RDS
-- master user has):
--   leaseq_producer         enqueue into any tenant; read a job's state and result by
--                           tenant and id or tenant and operation key.
--   leaseq_tenant_producer  the same, only for the tenants app.tenant_producers binds
--                           the login to.
--   leaseq_worker           claim, renew, finish and give back jobs.
--   leaseq_reaper           release expired leases; prune, but never jobs younger than
--                           app.settings.min_retention (the owner sets it).
--   leaseq_operator         redrive, cancel, prune by any age, and the operator reads.
-- Which function each group may execute is granted beside the function in
-- sql/functions/; this file makes the roles, the tables and the schema usage.
--
-- service_role stays, for logins made before this release: it becomes a member of
-- producer, worker, reaper and operator (so those logins keep every right they had)
-- and loses what it held directly. It is deprecated: move each login to the group of
-- its duty, then revoke service_role from it (sql/README.md, "Upgrading from
-- service_role").
--
-- A role that already exists under one of these names and can log in is refused: the
-- names are groups, and a login among them (say a worker login that was called
-- leaseq_worker) would get every right of its group's members, and would make the
-- membership in service_role circular.

do $$
declare
  v_group text;
  v_login text;
begin
  select string_agg(rolname, ', ' order by rolname) into v_login
  from pg_catalog.pg_roles
  where rolname in ('leaseq_producer', 'leaseq_tenant_producer', 'leaseq_worker',
                    'leaseq_reaper', 'leaseq_operator')
    and rolcanlogin;
  if v_login is not null then
    raise exception using
      errcode = '55000',
      message = format('role(s) %s can log in, but these names are the NOLOGIN duty groups', v_login),
      hint = 'Earlier releases named logins leaseq_worker (the runtime login of the deployment template, the local command line''s login). Move what logs in as it to a login of another name, then make it NOLOGIN (ALTER ROLE ... NOLOGIN) or drop it, and re-run the migration.';
  end if;
  foreach v_group in array array['leaseq_producer', 'leaseq_tenant_producer', 'leaseq_worker',
                                 'leaseq_reaper', 'leaseq_operator'] loop
    if not exists (select 1 from pg_catalog.pg_roles where rolname = v_group) then
      execute format('create role %I nologin', v_group);
    end if;
  end loop;
  -- The legacy group keeps every runtime right through the duty groups (not the
  -- tenant-bound producer: it would only narrow nothing and confuse the check).
  foreach v_group in array array['leaseq_producer', 'leaseq_worker', 'leaseq_reaper',
                                 'leaseq_operator'] loop
    if not pg_catalog.pg_has_role('service_role', v_group, 'MEMBER') then
      execute format('grant %I to service_role', v_group);
    end if;
  end loop;
exception when insufficient_privilege then
  raise exception using
    errcode = '42501',
    message = format('role %I cannot create the duty group roles leaseq_producer, leaseq_tenant_producer, leaseq_worker, leaseq_reaper and leaseq_operator, or grant them to service_role', current_user),
    hint = 'Create them once as an administrator (CREATE ROLE leaseq_producer NOLOGIN; CREATE ROLE leaseq_tenant_producer NOLOGIN; CREATE ROLE leaseq_worker NOLOGIN; CREATE ROLE leaseq_reaper NOLOGIN; CREATE ROLE leaseq_operator NOLOGIN; GRANT leaseq_producer, leaseq_worker, leaseq_reaper, leaseq_operator TO service_role) or grant CREATEROLE to the schema owner, then re-run the migration.';
end
$$;

revoke all on schema app from service_role;
grant usage on schema app to leaseq_producer, leaseq_tenant_producer, leaseq_worker,
  leaseq_reaper, leaseq_operator;

-- Bindings name a role by its OID (regrole), not by its name: a role dropped and
-- re-created under the same name is a new role and inherits none of the old one's
-- tenants. Bindings of roles that no longer exist granted nothing to anyone but a
-- future role of that name; they are deleted here rather than carried over.
drop policy tenant_readers_self on app.tenant_readers;
delete from app.tenant_readers r
where not exists (select 1 from pg_catalog.pg_roles x where x.rolname = r.role_name);
alter table app.tenant_readers
  alter column role_name type regrole using pg_catalog.quote_ident(role_name)::regrole;
create policy tenant_readers_self on app.tenant_readers
  for select to authenticated
  using (role_name = (select r.oid from pg_catalog.pg_roles r where r.rolname = current_user));

-- Tenant-bound producers: the tenants a leaseq_tenant_producer login may enqueue into
-- and read. Only the owner reads or writes it; the enqueue and result functions look
-- it up as the owner.
create table app.tenant_producers (
  role_name regrole not null,
  tenant_id uuid not null,
  created_at timestamptz not null default clock_timestamp(),
  constraint tenant_producers_pkey primary key (role_name, tenant_id)
);
revoke all on app.tenant_producers from public;

-- Settings the owner controls and the functions read. One row.
--   min_retention  the reaper's prune (app.prune_retained_jobs) refuses to delete jobs
--                  that finished more recently than this; operators (app.prune_jobs)
--                  are not bound by it.
create table app.settings (
  singleton boolean primary key default true constraint settings_one_row check (singleton),
  min_retention interval not null default interval '1 day'
    constraint settings_min_retention_range
    check (min_retention between interval '0 seconds' and interval '3650 days'),
  updated_at timestamptz not null default clock_timestamp()
);
insert into app.settings default values;
revoke all on app.settings from public;
