-- leaseq functions: periodic jobs (schedules).
--
-- A schedule is an owner-set row of app.schedules; the reaper's tick (app.tick_schedules)
-- turns each of its due slots into one ordinary job through the idempotent enqueue
-- (app.enqueue_items), with the operation key schedule:<schedule id>:<slot in UTC>. The
-- slots come from the database's clock (now() of the tick's transaction), never from the
-- caller; the schedule row is locked (FOR UPDATE SKIP LOCKED) while its slots are enqueued
-- and its cursor (next_slot) moved past now(), so racing or repeated ticks find nothing
-- left to do, and the key makes a slot that were enqueued twice the same job.
--
-- Expressions and their slots in each time zone: cron.sql.
--
-- Missed slots (app.tick_schedules): a slot is on time while it is at most
-- app.settings.schedule_grace old when a tick enqueues it. Older due slots (after an
-- outage, or while the schedule was paused) are missed: a schedule with fill_limit 0 skips
-- them; one with fill_limit N enqueues the latest N of them that are within the fill
-- window, least(app.settings.schedule_window, app.settings.min_retention / 2), and skips
-- the rest. Because the window is always shorter than the reaper's retention floor, the
-- job (and key) of any slot a tick could still enqueue has not been pruned by the reaper.
-- Each tick enqueues at most 1000 slots per schedule (the latest ones).
--
-- Shared work goes into the shared tenant, 00000000-0000-0000-0000-000000000000; a
-- schedule of one tenant's work names that tenant. Either way its jobs are ordinary jobs
-- of that tenant: retries, priorities, limits, cancel, the audit trail and row-level
-- security apply to them as to any other.
--
-- Callers: leaseq_operator (and the owner) add, change, pause, resume, remove, list and
-- sync schedules; leaseq_reaper only ticks. Argument bounds (outside, or NULL where
-- required, is 22023):
--   name        non-blank plain text, at most 128 characters, unique in its tenant
--   kind        as enqueue: non-blank plain text, at most 128 characters
--   payload     as enqueue: a JSON object of at most 256 KiB
--   expression  at most 200 characters, as cron.sql reads them; time zone an IANA name
--   fill_limit  0 .. 1000; max_attempts 1 .. 20; tick limit 1 .. 1000 schedules per call

-- Every check of a schedule's definition (22023 with what was wrong).
create or replace function app.check_schedule(p_tenant_id uuid, p_name text, p_kind text,
                                              p_expression text, p_time_zone text,
                                              p_payload jsonb, p_fill_limit integer,
                                              p_max_attempts integer)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_text text;
begin
  perform app.check_required('p_tenant_id', p_tenant_id);
  if p_name is null or length(p_name) > 128 or app.is_blank(p_name) then
    perform app.raise_invalid('schedule name must be a non-blank text of at most 128 characters');
  end if;
  if app.character_problem(p_name) is not null then
    perform app.raise_invalid('schedule name ' || app.character_problem(p_name));
  end if;
  if p_kind is null or length(p_kind) > 128 or app.is_blank(p_kind) then
    perform app.raise_invalid('kind must be a non-blank text of at most 128 characters');
  end if;
  if app.character_problem(p_kind) is not null then
    perform app.raise_invalid('kind ' || app.character_problem(p_kind));
  end if;
  if p_payload is null or jsonb_typeof(p_payload) <> 'object' then
    perform app.raise_invalid(format('payload must be a JSON object (got %s)',
                                     coalesce(jsonb_typeof(p_payload), 'NULL')));
  end if;
  v_text := p_payload::text;
  if octet_length(v_text) > 200 and app.document_problem(p_payload, v_text, 262144) is not null then
    perform app.raise_invalid('payload ' || app.document_problem(p_payload, v_text, 262144));
  end if;
  perform app.check_range('fill_limit', p_fill_limit, 0, 1000);
  perform app.check_range('max_attempts', p_max_attempts, 1, 20);
  perform app.check_time_zone(p_time_zone);
  perform app.schedule_spec(p_expression);
