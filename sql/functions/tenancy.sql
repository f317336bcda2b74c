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

-- A role's own setting of a duration parameter (statement_timeout,
-- idle_in_transaction_session_timeout) as the owner or an administrator set it with
-- ALTER ROLE ... [IN DATABASE ...] SET: the setting for this database first, then the
-- one for every database; NULL when neither is set, or it is 0 (no limit). A bare number
-- is milliseconds, as PostgreSQL reads these parameters. A session may change its own
-- value with SET; this is the value it was given.
create or replace function app.role_duration_setting(p_role oid, p_name text)
returns interval
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_value text;
  v_duration interval;
begin
  select substr(c.setting, length(p_name) + 2) into v_value
  from pg_catalog.pg_db_role_setting s
  cross join lateral unnest(s.setconfig) as c(setting)
  where s.setrole = p_role
    and s.setdatabase in (0, (select d.oid from pg_catalog.pg_database d
                              where d.datname = pg_catalog.current_database()))
    and c.setting like p_name || '=%'
  order by s.setdatabase desc
  limit 1;
  if v_value is null then
    return null;
  end if;
  begin
    v_duration := case when v_value ~ '^[0-9]+$' then (v_value || ' ms')::interval
                       else v_value::interval end;
  exception when others then
    return null;  -- a form PostgreSQL accepts and interval does not: no cap is enforced
  end;
  return nullif(v_duration, interval '0');
end;
$$;
revoke all on function app.role_duration_setting(oid, text) from public;

-- The reaper ends the sessions that lifted their caps. Every user may SET
-- statement_timeout and idle_in_transaction_session_timeout, including to 0, and
-- PostgreSQL has no way to forbid it: a reader (or a runtime login) that reads app.jobs
-- in a transaction and then sets the timeout to 0 could hold its lock, and its snapshot,
-- for ever. The lock makes every migration's DDL give up (lock_timeout); a REPEATABLE
-- READ snapshot keeps vacuum from removing any dead row of the queue's tables, which
-- every claim and finish leaves behind.
--
-- So a session of a login that holds a leaseq group (authenticated or a duty group,
-- directly or through another role, such as the legacy all-duty group) in this database
-- is ended
-- (pg_terminate_backend) when it is
--   idle in a transaction longer than its idle cap: the login's own
--     idle_in_transaction_session_timeout (app.role_duration_setting), and for a reader
--     at most the 60 seconds app.current_tenant_id() caps it at; or
--   running one statement longer than the login's own statement_timeout.
-- A login without such a setting is given no cap of that kind here (an application's
-- producer login may keep its own transactions open). The schema owner and
-- administrators (superusers, and CREATEROLE roles, which from PostgreSQL 16 hold every
-- group they created with ADMIN OPTION) are left alone, and so is the caller's session.
--
-- One row per session it acted on: outcome 'ended'; 'refused' when the owner may not
-- end it (it needs pg_signal_backend); 'unseen' when the owner may not read its state
-- (it needs pg_read_all_stats; state and stalled_for are NULL then). So a missing grant
-- is reported on every call instead of leaving the caps silently unenforced. A session
-- that moved on between the read and the signal is ended all the same: it had been
-- past its cap.
create or replace function app.end_stalled_sessions()
returns table (pid integer, login text, state text, stalled_for interval, outcome text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_session record;
  v_ended boolean;
begin
  for v_session in
    with sessions as (
      select a.pid, r.oid as role_oid, r.rolname::text as login, a.state,
             a.state_change, a.query_start, a.query,
             pg_catalog.pg_has_role(r.oid, 'authenticated', 'MEMBER') as reader
      from pg_catalog.pg_stat_activity a
      join pg_catalog.pg_roles r on r.oid = a.usesysid
      where a.datname = pg_catalog.current_database()
        and a.pid <> pg_catalog.pg_backend_pid()
        and r.rolcanlogin and not r.rolsuper and not r.rolcreaterole
        and r.rolname <> current_user
        and exists (select 1 from pg_catalog.pg_roles g
                    where g.rolname in ('authenticated', 'leaseq_producer',
                                        'leaseq_tenant_producer', 'leaseq_worker',
                                        'leaseq_reaper', 'leaseq_operator', 'leaseq_dashboard')
                      and pg_catalog.pg_has_role(r.oid, g.oid, 'MEMBER'))
    ), capped as (
      select s.*,
             case when s.reader
                  then least(interval '60 seconds',
                             app.role_duration_setting(s.role_oid,
                                                       'idle_in_transaction_session_timeout'))
                  else app.role_duration_setting(s.role_oid,
                                                 'idle_in_transaction_session_timeout')
             end as idle_cap,
             app.role_duration_setting(s.role_oid, 'statement_timeout') as statement_cap
      from sessions s
    )
    select c.pid, c.login, c.state,
           case when c.state like 'idle in transaction%' then v_now - c.state_change
                when c.state = 'active' then v_now - c.query_start end as stalled_for,
           c.state is null and c.query = '<insufficient privilege>' as unseen
    from capped c
    where (c.state is null and c.query = '<insufficient privilege>')
       or (c.state like 'idle in transaction%' and v_now - c.state_change > c.idle_cap)
       or (c.state = 'active' and v_now - c.query_start > c.statement_cap)
    order by c.pid
  loop
    pid := v_session.pid;
    login := v_session.login;
    if v_session.unseen then
      state := null;
      stalled_for := null;
      outcome := 'unseen';
      return next;
      continue;
    end if;
    state := v_session.state;
    stalled_for := v_session.stalled_for;
    begin
      v_ended := pg_catalog.pg_terminate_backend(v_session.pid);
      outcome := 'ended';
    exception when insufficient_privilege then
      v_ended := true;
      outcome := 'refused';
    end;
    if v_ended then  -- false: the session had already gone
      return next;
    end if;
  end loop;
end;
$$;
revoke all on function app.end_stalled_sessions() from public;
grant execute on function app.end_stalled_sessions() to leaseq_reaper;
