-- leaseq functions: which tenant a reader session may see.
--
-- Row-level security on app.jobs, app.job_events and app.tenant_readers calls
-- app.current_tenant_id(). It runs as the reader (not SECURITY DEFINER): the setting
-- app.tenant_id only selects among the tenants the owner bound the role to in
-- app.tenant_readers; a missing, malformed or unbound value shows no rows rather than
-- an error.
--
-- It also caps the reader session's idle_in_transaction_session_timeout at 60 seconds.
-- A reader's open transaction holds a lock on the tables it read; left idle, it makes
-- a migration's DDL wait, and every claim queue behind that migration. Migrations bound
-- their own wait (lock_timeout, leaseq.migrate); this ends the idle reader itself. A
-- role-level setting would not do: ALTER ROLE settings of a group are not inherited by
-- its members. A session that chose a shorter timeout keeps it.

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
             where r.role_name = current_user and r.tenant_id = v_tenant) then
    return v_tenant;
  end if;
  return null;
end;
$$;
revoke all on function app.current_tenant_id() from public;
grant execute on function app.current_tenant_id() to authenticated;