end;
$$;
revoke all on function app.check_schedule(uuid, text, text, text, text, jsonb, integer, integer) from public;

-- Create the schedule (p_tenant_id, p_name), or change it: status 'created', 'updated'
-- or 'unchanged'. A changed expression or time zone takes effect from its first slot
-- after now (the cursor moves there); the kind, payload, fill limit and max_attempts
-- from the next tick. A schedule declared by the other source (an operator's, or one
-- synced from code) is refused: change it where it was declared.
create or replace function app.put_schedule(
  p_tenant_id uuid,
  p_name text,
  p_kind text,
  p_expression text,
  p_time_zone text default 'UTC',
  p_payload jsonb default '{}'::jsonb,
  p_fill_limit integer default 0,
  p_max_attempts integer default 6,
  p_source text default 'operator'
)
returns table (schedule_id uuid, status text, next_slot timestamptz)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := now();
  v_old app.schedules;
  v_next timestamptz;
begin
  if p_source is null or p_source not in ('operator', 'code') then
    perform app.raise_invalid(format('p_source must be operator or code (got %L)', p_source));
  end if;
  perform app.check_schedule(p_tenant_id, p_name, p_kind, p_expression, p_time_zone,
                             p_payload, p_fill_limit, p_max_attempts);
  select * into v_old from app.schedules s
  where s.tenant_id = p_tenant_id and s.name = p_name
  for update;
  if not found then
    v_next := app.next_schedule_slot(p_expression, p_time_zone, v_now);
    return query
    insert into app.schedules as s (tenant_id, name, kind, payload, expression, time_zone,
                                    fill_limit, max_attempts, source, next_slot,
                                    created_at, updated_at)
    values (p_tenant_id, p_name, p_kind, p_payload, p_expression, p_time_zone, p_fill_limit,
            p_max_attempts, p_source, v_next, v_now, v_now)
    on conflict on constraint schedules_tenant_name_key do nothing
    returning s.id, 'created'::text, s.next_slot;
    if not found then
      perform app.raise_invalid(format(
        'schedule %L of tenant %s was created by a concurrent call; repeat the call',
        p_name, p_tenant_id));
    end if;
    return;
  end if;
  if v_old.source <> p_source then
    perform app.raise_invalid(format(
      'schedule %L of tenant %s is declared %s; change or remove it there',
      p_name, p_tenant_id,
      case v_old.source when 'code' then 'in code (synced from a handlers module)'
                        else 'by an operator (leaseq schedules)' end));
  end if;
  if (v_old.kind, v_old.payload, v_old.expression, v_old.time_zone, v_old.fill_limit,
      v_old.max_attempts)
     is not distinct from (p_kind, p_payload, p_expression, p_time_zone, p_fill_limit,
                           p_max_attempts) then
    return query select v_old.id, 'unchanged'::text, v_old.next_slot;
    return;
  end if;
  v_next := case when (v_old.expression, v_old.time_zone) = (p_expression, p_time_zone)
                 then v_old.next_slot
                 else app.next_schedule_slot(p_expression, p_time_zone, v_now) end;
  return query
  update app.schedules s
  set kind = p_kind, payload = p_payload, expression = p_expression,
      time_zone = p_time_zone, fill_limit = p_fill_limit, max_attempts = p_max_attempts,
      next_slot = v_next, updated_at = v_now
  where s.id = v_old.id
  returning s.id, 'updated'::text, s.next_slot;
end;
$$;
revoke all on function app.put_schedule(uuid, text, text, text, text, jsonb, integer, integer, text) from public;
grant execute on function app.put_schedule(uuid, text, text, text, text, jsonb, integer, integer, text) to leaseq_operator;

-- Pause (p_paused true) or resume a schedule; returns its next slot (NULL when paused).
-- The slots that came while it was paused are missed ones when it resumes: its fill_limit
-- decides (the header). Refused (22023) when there is no such schedule.
create or replace function app.pause_schedule(p_tenant_id uuid, p_name text,
                                              p_paused boolean default true)
