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
-- Expressions (app.schedule_spec):
--   * five-field cron: minute (0-59) hour (0-23) day-of-month (1-31) month (1-12 or
--     jan-dec) day-of-week (0-7 or sun-sat, 0 and 7 both Sunday); each field *, a number,
--     a range a-b, a step */n, a-b/n or a/n, or a comma-separated list of these. When both
--     day fields are restricted (neither starts with *) a day matches either; otherwise
--     both. Read in the schedule's IANA time zone.
--   * @yearly (@annually), @monthly, @weekly, @daily (@midnight), @hourly: the cron
--     expressions 0 0 1 1 *, 0 0 1 * *, 0 0 * * 0, 0 0 * * *, 0 * * * *.
--   * @every <n><unit>[<n><unit>...], units d h m s (@every 5m, @every 1h30m): slots at
--     whole multiples of the interval since 1970-01-01 00:00 UTC, whatever the time zone.
--     At least 1 minute (the reaper ticks once a minute; finer schedules are refused) and
--     at most 366 days.
--   Refused (22023), with what was wrong: anything else, numbers out of their field's
--   range, unknown time zones, and cron expressions that can never fire (0 0 30 2 *).
--
-- Time zones and daylight saving time (app.schedule_slots): a slot is a local wall-clock
-- time of the schedule's zone.
--   * A local time the clocks skip (02:30 on a spring-forward day in Europe/Berlin) fires
--     once, as far past the jump as it was past the last time before it: 03:30 CEST. A
--     slot that lands on one the schedule has anyway is the same slot (one job).
--   * A local time the clocks repeat (02:30 on the autumn day) fires once, at its first
--     occurrence (CEST), unless the hour field is *: then the schedule keeps its pace
--     through both passes of the repeated hour (*/15 * * * * fires 8 times in it).
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
--   expression  at most 200 characters, as above; time zone an IANA name
--   fill_limit  0 .. 1000; max_attempts 1 .. 20; tick limit 1 .. 1000 schedules per call

-- One cron field as the sorted set of its values. p_names are the field's names in order
-- of their values from p_min (jan..dec, sun..sat), NULL for a numeric field.
create or replace function app.cron_field(p_expression text, p_text text, p_field text,
                                          p_min integer, p_max integer, p_names text[])
returns integer[]
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_part text;
  v_match text[];
  v_low integer;
  v_high integer;
  v_step integer;
  v_values integer[] := '{}';
  v_bound text[];
begin
  foreach v_part in array string_to_array(lower(p_text), ',') loop
    v_match := regexp_match(v_part,
      '^(\*|([0-9]{1,4}|[a-z]{3})(-([0-9]{1,4}|[a-z]{3}))?)(/([0-9]{1,4}))?$');
    if v_match is null then
      perform app.raise_invalid(format(
        'schedule expression %L: the %s field %L is not a number, a range a-b, a step */n '
        'or a list of these', p_expression, p_field, p_text));
    end if;
    v_bound := array[v_match[2], v_match[4]];
    for i in 1 .. 2 loop
      if v_bound[i] is not null and v_bound[i] !~ '^[0-9]+$' then
        if p_names is null or array_position(p_names, v_bound[i]) is null then
          perform app.raise_invalid(format(
            'schedule expression %L: %L is not a value of the %s field (use %s to %s%s)',
            p_expression, v_bound[i], p_field, p_min, p_max,
            case when p_names is null then ''
                 else ' or ' || p_names[1] || '-' || p_names[cardinality(p_names)] end));
        end if;
        v_bound[i] := (array_position(p_names, v_bound[i]) - 1 + p_min)::text;
      end if;
    end loop;
    if v_match[1] = '*' then
      v_low := p_min;
      v_high := p_max;
    else
      v_low := v_bound[1]::integer;
      v_high := coalesce(v_bound[2]::integer,
                         case when v_match[6] is not null then p_max else v_low end);
    end if;
    v_step := coalesce(v_match[6]::integer, 1);
    if v_low not between p_min and p_max or v_high not between p_min and p_max then
      perform app.raise_invalid(format(
        'schedule expression %L: the %s field %L is out of range: use %s to %s',
        p_expression, p_field, p_text, p_min, p_max));
    end if;
    if v_low > v_high then
      perform app.raise_invalid(format(
        'schedule expression %L: the %s field''s range %L runs backwards: write the lower '
        'value first', p_expression, p_field, v_part));
    end if;
    if v_step < 1 then
      perform app.raise_invalid(format(
        'schedule expression %L: the %s field''s step must be at least 1 (got %s)',
        p_expression, p_field, v_step));
    end if;
    v_values := v_values || array(select generate_series(v_low, v_high, v_step));
  end loop;
  return array(select distinct v from unnest(v_values) v order by 1);
