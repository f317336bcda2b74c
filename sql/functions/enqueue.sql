-- leaseq functions: enqueue.
--
-- Idempotent on (tenant_id, operation_key). Argument bounds (outside, or NULL, is 22023):
--   enqueue batch      1 .. 1000 jobs
--   available_at       clamped to now when in the past, at most 365 days ahead
--   max_attempts       1 .. 20
--   priority           1 (least urgent) .. 9 (most urgent), 5 when NULL or not given
--   payload            a JSON object of at most 256 KiB (as text), nested at most 100
--                      levels deep, no number longer than 1000 characters as text
--                      (app.document_problem: a worker could not decode either)
--   payloads together  at most 16,777,216 bytes (16 MiB) as JSON text per call, the
--                      payloads of the items that pass their own checks (a refused
--                      item costs no storage); over it the whole call is refused
--   operation key      non-blank (app.is_blank), at most 255 characters, plain text
--                      (app.character_problem: no control, format or line separator
--                      characters)
--   kind               non-blank, at most 128 characters, plain text
--   correlation id     1 .. 200 characters, plain text
--   queue              a queue name (app.check_queue: 1 .. 40 lowercase letters, digits,
--                      '-' or '_', starting with a letter); NULL or not given: the
--                      kind's route (app.queue_kinds), else 'default'

-- The signatures before priorities (0021_job_priorities drops them too): gone here as
-- well, so that these files applied over an older schema leave no overload that makes
-- a call of the old shape ambiguous.
drop function if exists app.enqueue_jobs(uuid[], text[], text[], jsonb[], timestamptz[],
                                         integer[], text[]);
drop function if exists app.enqueue_job(uuid, text, text, jsonb, timestamptz, integer);
-- And the signatures before limit keys (0025_job_limits drops them too) and before named
-- queues (0026_named_queues drops them too).
drop function if exists app.enqueue_items(uuid[], text[], text[], jsonb[], timestamptz[],
                                          integer[], text[], integer[]);
drop function if exists app.enqueue_jobs(uuid[], text[], text[], jsonb[], timestamptz[],
                                         integer[], text[], integer[]);
drop function if exists app.enqueue_items(uuid[], text[], text[], jsonb[], timestamptz[],
                                          integer[], text[], integer[], text[]);
drop function if exists app.enqueue_jobs(uuid[], text[], text[], jsonb[], timestamptz[],
                                         integer[], text[], integer[], text[]);
drop function if exists app.enqueue_job(uuid, text, text, jsonb, timestamptz, integer, integer);

-- Priorities and the claim key. A claim takes a tenant's claimable jobs (available_at
-- <= now) in claim-key order, then oldest created first; the key is written whenever a
-- job becomes claimable (here, and at a retry, a released lease, a give-back or a
-- redrive):
--
--     claim_key = available_at - (priority - 1) * app.settings.priority_step
--
-- so a job of priority p counts as due (p - 1) steps before it is: a job is overtaken
-- only by jobs of higher priority that became due less than (priority difference) x
-- step after it, at most 8 steps for priority 1 behind 9 (the aging bound).

-- The owner's priority step (app.settings.priority_step); 55000 when the row is gone.
create or replace function app.priority_step()
returns interval
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_step interval;
begin
  select s.priority_step into v_step from app.settings s;
  if not found then
    raise exception using
      errcode = '55000',
      message = 'app.settings has no row, so the priority step is unknown',
      hint = 'Restore it as the schema owner: insert into app.settings default values.';
  end if;
  return v_step;
end;
$$;
revoke all on function app.priority_step() from public;

-- The owner sets the priority step (1 second .. 1 day; 22023 outside): the aging bound
-- is 8 steps. Keys already written keep the step they were written with. Runs with the
-- caller's rights and is granted to nobody, so only the owner (who alone may update
-- app.settings) can change it; the answer is the step now in force.
create or replace function app.set_priority_step(p_step interval)
returns interval
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_step interval;
begin
  perform app.check_interval('p_step', p_step, interval '1 second', interval '1 day');
  update app.settings s
  set priority_step = p_step,
      updated_at = clock_timestamp()
  returning s.priority_step into v_step;
  if not found then
    raise exception using
      errcode = '55000',
      message = 'app.settings has no row, so the priority step cannot be set',
      hint = 'Restore it as the schema owner: insert into app.settings default values.';
  end if;
  return v_step;