returns table (schedule_id uuid, paused boolean, next_slot timestamptz)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  perform app.check_required('p_tenant_id', p_tenant_id);
  perform app.check_required('p_name', p_name);
  perform app.check_required('p_paused', p_paused);
  return query
  update app.schedules s
  set paused = p_paused,
      updated_at = case when s.paused = p_paused then s.updated_at else now() end
  where s.tenant_id = p_tenant_id and s.name = p_name
  returning s.id, s.paused, case when s.paused then null else s.next_slot end;
  if not found then
    perform app.raise_invalid(format('no schedule named %L in tenant %s (leaseq schedules '
                                     'list shows them)', p_name, p_tenant_id));
  end if;
end;
$$;
revoke all on function app.pause_schedule(uuid, text, boolean) from public;
grant execute on function app.pause_schedule(uuid, text, boolean) to leaseq_operator;

-- Remove a schedule; true if there was one. The jobs it made stay, as ordinary jobs.
create or replace function app.remove_schedule(p_tenant_id uuid, p_name text)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_required('p_tenant_id', p_tenant_id);
  perform app.check_required('p_name', p_name);
  delete from app.schedules s where s.tenant_id = p_tenant_id and s.name = p_name;
  return found;
end;
$$;
revoke all on function app.remove_schedule(uuid, text) from public;
grant execute on function app.remove_schedule(uuid, text) to leaseq_operator;