end;
$$;
revoke all on function app.cron_field(text, text, text, integer, integer, text[]) from public;

-- An expression taken apart: either every_seconds (an @every interval) or the cron sets,
-- with whether the day fields and the hour field start with * (see the file's header).
-- Raises 22023 for anything malformed, finer than a minute, or that can never fire.
create or replace function app.schedule_spec(
  p_expression text,
  out every_seconds bigint,
  out minutes integer[],
  out hours integer[],
  out days integer[],
  out months integer[],
  out weekdays integer[],
  out days_star boolean,
  out weekdays_star boolean,
  out hours_star boolean
)
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_text text := lower(btrim(p_expression));
  v_fields text[];
  v_part text[];
begin
  if p_expression is null or v_text = '' then
    perform app.raise_invalid('schedule expression is required: a five-field cron '
                              'expression such as ''*/5 * * * *'', or ''@every 10m''');
  end if;
  if length(p_expression) > 200 then
    perform app.raise_invalid('schedule expression must have at most 200 characters');
  end if;
  if v_text like '@every%' then
    if v_text !~ '^@every\s+([0-9]{1,9}[dhms])+$' then
      perform app.raise_invalid(format(
        'schedule expression %L: an interval is @every followed by numbers with units d, '
        'h, m or s, such as @every 10m or @every 1h30m', p_expression));
    end if;
    every_seconds := 0;
    for v_part in
      select regexp_matches(regexp_replace(v_text, '^@every\s+', ''), '([0-9]+)([dhms])', 'g')
    loop
      every_seconds := every_seconds + v_part[1]::bigint * case v_part[2]
        when 'd' then 86400 when 'h' then 3600 when 'm' then 60 else 1 end;
    end loop;
    if every_seconds < 60 then
      perform app.raise_invalid(format(
        'schedule expression %L: schedules finer than a minute are not supported (the '
        'reaper ticks once a minute); use @every 1m or more, or a job that loops',
        p_expression));
    end if;
    if every_seconds > 366 * 86400 then
      perform app.raise_invalid(format(
        'schedule expression %L: an interval must be at most 366 days', p_expression));
    end if;
    return;
  end if;
  v_text := case v_text
    when '@yearly' then '0 0 1 1 *' when '@annually' then '0 0 1 1 *'
    when '@monthly' then '0 0 1 * *' when '@weekly' then '0 0 * * 0'
    when '@daily' then '0 0 * * *' when '@midnight' then '0 0 * * *'
    when '@hourly' then '0 * * * *' else v_text end;
  if v_text like '@%' then
    perform app.raise_invalid(format(
      'schedule expression %L: unknown macro; use @yearly, @annually, @monthly, @weekly, '
      '@daily, @midnight, @hourly or @every <interval>', p_expression));
  end if;
  v_fields := regexp_split_to_array(v_text, '\s+');
  if cardinality(v_fields) <> 5 then
    perform app.raise_invalid(format(
      'schedule expression %L has %s fields; cron expressions have five: minute hour '
      'day-of-month month day-of-week (no seconds, no year)', p_expression,
      cardinality(v_fields)));
  end if;
  minutes := app.cron_field(p_expression, v_fields[1], 'minute', 0, 59, null);
  hours := app.cron_field(p_expression, v_fields[2], 'hour', 0, 23, null);
  days := app.cron_field(p_expression, v_fields[3], 'day-of-month', 1, 31, null);
  months := app.cron_field(p_expression, v_fields[4], 'month', 1, 12,
    array['jan','feb','mar','apr','may','jun','jul','aug','sep','oct','nov','dec']);
  weekdays := app.cron_field(p_expression, v_fields[5], 'day-of-week', 0, 7,
    array['sun','mon','tue','wed','thu','fri','sat']);
  if 7 = any (weekdays) then  -- 7 is Sunday too
    weekdays := array(select distinct case when w = 7 then 0 else w end
                      from unnest(weekdays) w order by 1);
  end if;
  days_star := v_fields[3] like '*%';
  weekdays_star := v_fields[5] like '*%';
  hours_star := v_fields[2] = '*';
  -- Restricted days of the month with any day of the week: some month must have one.
  if weekdays_star and not exists (
      select 1 from unnest(months) m, unnest(days) d
      where d <= case when m = 2 then 29 when m in (4, 6, 9, 11) then 30 else 31 end) then
    perform app.raise_invalid(format(
      'schedule expression %L can never fire: none of its months has any of its days of '
      'the month', p_expression));
  end if;
  return;
end;
$$;
revoke all on function app.schedule_spec(text) from public;

-- Refuse (22023) a time zone PostgreSQL does not know by its IANA name.
create or replace function app.check_time_zone(p_time_zone text)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_time_zone is null or length(p_time_zone) > 64
     or not exists (select 1 from pg_catalog.pg_timezone_names z where z.name = p_time_zone) then
    perform app.raise_invalid(format(
      'time zone %L is not an IANA time zone name this database knows; use a name such as '
      'UTC or Europe/Berlin', p_time_zone));
  end if;
end;
$$;
revoke all on function app.check_time_zone(text) from public;

-- The slots of an expression read in p_time_zone that are after p_after and at most
-- p_until, in order, at most p_limit of them (see the header for daylight saving time).
-- The same from an expression taken apart (app.schedule_spec's columns, in order), so a
-- caller that needs several ranges of one schedule parses it once.
create or replace function app.spec_slots(p_every_seconds bigint, p_minutes integer[],
                                          p_hours integer[], p_days integer[],
                                          p_months integer[], p_weekdays integer[],
                                          p_days_star boolean, p_weekdays_star boolean,
                                          p_hours_star boolean, p_time_zone text,
                                          p_after timestamptz, p_until timestamptz,
                                          p_limit integer)
returns setof timestamptz
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_spec record;
  v_day date;
  v_last date;
  v_count integer := 0;
  v_rows integer;
  v_start timestamptz;
  v_end timestamptz;
  v_hour integer;
  v_hour_start timestamptz;
begin
  if p_after is null or p_until is null or p_until <= p_after or p_limit < 1 then
    return;
  end if;
  select p_every_seconds as every_seconds, p_minutes as minutes, p_hours as hours,
         p_days as days, p_months as months, p_weekdays as weekdays,
         p_days_star as days_star, p_weekdays_star as weekdays_star,
         p_hours_star as hours_star
  into v_spec;
  if v_spec.every_seconds is not null then
    return query
    select to_timestamp((k * v_spec.every_seconds)::double precision)
    from generate_series(
      floor(extract(epoch from p_after) / v_spec.every_seconds)::bigint + 1,
      floor(extract(epoch from least(p_until, p_after + interval '400 years'))
            / v_spec.every_seconds)::bigint) k
    limit p_limit;
    return;
  end if;
  -- A day earlier than p_after's local date: a slot after p_after may have an earlier
  -- local time (the first pass of a repeated hour).
  v_day := (p_after at time zone p_time_zone)::date - 1;
  v_last := (least(p_until, p_after + interval '20 years') at time zone p_time_zone)::date + 1;
  while v_day <= v_last loop
    if extract(month from v_day)::integer = any (v_spec.months)
       and (case when v_spec.days_star or v_spec.weekdays_star
                 then extract(day from v_day)::integer = any (v_spec.days)
                      and extract(dow from v_day)::integer = any (v_spec.weekdays)
                 else extract(day from v_day)::integer = any (v_spec.days)
                      or extract(dow from v_day)::integer = any (v_spec.weekdays) end) then
      -- The day's first and next day's first instants. A day that is 24 hours long has
      -- no clock change: its slots are plain arithmetic from its midnight. The rest (the
      -- two days a year of a zone with daylight saving time) read each wall time in the
      -- zone. Days wholly outside (p_after, p_until], with room for a clock change, are
      -- skipped.
      v_start := v_day::timestamp at time zone p_time_zone;
      v_end := (v_day + 1)::timestamp at time zone p_time_zone;
      if v_end <= p_after - interval '3 hours' or v_start > p_until + interval '3 hours' then
        v_day := v_day + 1;
        continue;
      end if;
      if v_end - v_start = interval '24 hours' then
        -- Hour by hour (the sets are sorted), so a search for the next slot reads one
        -- hour's minutes, not the day's.
        foreach v_hour in array v_spec.hours loop
          v_hour_start := v_start + make_interval(hours => v_hour);
          continue when v_hour_start + interval '59 minutes' <= p_after;
          exit when v_hour_start > p_until;
          return query
          select v_hour_start + make_interval(mins => m)
          from unnest(v_spec.minutes) m
          where v_hour_start + make_interval(mins => m) > p_after
            and v_hour_start + make_interval(mins => m) <= p_until
          order by m
          limit p_limit - v_count;
          get diagnostics v_rows = row_count;
          v_count := v_count + v_rows;
          if v_count >= p_limit then
            return;
          end if;
        end loop;
      else
        return query
          with wall as (
            select v_day + make_time(h, m, 0) as local
            from unnest(v_spec.hours) h, unnest(v_spec.minutes) m
          ), placed as (
            -- "local at time zone" is the later instant of a repeated time (and, for a
            -- skipped one, the instant as far past the jump as it was past the last time
            -- before it); "earlier" is the other reading of a repeated time.
            select w.local, i.later,
                   i.later + ((i.later at time zone p_time_zone) - (i.later at time zone 'UTC'))
                           - (((i.later - interval '3 hours') at time zone p_time_zone)
                              - ((i.later - interval '3 hours') at time zone 'UTC')) as earlier
            from wall w, lateral (select w.local at time zone p_time_zone as later) i
          ), slots as (
            select case when p.earlier < p.later and (p.earlier at time zone p_time_zone) = p.local
                        then p.earlier else p.later end as slot
            from placed p
            union
            select p.later
            from placed p
            where v_spec.hours_star and p.earlier < p.later
              and (p.earlier at time zone p_time_zone) = p.local
          )
          select s.slot from slots s
          where s.slot > p_after and s.slot <= p_until
          order by s.slot
          limit p_limit - v_count;
        get diagnostics v_rows = row_count;
        v_count := v_count + v_rows;
        if v_count >= p_limit then
          return;
        end if;
      end if;
    end if;
    v_day := v_day + 1;
  end loop;
end;
$$;
revoke all on function app.spec_slots(bigint, integer[], integer[], integer[], integer[], integer[], boolean, boolean, boolean, text, timestamptz, timestamptz, integer) from public;

-- The same, from the expression (parsed on every call).
create or replace function app.schedule_slots(p_expression text, p_time_zone text,
                                              p_after timestamptz, p_until timestamptz,
                                              p_limit integer)
returns setof timestamptz
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select s
  from app.schedule_spec(p_expression) p,
       lateral app.spec_slots(p.every_seconds, p.minutes, p.hours, p.days, p.months,
                              p.weekdays, p.days_star, p.weekdays_star, p.hours_star,
                              p_time_zone, p_after, p_until, p_limit) s;
$$;
revoke all on function app.schedule_slots(text, text, timestamptz, timestamptz, integer) from public;

-- The first slot after p_after ('infinity' if none within 20 years, which a checked
-- expression never gives).
create or replace function app.next_schedule_slot(p_expression text, p_time_zone text,
                                                  p_after timestamptz)
returns timestamptz
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(
    (select s from app.schedule_slots(p_expression, p_time_zone, p_after,
                                      p_after + interval '20 years', 1) s),
    'infinity'::timestamptz);
$$;
revoke all on function app.next_schedule_slot(text, text, timestamptz) from public;

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