end;
$$;
revoke all on function app.set_priority_step(interval) from public;

-- A row inserted without a key (by hand, or by a tool that writes the table) gets the key
-- its available_at and priority give it (trigger jobs_fill_claim_key, 0021). The
-- functions write the key themselves, so this never runs on their paths.
create or replace function app.fill_claim_key()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  new.claim_key := new.available_at - (new.priority - 1) * app.priority_step();
  return new;
end;
$$;
revoke all on function app.fill_claim_key() from public;

-- A row whose available_at or priority is changed by hand without its key gets the key
-- they give it, in a second update of the row (trigger jobs_refresh_claim_key, 0030). It
-- is an AFTER trigger because a BEFORE row trigger on UPDATE makes PostgreSQL lock every
-- row an update touches, trigger or not: a WAL record per claim and per outcome. The
-- functions never change one column without the key (a claim names neither, a finish
-- keeps available_at or writes the key too), so on their paths the WHEN test is all it
-- costs.
create or replace function app.refresh_claim_key()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  update app.jobs j
  set claim_key = new.available_at - (new.priority - 1) * app.priority_step()
  where j.id = new.id and j.tenant_id = new.tenant_id
    and j.claim_key is not distinct from new.claim_key;
  return null;
end;
$$;
revoke all on function app.refresh_claim_key() from public;