-- Make the code-declared schedules exactly the given ones: each is put with source
-- 'code' (status created, updated or unchanged), and every other code-declared schedule
-- is removed (status 'removed'). Operators' schedules are left alone; a name an operator
-- already uses is refused (22023). Arrays of equal length, at most 1000 entries.
create or replace function app.sync_schedules(
  p_tenant_ids uuid[],
  p_names text[],
  p_kinds text[],
  p_expressions text[],
  p_time_zones text[],
  p_payloads jsonb[],
  p_fill_limits integer[],
  p_max_attempts integer[]
)
returns table (schedule_id uuid, tenant_id uuid, name text, status text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_count integer := coalesce(cardinality(p_names), 0);
  v_put record;
  v_kept uuid[] := '{}';
begin
  perform app.check_array('p_tenant_ids', p_tenant_ids);
  perform app.check_array('p_names', p_names);
  perform app.check_array('p_kinds', p_kinds);
  perform app.check_array('p_expressions', p_expressions);
  perform app.check_array('p_time_zones', p_time_zones);
  perform app.check_array('p_payloads', p_payloads);
  perform app.check_array('p_fill_limits', p_fill_limits);
  perform app.check_array('p_max_attempts', p_max_attempts);
  perform app.check_range('number of schedules', v_count, 0, 1000);
  if coalesce(cardinality(p_tenant_ids), 0) <> v_count
     or coalesce(cardinality(p_kinds), 0) <> v_count
     or coalesce(cardinality(p_expressions), 0) <> v_count
     or coalesce(cardinality(p_time_zones), 0) <> v_count
     or coalesce(cardinality(p_payloads), 0) <> v_count
     or coalesce(cardinality(p_fill_limits), 0) <> v_count
     or coalesce(cardinality(p_max_attempts), 0) <> v_count then
    perform app.raise_invalid('schedule arrays must all have the same length');
  end if;
  for i in 1 .. v_count loop
    select * into v_put
    from app.put_schedule(p_tenant_ids[i], p_names[i], p_kinds[i], p_expressions[i],
                          p_time_zones[i], p_payloads[i], p_fill_limits[i],
                          p_max_attempts[i], 'code');
    v_kept := v_kept || v_put.schedule_id;
    schedule_id := v_put.schedule_id;
    tenant_id := p_tenant_ids[i];
    name := p_names[i];
    status := v_put.status;
    return next;
  end loop;
  return query
  delete from app.schedules s
  where s.source = 'code' and s.id <> all (v_kept)
  returning s.id, s.tenant_id, s.name, 'removed'::text;
end;
$$;
revoke all on function app.sync_schedules(uuid[], text[], text[], text[], text[], jsonb[], integer[], integer[]) from public;
grant execute on function app.sync_schedules(uuid[], text[], text[], text[], text[], jsonb[], integer[], integer[]) to leaseq_operator;

-- The schedules (of one tenant, or all with NULL), by tenant and name: their definition,
-- their next p_next slots (none while paused), the last slot enqueued, the job it made
-- and that job's state (NULL once the job was pruned), and their counters.
create or replace function app.list_schedules(p_tenant_id uuid default null,
                                              p_next integer default 3)
returns table (schedule_id uuid, tenant_id uuid, name text, kind text, payload jsonb,
               expression text, time_zone text, fill_limit integer, max_attempts integer,
               paused boolean, source text, next_slots timestamptz[],
               last_slot timestamptz, last_job_id uuid, last_job_state app.job_state,
               last_enqueued_at timestamptz, slots_enqueued bigint, slots_missed bigint,
               created_at timestamptz, updated_at timestamptz)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  perform app.check_range('p_next', p_next, 0, 100);
  return query
  select s.id, s.tenant_id, s.name, s.kind, s.payload, s.expression, s.time_zone,
         s.fill_limit, s.max_attempts, s.paused, s.source,
         case when s.paused or p_next = 0 then '{}'::timestamptz[]
              else array(select x from app.schedule_slots(
                           s.expression, s.time_zone, s.next_slot - interval '1 microsecond',
                           s.next_slot + interval '20 years', p_next) x) end,
         s.last_slot, s.last_job_id, j.state, s.last_enqueued_at, s.slots_enqueued,
         s.slots_missed, s.created_at, s.updated_at
  from app.schedules s
  left join app.jobs j on j.id = s.last_job_id and j.tenant_id = s.tenant_id
  where p_tenant_id is null or s.tenant_id = p_tenant_id
  order by s.tenant_id, s.name;
end;
$$;
revoke all on function app.list_schedules(uuid, integer) from public;
-- The dashboard's login reads them too (its schedules page), as it reads every tenant's jobs.
grant execute on function app.list_schedules(uuid, integer) to leaseq_operator, leaseq_dashboard;

-- The reaper's tick: up to p_limit schedules whose cursor has come (oldest first, those
-- another tick holds skipped), each in turn: its due slots per its fill policy enqueued
-- through app.enqueue_items with the key schedule:<id>:<slot>, the rest counted as
-- skipped, the cursor moved to the first slot after now(). One row per schedule ticked:
-- slots enqueued (new jobs), existing (slots whose key already named their job), late
-- (enqueued more than schedule_grace after their slot), skipped (never to be enqueued),
-- the last slot and its job, and the new cursor. A caller repeats while a whole page
-- comes back. Each expression is parsed once; the page's slots are enqueued together,
-- one app.enqueue_items call per 1000 (a call costs about as much as its first job).
create or replace function app.tick_schedules(p_limit integer default 100)
returns table (schedule_id uuid, tenant_id uuid, name text, enqueued integer,
               existing integer, late integer, skipped integer, last_slot timestamptz,
               last_job_id uuid, next_slot timestamptz)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := now();
  v_grace interval;
  v_window interval;
  v_schedule app.schedules;
  v_spec record;
  v_on_time timestamptz[];
  v_missed timestamptz[];
  v_take timestamptz[];
  v_skipped integer;
  v_late integer;
  v_count integer := 0;
  v_tenants uuid[] := '{}';
  v_keys text[] := '{}';
  v_kinds text[] := '{}';
  v_payloads jsonb[] := '{}';
  v_attempts integer[] := '{}';
  v_lo integer;
  v_hi integer;
  v_part_statuses text[];
  v_part_jobs uuid[];
  -- Per schedule ticked (index k): what it was and what this tick decided.
  v_rows app.schedules[] := '{}';
  v_lates integer[] := '{}';
  v_skips integer[] := '{}';
  v_nexts timestamptz[] := '{}';
  -- Per slot to enqueue (index i), for one enqueue call per 1000 slots of the page.
  v_owner integer[] := '{}';
  v_slots timestamptz[] := '{}';
  v_statuses text[] := '{}';
  v_jobs uuid[] := '{}';
  v_created integer[];
  v_found integer[];
  v_last_jobs uuid[];
  v_last_slots timestamptz[];
  v_group record;
