-- leaseq functions: which tenant a reader session may see, and which tenants a
-- tenant-bound producer may write to.
--
-- Row-level security on app.jobs, app.job_events and app.tenant_readers calls
-- app.current_tenant_id(). It runs as the reader (not SECURITY DEFINER): the setting
-- app.tenant_id only selects among the tenants the owner bound the role to in
-- app.tenant_readers; a missing, malformed or unbound value shows no rows rather than
-- an error. Bindings hold the role's OID (regrole), so the current role is compared by
-- OID: a role dropped and re-created under the same name is bound to nothing.
--
-- It also caps the reader session's idle_in_transaction_session_timeout at 60 seconds.
-- A reader's open transaction holds a lock on the tables it read; left idle, it makes
-- a migration's DDL wait, and every claim queue behind that migration. Migrations bound
-- their own wait (lock_timeout, leaseq.migrate); this ends the idle reader itself. A
-- role-level setting would not do: ALTER ROLE settings of a group are not inherited by
-- its members. A session that chose a shorter timeout keeps it. PostgreSQL evaluates
-- the policy's sub-select only when a query reaches a row, so a session that has read
-- nothing yet is not capped: give reader logins the setting when creating them too
-- (sql/README.md, "Bind a reader").

create or replace function app.current_tenant_id()
returns uuid
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  -- Only the hex digits are cast: surrounding whitespace of any kind (not just spaces,
  -- which is all btrim removes) would make the uuid cast raise instead of match.
  v_hex text := (regexp_match(
    current_setting('app.tenant_id', true),
    '^\s*([0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12})\s*$',
    'i'))[1];
  v_tenant uuid;
  v_idle interval := current_setting('idle_in_transaction_session_timeout')::interval;
begin
  if v_idle = interval '0' or v_idle > interval '60 seconds' then
    perform set_config('idle_in_transaction_session_timeout', '60s', false);
  end if;
  if v_hex is null then
    return null;
  end if;
  v_tenant := v_hex::uuid;
  if exists (select 1 from app.tenant_readers r
             where r.role_name = (select x.oid from pg_catalog.pg_roles x
                                  where x.rolname = current_user)
               and r.tenant_id = v_tenant) then
    return v_tenant;
  end if;
  return null;
end;
$$;
revoke all on function app.current_tenant_id() from public;
grant execute on function app.current_tenant_id() to authenticated;

-- Refuses the whole call (42501) when a tenant-bound producer names a tenant it is not
-- bound to in app.tenant_producers; called first by the enqueue and producer-read
-- functions, before they look anything up or write anything.
--
-- Who is asking: these callers are SECURITY DEFINER, so current_user is the schema
-- owner here; the login is session_user. SET ROLE changes neither session_user nor
-- this answer: a login is restricted by its own bindings whatever role it sets, and a
-- login that may act as leaseq_producer (a member, directly, through another group, or
-- able to SET ROLE to it) is not restricted at all, nor is the owner. Every other
-- login that can execute the callers (leaseq_tenant_producer's members) may name only
-- its bound tenants. NULL tenants are left to the callers' argument checks (22023).
create or replace function app.check_producer_tenants(p_tenant_ids uuid[])
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_login oid;
  v_tenant uuid;
begin
  if session_user = current_user or pg_has_role(session_user, 'leaseq_producer', 'MEMBER') then
    return;
  end if;
  select r.oid into v_login from pg_catalog.pg_roles r where r.rolname = session_user;
  -- Each distinct tenant once: a batch usually names one or a few.
  select d.t into v_tenant
  from (select distinct u.t from unnest(p_tenant_ids) as u(t) where u.t is not null) d
  where not exists (select 1 from app.tenant_producers b
                    where b.role_name = v_login and b.tenant_id = d.t)
  limit 1;
  if found then
    raise exception using
      errcode = '42501',
      message = format('role %I is not bound to tenant %s', session_user, v_tenant),
      hint = 'A leaseq_tenant_producer login enqueues into and reads only the tenants app.tenant_producers binds it to; the schema owner binds them.';
  end if;
end;
$$;
revoke all on function app.check_producer_tenants(uuid[]) from public;
