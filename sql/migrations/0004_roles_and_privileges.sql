-- leaseq 0004: roles, row-level security and least privilege.
--
-- Roles (cluster-wide, created NOLOGIN when absent; the schema owner needs CREATEROLE
-- for that, as the RDS master user has):
--   service_role   workers, reapers, producers, operators' tools: EXECUTE on the queue
--                  functions and nothing else; no table privileges at all.
--   authenticated  tenant readers: SELECT on jobs and events (never a lease token),
--                  rows limited to the one tenant the reader is bound to.
--
-- Why RLS is enabled but not FORCED: the SECURITY DEFINER functions run as the schema
-- owner, and a forced policy set with only SELECT policies made every one of them see
-- and change nothing when the owner is not a superuser (reference defects 2 and 3).
-- The owner is the administrator of this schema; every other role goes through RLS.
--
-- Why readers are bound in app.tenant_readers: the reference trusted the setting
-- app.tenant_id, which any session may set to any value (defect 10). The setting now
-- only selects among the tenants the role was bound to by the owner; a missing,
-- malformed or unbound value shows no rows rather than an error.

do $$
begin
  if not exists (select 1 from pg_roles where rolname = 'service_role') then
    create role service_role nologin;
  end if;
  if not exists (select 1 from pg_roles where rolname = 'authenticated') then
    create role authenticated nologin;
  end if;
exception when insufficient_privilege then
  raise exception using
    errcode = '42501',
    message = format('role %I cannot create the group roles service_role and authenticated', current_user),
    hint = 'Create them once as an administrator (CREATE ROLE service_role NOLOGIN; CREATE ROLE authenticated NOLOGIN) or grant CREATEROLE to the schema owner, then re-run the migration.';
end
$$;

create table app.tenant_readers (
  role_name text not null,
  tenant_id uuid not null,
  created_at timestamptz not null default clock_timestamp(),
  constraint tenant_readers_pkey primary key (role_name, tenant_id)
);
alter table app.tenant_readers enable row level security;
create policy tenant_readers_self on app.tenant_readers
  for select to authenticated
  using (role_name = current_user);

create or replace function app.current_tenant_id()
returns uuid
language plpgsql
stable
set search_path = ''
as $$
declare
  -- Only the hex digits are cast: surrounding whitespace of any kind (not just spaces,
  -- which is all btrim removes) would make the uuid cast raise instead of match.
  v_hex text := (regexp_match(
    current_setting('app.tenant_id', true),
    '^\s*([0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12})\s*$',
    'i'))[1];
  v_tenant uuid;
begin
  if v_hex is null then
    return null;
  end if;
  v_tenant := v_hex::uuid;
  if exists (select 1 from app.tenant_readers r
             where r.role_name = current_user and r.tenant_id = v_tenant) then
    return v_tenant;
  end if;
  return null;
end;
$$;

alter table app.jobs no force row level security;
alter table app.jobs enable row level security;
alter table app.job_events no force row level security;
alter table app.job_events enable row level security;

drop policy if exists jobs_tenant_select on app.jobs;
drop policy if exists job_events_tenant_select on app.job_events;
-- The sub-select makes the tenant an InitPlan, computed once per query, not per row.
create policy jobs_tenant_select on app.jobs
  for select to authenticated
  using (tenant_id = (select app.current_tenant_id()));
create policy job_events_tenant_select on app.job_events
  for select to authenticated
  using (tenant_id = (select app.current_tenant_id()));

-- PUBLIC gets nothing here, now or for objects later migrations create (defect 8).
revoke all on schema app from public;
revoke all on all tables in schema app from public;
revoke all on all sequences in schema app from public;
revoke all on all functions in schema app from public;
alter default privileges in schema app revoke execute on functions from public;

-- Reference grants that are too wide: whole-table SELECT exposed lease tokens.
revoke all on app.jobs, app.job_events from authenticated;

grant usage on schema app to service_role, authenticated;

grant select (
  id, tenant_id, operation_key, kind, payload, state, attempts, max_attempts,
  available_at, lease_owner, lease_expires_at, last_error, result,
  created_at, updated_at, completed_at, correlation_id
) on app.jobs to authenticated;
grant select (
  sequence, id, tenant_id, job_id, event_type, actor, details, created_at
) on app.job_events to authenticated;
grant select on app.tenant_readers to authenticated;
grant execute on function app.current_tenant_id() to authenticated;

grant execute on function
  app.enqueue_job(uuid, text, text, jsonb, timestamptz, integer),
  app.enqueue_jobs(uuid[], text[], text[], jsonb[], timestamptz[], integer[], text[]),
  app.claim_jobs(uuid, text, integer, interval),
  app.claim_ready_jobs(text, integer, interval),
  app.ready_tenants(integer),
  app.renew_job_lease(uuid, uuid, text, uuid, interval),
  app.complete_job(uuid, uuid, text, uuid, jsonb),
  app.fail_job(uuid, uuid, text, uuid, jsonb, interval),
  app.discard_job(uuid, uuid, text, uuid, jsonb),
  app.finish_jobs(text, uuid[], uuid[], uuid[], text[], jsonb[], interval[]),
  app.release_expired_jobs(uuid, integer),
  app.release_all_expired_jobs(integer)
to service_role;