begin
  perform app.check_range('p_limit', p_limit, 1, 1000);
  select least(st.schedule_grace, st.schedule_window, st.min_retention / 2),
         least(st.schedule_window, st.min_retention / 2)
  into v_grace, v_window
  from app.settings st;
  if not found then
    raise exception using
      errcode = '55000',
      message = 'app.settings has no row, so the schedules'' grace and fill window are unknown',
      hint = 'As the schema owner: insert into app.settings default values.';
  end if;
  for v_schedule in
    select s.* from app.schedules s
    where not s.paused and s.next_slot <= v_now
    order by s.next_slot, s.id
    limit p_limit
    for update skip locked
  loop
    -- On time: due slots at most the grace old. Missed: older ones within the window
    -- (enumerated only as far back as the window reaches; older ones are counted below).
    select * into v_spec from app.schedule_spec(v_schedule.expression);
    v_on_time := array(
      select x from app.spec_slots(
        v_spec.every_seconds, v_spec.minutes, v_spec.hours, v_spec.days, v_spec.months,
        v_spec.weekdays, v_spec.days_star, v_spec.weekdays_star, v_spec.hours_star,
        v_schedule.time_zone,
        greatest(v_schedule.next_slot, v_now - v_grace) - interval '1 microsecond',
        v_now, 100000) x);
    v_missed := '{}';
    v_skipped := 0;
    if v_schedule.next_slot < v_now - v_grace then
      v_missed := array(
        select x from app.spec_slots(
          v_spec.every_seconds, v_spec.minutes, v_spec.hours, v_spec.days, v_spec.months,
          v_spec.weekdays, v_spec.days_star, v_spec.weekdays_star, v_spec.hours_star,
          v_schedule.time_zone,
          greatest(v_schedule.next_slot, v_now - v_window) - interval '1 microsecond',
          v_now - v_grace, 100000) x
        where x < v_now - v_grace);
      -- Slots older than the window are never enqueued: only counted (up to 100000).
      if v_schedule.next_slot < v_now - v_window then
        v_skipped := (
          select count(*) from app.spec_slots(
            v_spec.every_seconds, v_spec.minutes, v_spec.hours, v_spec.days, v_spec.months,
            v_spec.weekdays, v_spec.days_star, v_spec.weekdays_star, v_spec.hours_star,
            v_schedule.time_zone, v_schedule.next_slot - interval '1 microsecond',
            v_now - v_window, 100000) x
          where x < v_now - v_window)::integer;
      end if;
    end if;
    v_take := array(
      select y.x from (
        select f.x from (select m.x from unnest(v_missed) m(x)
                         order by m.x desc limit v_schedule.fill_limit) f
        union
        select o.x from unnest(v_on_time) o(x)
      ) y
      order by y.x desc
      limit 1000);
    v_take := array(select t.x from unnest(v_take) t(x) order by t.x);
    v_late := (select count(*) from unnest(v_take) t(x) where t.x < v_now - v_grace)::integer;
    v_skipped := v_skipped + cardinality(v_on_time) + cardinality(v_missed)
                 - cardinality(v_take);
    v_count := v_count + 1;
    v_rows := v_rows || v_schedule;
    v_lates := v_lates || v_late;
    v_skips := v_skips || v_skipped;
    v_nexts := v_nexts || coalesce(
      (select x from app.spec_slots(
         v_spec.every_seconds, v_spec.minutes, v_spec.hours, v_spec.days, v_spec.months,
         v_spec.weekdays, v_spec.days_star, v_spec.weekdays_star, v_spec.hours_star,
         v_schedule.time_zone, v_now, v_now + interval '20 years', 1) x),
      'infinity'::timestamptz);
    v_owner := v_owner || array_fill(v_count, array[cardinality(v_take)]);
    v_slots := v_slots || v_take;
    v_tenants := v_tenants || array_fill(v_schedule.tenant_id, array[cardinality(v_take)]);
    v_keys := v_keys || array(
      select 'schedule:' || v_schedule.id || ':'
             || to_char(t.x at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
      from unnest(v_take) with ordinality t(x, n) order by t.n);
    v_kinds := v_kinds || array_fill(v_schedule.kind, array[cardinality(v_take)]);
    v_payloads := v_payloads || array_fill(v_schedule.payload, array[cardinality(v_take)]);
    v_attempts := v_attempts || array_fill(v_schedule.max_attempts, array[cardinality(v_take)]);
  end loop;

  -- Every slot of the page through the idempotent enqueue, 1000 a call (its bound): one
  -- call for the page's schedules, not one each.
  for v_lo in select g.lo from generate_series(1, cardinality(v_slots), 1000) g(lo) loop
    v_hi := least(v_lo + 999, cardinality(v_slots));
    select array_agg(e.status order by e.ord), array_agg(e.job_id order by e.ord)
    into v_part_statuses, v_part_jobs
    from app.enqueue_items(v_tenants[v_lo:v_hi], v_keys[v_lo:v_hi], v_kinds[v_lo:v_hi],
                           v_payloads[v_lo:v_hi], null, v_attempts[v_lo:v_hi], null) e;
    v_statuses := v_statuses || v_part_statuses;
    v_jobs := v_jobs || v_part_jobs;
  end loop;

  v_created := array_fill(0, array[v_count]);
  v_found := array_fill(0, array[v_count]);
  v_last_jobs := array_fill(null::uuid, array[v_count]);
  v_last_slots := array_fill(null::timestamptz, array[v_count]);
  for v_group in
    select u.k, count(*) filter (where u.st = 'created')::integer as created,
           count(*) filter (where u.st = 'existing')::integer as found,
           (array_agg(u.j order by u.sl desc))[1] as last_job, max(u.sl) as last_slot
    from unnest(v_owner, v_statuses, v_jobs, v_slots) u(k, st, j, sl)
    group by u.k
  loop
    v_created[v_group.k] := v_group.created;
    v_found[v_group.k] := v_group.found;
    v_last_jobs[v_group.k] := v_group.last_job;
    v_last_slots[v_group.k] := v_group.last_slot;
  end loop;

  for k in 1 .. v_count loop
    schedule_id := (v_rows[k]).id;
    tenant_id := (v_rows[k]).tenant_id;
    name := (v_rows[k]).name;
    enqueued := v_created[k];
    existing := v_found[k];
    late := v_lates[k];
    skipped := v_skips[k];
    last_slot := coalesce(v_last_slots[k], (v_rows[k]).last_slot);
    last_job_id := case when v_last_slots[k] is null then (v_rows[k]).last_job_id
                        else v_last_jobs[k] end;
    next_slot := v_nexts[k];
    update app.schedules s
    set next_slot = tick_schedules.next_slot,
        last_slot = tick_schedules.last_slot,
        last_job_id = tick_schedules.last_job_id,
        last_enqueued_at = case when v_last_slots[k] is null then s.last_enqueued_at
                                else v_now end,
        slots_enqueued = s.slots_enqueued + tick_schedules.enqueued,
        slots_missed = s.slots_missed + tick_schedules.skipped + tick_schedules.late
    where s.id = tick_schedules.schedule_id;
    return next;
  end loop;
end;
$$;
revoke all on function app.tick_schedules(integer) from public;
grant execute on function app.tick_schedules(integer) to leaseq_reaper;