-- Set-based enqueue of up to 1000 jobs. Each input position gets one output row:
--   status 'created'  a new job, with exactly one 'created' event;
--   status 'existing' (tenant_id, operation_key) already names a job with the same kind
--                     and payload (whatever its state): no new row, no new event;
--   status 'conflict' it names a job with a different kind or payload: nothing written,
--                     job_id and state NULL (the answer is not a probe: only a caller
--                     that repeats the stored kind and payload exactly learns the id);
--   status 'rejected' the item itself is invalid: nothing written for it, job_id and
--                     state NULL, error the 22023 message naming its position.
-- A bad item costs only itself: the valid items of the batch are stored. The call as a
-- whole is refused (22023, nothing stored) only for what no item can fix: a count
-- outside 1 .. 1000, arrays of different lengths, an array that is not one-dimensional
-- and indexed from 1, payloads of more than 16 MiB together.
--
-- Why a bound on the call as well as on each payload: 1000 payloads of 256 KiB are
-- 256 MiB of document checks, rows, index entries and WAL in one statement and one
-- transaction, holding its locks throughout. 16 MiB is room for every event the enqueue
-- function can be sent (Lambda takes at most 6 MB per invocation, and jsonb's spacing
-- adds at most half) and for 1000 jobs of 16 KiB. The check adds the size of text this
-- loop builds anyway, and refuses as soon as the sum passes the bound, so an oversized
-- call costs the checks of 16 MiB at most; its arguments have already been received
-- and parsed (the login's statement_timeout and PostgreSQL's 1 GB per value bound that
-- part). leaseq.limits.MAX_ENQUEUE_BYTES is
-- the same number, and the library refuses such a call before sending it, with the
-- same message.
-- app.enqueue_items is that enqueue without the producer's tenant check, for the
-- functions that enqueue on their own authority (the schedule tick, whose tenants are the
-- owner's rows): only the owner may execute it. app.enqueue_jobs, below, is the
-- producers' door: the tenant check, then this.
create or replace function app.enqueue_items(
  p_tenant_ids uuid[],
  p_operation_keys text[],
  p_kinds text[],
  p_payloads jsonb[],
  p_available_ats timestamptz[] default null,
  p_max_attempts integer[] default null,
  p_correlation_ids text[] default null,
  p_priorities integer[] default null,
  p_queues text[] default null,
  p_limit_keys text[] default null
)
returns table (ord integer, job_id uuid, status text, state app.job_state, error text,
               queue text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_step interval := app.priority_step();
  v_count integer := coalesce(cardinality(p_tenant_ids), 0);
  v_item record;
  v_problem text;
  v_text text;
  v_bytes integer;
  v_total bigint := 0;
  v_errors text[];
  v_created uuid[];
  v_new_tenants uuid[];
  v_new_ats timestamptz[];
  v_new_kinds text[];
  v_new_queues text[];
  v_held uuid[];
begin
  -- Every array's shape in one plain expression; the shared check, which names the
  -- argument, runs only when it fails.
  if array_ndims(p_tenant_ids) <> 1 or array_lower(p_tenant_ids, 1) <> 1
     or array_ndims(p_operation_keys) <> 1 or array_lower(p_operation_keys, 1) <> 1
     or array_ndims(p_kinds) <> 1 or array_lower(p_kinds, 1) <> 1
     or array_ndims(p_payloads) <> 1 or array_lower(p_payloads, 1) <> 1
     or array_ndims(p_available_ats) <> 1 or array_lower(p_available_ats, 1) <> 1
     or array_ndims(p_max_attempts) <> 1 or array_lower(p_max_attempts, 1) <> 1
     or array_ndims(p_correlation_ids) <> 1 or array_lower(p_correlation_ids, 1) <> 1
     or array_ndims(p_priorities) <> 1 or array_lower(p_priorities, 1) <> 1
     or array_ndims(p_queues) <> 1 or array_lower(p_queues, 1) <> 1
     or array_ndims(p_limit_keys) <> 1 or array_lower(p_limit_keys, 1) <> 1 then
    perform app.check_array('p_tenant_ids', p_tenant_ids);
    perform app.check_array('p_operation_keys', p_operation_keys);
    perform app.check_array('p_kinds', p_kinds);
    perform app.check_array('p_payloads', p_payloads);
    perform app.check_array('p_available_ats', p_available_ats);
    perform app.check_array('p_max_attempts', p_max_attempts);
    perform app.check_array('p_correlation_ids', p_correlation_ids);
    perform app.check_array('p_priorities', p_priorities);
    perform app.check_array('p_queues', p_queues);
    perform app.check_array('p_limit_keys', p_limit_keys);
  end if;
  perform app.check_range('number of jobs', v_count, 1, 1000);
  if coalesce(cardinality(p_operation_keys), -1) <> v_count
     or coalesce(cardinality(p_kinds), -1) <> v_count
     or coalesce(cardinality(p_payloads), -1) <> v_count
     or (p_available_ats is not null and cardinality(p_available_ats) <> v_count)
     or (p_max_attempts is not null and cardinality(p_max_attempts) <> v_count)
     or (p_correlation_ids is not null and cardinality(p_correlation_ids) <> v_count)
     or (p_priorities is not null and cardinality(p_priorities) <> v_count)
     or (p_queues is not null and cardinality(p_queues) <> v_count)
     or (p_limit_keys is not null and cardinality(p_limit_keys) <> v_count) then
    perform app.raise_invalid('enqueue arrays must all have the same length');
  end if;

  -- Each item's first problem, if any, becomes its error; later checks are skipped.
  v_errors := array_fill(null::text, array[v_count]);
  for v_item in
    select * from unnest(p_tenant_ids, p_operation_keys, p_kinds, p_payloads)
      with ordinality as u(tenant_id, operation_key, kind, payload, n)
  loop
    v_problem := null;
    if v_item.tenant_id is null then
      v_problem := 'tenant_id is required (got NULL)';
    elsif v_item.operation_key is null or length(v_item.operation_key) > 255
          or (ascii(v_item.operation_key) not between 33 and 126
              and app.is_blank(v_item.operation_key)) then
      v_problem := 'operation_key must be a non-blank text of at most 255 characters';
    elsif v_item.operation_key ~ '[^ -~]'
          and app.character_problem(v_item.operation_key) is not null then
      v_problem := 'operation_key ' || app.character_problem(v_item.operation_key);
    elsif v_item.kind is null or length(v_item.kind) > 128
          or (ascii(v_item.kind) not between 33 and 126 and app.is_blank(v_item.kind)) then
      v_problem := 'kind must be a non-blank text of at most 128 characters';
    elsif v_item.kind ~ '[^ -~]' and app.character_problem(v_item.kind) is not null then
      v_problem := 'kind ' || app.character_problem(v_item.kind);
    elsif v_item.payload is null or jsonb_typeof(v_item.payload) <> 'object' then
      v_problem := format('payload must be a JSON object (got %s)',
                          coalesce(jsonb_typeof(v_item.payload), 'NULL'));
    elsif p_available_ats is not null and p_available_ats[v_item.n] > v_now + interval '365 days' then
      -- infinity is more than 365 days ahead; -infinity is in the past: now, as any past time.
      v_problem := format('available_at must be at most 365 days ahead (got %s)',
                          p_available_ats[v_item.n]);
    elsif p_max_attempts is not null
          and coalesce(p_max_attempts[v_item.n], 6) not between 1 and 20 then
      v_problem := format('max_attempts must be between 1 and 20 (got %s)',
                          p_max_attempts[v_item.n]);
    elsif p_priorities is not null
          and coalesce(p_priorities[v_item.n], 5) not between 1 and 9 then
      v_problem := format('priority must be between 1 (least urgent) and 9 (most urgent) '
                          '(got %s)', p_priorities[v_item.n]);
    elsif p_correlation_ids is not null
          and length(p_correlation_ids[v_item.n]) not between 1 and 200 then
      v_problem := 'correlation_id must have 1 to 200 characters';
    elsif p_correlation_ids is not null and p_correlation_ids[v_item.n] ~ '[^ -~]'
          and app.character_problem(p_correlation_ids[v_item.n]) is not null then
      v_problem := 'correlation_id ' || app.character_problem(p_correlation_ids[v_item.n]);
    elsif p_queues is not null and p_queues[v_item.n] is not null
          and p_queues[v_item.n] !~ '^[a-z][a-z0-9_-]{0,39}$' then
      v_problem := format('queue must be a queue name: 1 to 40 lowercase letters, digits, '
                          '''-'' or ''_'', starting with a letter (got %s)',
                          quote_literal(left(p_queues[v_item.n], 60)));
    elsif p_limit_keys is not null and p_limit_keys[v_item.n] is not null
          and (length(p_limit_keys[v_item.n]) > 200 or app.is_blank(p_limit_keys[v_item.n])) then
      v_problem := 'limit_key must be a non-blank text of at most 200 characters';
    elsif p_limit_keys is not null and p_limit_keys[v_item.n] ~ '[^ -~]'
          and app.character_problem(p_limit_keys[v_item.n]) is not null then
      v_problem := 'limit_key ' || app.character_problem(p_limit_keys[v_item.n]);
    else
      v_text := v_item.payload::text;
      v_bytes := octet_length(v_text);
      if v_bytes > 200 then
        v_problem := 'payload ' || app.document_problem(v_item.payload, v_text, 262144);
      end if;
      if v_problem is null then
        v_total := v_total + v_bytes;
        if v_total > 16777216 then
          perform app.raise_invalid(format(
            'enqueue call too large: its payloads must total at most 16777216 bytes as '
            'JSON text, and job %s brings them to %s; split the batch into smaller calls',
            v_item.n, v_total));
        end if;
      end if;
    end if;
    if v_problem is not null then
      v_errors[v_item.n] := format('job %s: %s', v_item.n, v_problem);
    end if;
  end loop;

  with input as (
    select u.*
    from unnest(
      p_tenant_ids, p_operation_keys, p_kinds, p_payloads,
      coalesce(p_available_ats, array_fill(null::timestamptz, array[v_count])),
      coalesce(p_max_attempts, array_fill(null::integer, array[v_count])),
      coalesce(p_correlation_ids, array_fill(null::text, array[v_count])),
      coalesce(p_priorities, array_fill(null::integer, array[v_count])),
      coalesce(p_queues, array_fill(null::text, array[v_count])),
      coalesce(p_limit_keys, array_fill(null::text, array[v_count]))
    ) with ordinality as u(tenant_id, operation_key, kind, payload, available_at, max_attempts,
                           correlation_id, priority, queue, limit_key, n)
    where v_errors[u.n] is null
  ), inserted as (
    insert into app.jobs (
      tenant_id, operation_key, kind, payload, available_at, max_attempts,
      correlation_id, priority, claim_key, created_at, updated_at, queue, limit_key
    )
    select i.tenant_id, i.operation_key, i.kind, i.payload, d.due,
           coalesce(i.max_attempts, 6), i.correlation_id, d.priority,
           d.due - (d.priority - 1) * v_step, v_now, v_now,
           coalesce(i.queue, (select r.queue from app.queue_kinds r where r.kind = i.kind),
                    'default'),
           i.limit_key
    from input i
    cross join lateral (
      select greatest(coalesce(i.available_at, v_now), v_now) as due,
             coalesce(i.priority, 5)::smallint as priority
    ) d
    order by i.n
    on conflict (tenant_id, operation_key) do nothing
    returning id, tenant_id, kind, available_at, max_attempts, correlation_id, priority,
              queue, limit_key
  )
  , audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, details, created_at)
    select ins.tenant_id, ins.id, 'created', 'enqueue',
           jsonb_strip_nulls(jsonb_build_object(
             'kind', ins.kind,
             'availableAt', ins.available_at,
             'maxAttempts', ins.max_attempts,
             'priority', ins.priority,
             'queue', ins.queue,
             'correlationId', ins.correlation_id,
             'limitKey', ins.limit_key)),
           v_now
    from inserted ins
  )
  select coalesce(array_agg(ins.id), '{}'), array_agg(ins.tenant_id), array_agg(ins.available_at),
         array_agg(ins.kind), array_agg(ins.queue)
  into v_created, v_new_tenants, v_new_ats, v_new_kinds, v_new_queues
  from inserted ins;
  -- Limits hook (functions/admission.sql): each new job under a limit is admitted or
  -- held; held jobs are not claimable, so their tenants are not woken for them.
  if v_new_tenants is not null then
    v_held := app.limit_new_jobs(v_created);
    if cardinality(v_held) > 0 then
      select array_agg(j.tenant_id), array_agg(j.available_at), array_agg(j.kind),
             array_agg(j.queue)
      into v_new_tenants, v_new_ats, v_new_kinds, v_new_queues
      from app.jobs j
      where j.id = any (v_created) and j.id <> all (v_held);
    end if;
  end if;
  -- The new jobs' tenants, and their kinds, are due a turn in their queues by their
  -- available_at (app.wake_tenants).
  if v_new_tenants is not null then
    perform app.wake_tenants(v_new_queues, v_new_tenants, v_new_ats, v_new_kinds);
  end if;

  -- A new statement, so it sees the rows the insert above wrote and those that
  -- concurrent enqueues committed while it waited on their unique-key conflict.
  -- Rejected items take no part: a valid repeat of a rejected item's key is created.
  -- A conflict names no job: the id and state of a job are the answer to a request
  -- that repeats it (same kind, same payload), never to one that only names its key,
  -- which would let a producer that may write into several tenants read another's ids.
  return query
  select a.n, case when a.status = 'conflict' then null else a.id end, a.status,
         case when a.status = 'conflict' then null else a.state end, null::text,
         case when a.status = 'conflict' then null else a.queue end
  from (
    select i.n::integer as n,
           j.id,
           j.queue,
           case
             when j.id = any (v_created)
                  and i.n = min(i.n) over (partition by i.tenant_id, i.operation_key)
               then 'created'
             when j.kind = i.kind and j.payload = i.payload then 'existing'
             else 'conflict'
           end as status,
           j.state
    from unnest(p_tenant_ids, p_operation_keys, p_kinds, p_payloads)
           with ordinality as i(tenant_id, operation_key, kind, payload, n)
    join app.jobs j on j.tenant_id = i.tenant_id and j.operation_key = i.operation_key
    where v_errors[i.n] is null
  ) a
  union all
  select e.n::integer, null::uuid, 'rejected', null::app.job_state, e.error, null::text
  from unnest(v_errors) with ordinality as e(error, n)
  where e.error is not null
  order by 1;
end;
$$;
revoke all on function app.enqueue_items(uuid[], text[], text[], jsonb[], timestamptz[], integer[], text[], integer[], text[], text[]) from public;

create or replace function app.enqueue_jobs(
  p_tenant_ids uuid[],
  p_operation_keys text[],
  p_kinds text[],
  p_payloads jsonb[],
  p_available_ats timestamptz[] default null,
  p_max_attempts integer[] default null,
  p_correlation_ids text[] default null,
  p_priorities integer[] default null,
  p_queues text[] default null,
  p_limit_keys text[] default null
)
returns table (ord integer, job_id uuid, status text, state app.job_state, error text,
               queue text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_producer_tenants(p_tenant_ids);
  return query
  select * from app.enqueue_items(p_tenant_ids, p_operation_keys, p_kinds, p_payloads,
                                  p_available_ats, p_max_attempts, p_correlation_ids,
                                  p_priorities, p_queues, p_limit_keys);
end;
$$;
-- Producers: leaseq_producer into any tenant, leaseq_tenant_producer only into the
-- tenants app.tenant_producers binds its login to (app.check_producer_tenants, first,
-- refuses the whole call with 42501 before anything is looked up, so another tenant's
-- keys cannot even be probed).
revoke all on function app.enqueue_jobs(uuid[], text[], text[], jsonb[], timestamptz[], integer[], text[], integer[], text[], text[]) from public;
grant execute on function app.enqueue_jobs(uuid[], text[], text[], jsonb[], timestamptz[], integer[], text[], integer[], text[], text[]) to leaseq_producer, leaseq_tenant_producer;

-- One job, through enqueue_jobs. A rejected item raises its 22023 (a single call has
-- no other item to keep), a conflict raises 23505; the row is returned otherwise.
create or replace function app.enqueue_job(
  p_tenant_id uuid,
  p_operation_key text,
  p_kind text,
  p_payload jsonb,
  p_available_at timestamptz default null,
  p_max_attempts integer default 6,
  p_priority integer default 5,
  p_queue text default null
)
returns app.jobs
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_result record;
  v_job app.jobs;
begin
  perform app.check_producer_tenants(array[p_tenant_id]);
  perform app.check_range('p_max_attempts', p_max_attempts, 1, 20);
  if p_priority is null or p_priority not between 1 and 9 then
    perform app.raise_invalid(format('p_priority must be between 1 (least urgent) and 9 '
                                     '(most urgent) (got %s)',
                                     coalesce(p_priority::text, 'NULL')));
  end if;
  select * into v_result
  from app.enqueue_jobs(array[p_tenant_id], array[p_operation_key], array[p_kind],
                        array[p_payload], array[p_available_at], array[p_max_attempts],
                        null, array[p_priority], array[p_queue]);
  if v_result.status = 'rejected' then
    perform app.raise_invalid(v_result.error);
  end if;
  if v_result.status = 'conflict' then
    -- Neither the job's id nor its kind: see enqueue_jobs.
    raise exception using
      errcode = '23505',
      message = format('operation_key %L of tenant %s already names a job with a different kind or payload',
                       p_operation_key, p_tenant_id),
      hint = 'Use a new operation_key for a different job, or repeat the original kind and payload exactly.';
  end if;
  -- The job row holds no lease token (app.leases does): a producer learns the job's
  -- state, never the lease that a worker holds on it.
  select * into v_job from app.jobs where id = v_result.job_id and tenant_id = p_tenant_id;
  -- A job a limit holds back is answered with its own due time and key, not the held
  -- placeholder (functions/admission.sql).
  if v_job.available_at = app.held_until() then
    select h.available_at, h.claim_key into v_job.available_at, v_job.claim_key
    from app.held_jobs h where h.job_id = v_job.id;
  end if;
  return v_job;
end;
$$;
revoke all on function app.enqueue_job(uuid, text, text, jsonb, timestamptz, integer, integer, text) from public;
grant execute on function app.enqueue_job(uuid, text, text, jsonb, timestamptz, integer, integer, text) to leaseq_producer, leaseq_tenant_producer;
