-- leaseq 0003: the queue contract.
--
-- Every public function is SECURITY DEFINER with an empty search_path and runs as the
-- schema owner, who is NOT a superuser on RDS. The owner is not subject to row-level
-- security because 0004 leaves RLS enabled but not FORCED (reference defects 2, 3).
--
-- Argument bounds (anything outside, or NULL, raises SQLSTATE 22023 naming the range):
--   lease              1 second .. 1 day
--   claim limit        1 .. 100
--   release limit      1 .. 1000 per tenant, 1 .. 10000 across tenants
--   retry delay        0 .. 30 days (never in the past)
--   available_at       clamped to now when in the past, at most 365 days ahead
--   max_attempts       1 .. 20
--   enqueue batch      1 .. 1000 jobs; finish batch 1 .. 1000 outcomes
--   payload            a JSON object of at most 256 KiB (as text), nested at most 100
--                      levels deep (deeper cannot be decoded by a worker); result at most 256 KiB
--
-- The five reference functions keep their signatures. They are created with CREATE OR
-- REPLACE because on a database where the reference schema was applied by hand they
-- already exist; they are replaced in place (0004 then revokes the EXECUTE that PUBLIC
-- kept there). The single-job completions are thin wrappers over app.finish_jobs so
-- that every terminal transition, and the audit row it writes, is expressed exactly once.

-- Argument checks ----------------------------------------------------------------------

-- "Blank" means empty or whitespace of any kind (tabs, newlines), the same test as the
-- table's shape constraints, so a blank value is refused with 22023, never 23514.

create function app.raise_invalid(p_message text)
returns void
language plpgsql
immutable
set search_path = ''
as $$
begin
  raise exception using errcode = '22023', message = p_message;
end;
$$;

create function app.check_required(p_name text, p_value anyelement)
returns void
language plpgsql
immutable
set search_path = ''
as $$
begin
  if p_value is null then
    perform app.raise_invalid(p_name || ' is required (got NULL)');
  end if;
end;
$$;

create function app.check_owner(p_owner text)
returns void
language plpgsql
immutable
set search_path = ''
as $$
begin
  if p_owner is null or p_owner ~ '^\s*$' or length(p_owner) > 200 then
    perform app.raise_invalid('p_owner must be a non-blank text of at most 200 characters');
  end if;
end;
$$;

create function app.check_range(p_name text, p_value integer, p_min integer, p_max integer)
returns void
language plpgsql
immutable
set search_path = ''
as $$
begin
  if p_value is null or p_value < p_min or p_value > p_max then
    perform app.raise_invalid(format('%s must be between %s and %s (got %s)',
      p_name, p_min, p_max, coalesce(p_value::text, 'NULL')));
  end if;
end;
$$;

create function app.check_interval(p_name text, p_value interval, p_min interval, p_max interval)
returns void
language plpgsql
immutable
set search_path = ''
as $$
begin
  if p_value is null or p_value < p_min or p_value > p_max then
    perform app.raise_invalid(format('%s must be between %s and %s (got %s)',
      p_name, p_min, p_max, coalesce(p_value::text, 'NULL')));
  end if;
end;
$$;

create function app.check_lease(p_lease interval)
returns void
language sql
immutable
set search_path = ''
as $$
  select app.check_interval('p_lease', p_lease, interval '1 second', interval '1 day')
$$;

-- The arguments every claim takes. One call per claim (per batch, not per job); the
-- checks are plain expressions and the detailed message is only built on failure.
create function app.check_claim(p_owner text, p_limit integer, p_lease interval)
returns void
language plpgsql
immutable
set search_path = ''
as $$
begin
  if p_owner is null or p_owner ~ '^\s*$' or length(p_owner) > 200 then
    perform app.check_owner(p_owner);
  end if;
  if p_limit is null or p_limit < 1 or p_limit > 100 then
    perform app.check_range('p_limit', p_limit, 1, 100);
  end if;
  if p_lease is null or p_lease < interval '1 second' or p_lease > interval '1 day' then
    perform app.check_lease(p_lease);
  end if;
end;
$$;

-- A failure report is never refused: whatever the worker sends becomes a JSON object
-- that fits the row, so a bad error document cannot lose the failure it describes.
create function app.error_document(p_error jsonb)
returns jsonb
language sql
immutable
set search_path = ''
as $$
  select case
    when p_error is null then jsonb_build_object('message', null)
    when octet_length(p_error::text) > 65536 then jsonb_build_object(
      'code', 'ERROR_TRUNCATED',
      'truncated', left(p_error::text, 8192))
    when jsonb_typeof(p_error) <> 'object' then jsonb_build_object('message', p_error)
    else p_error
  end
$$;

-- Enqueue ------------------------------------------------------------------------------

-- Set-based enqueue of up to 1000 jobs. Each input position gets one output row:
--   status 'created'  a new job, with exactly one 'created' event;
--   status 'existing' (tenant_id, operation_key) already names a job with the same kind
--                     and payload (whatever its state): no new row, no new event;
--   status 'conflict' it names a job with a different kind or payload: nothing written.
create function app.enqueue_jobs(
  p_tenant_ids uuid[],
  p_operation_keys text[],
  p_kinds text[],
  p_payloads jsonb[],
  p_available_ats timestamptz[] default null,
  p_max_attempts integer[] default null,
  p_correlation_ids text[] default null
)
returns table (ord integer, job_id uuid, status text, state app.job_state)
language plpgsql
security definer
set search_path = ''
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_count integer := coalesce(cardinality(p_tenant_ids), 0);
  v_item record;
  v_created uuid[];
begin
  perform app.check_range('number of jobs', v_count, 1, 1000);
  if coalesce(cardinality(p_operation_keys), -1) <> v_count
     or coalesce(cardinality(p_kinds), -1) <> v_count
     or coalesce(cardinality(p_payloads), -1) <> v_count
     or (p_available_ats is not null and cardinality(p_available_ats) <> v_count)
     or (p_max_attempts is not null and cardinality(p_max_attempts) <> v_count)
     or (p_correlation_ids is not null and cardinality(p_correlation_ids) <> v_count) then
    perform app.raise_invalid('enqueue arrays must all have the same length');
  end if;

  for v_item in
    select * from unnest(p_tenant_ids, p_operation_keys, p_kinds, p_payloads)
      with ordinality as u(tenant_id, operation_key, kind, payload, n)
  loop
    if v_item.tenant_id is null then
      perform app.raise_invalid(format('job %s: tenant_id is required (got NULL)', v_item.n));
    end if;
    if v_item.operation_key is null or v_item.operation_key ~ '^\s*$' or length(v_item.operation_key) > 255 then
      perform app.raise_invalid(format('job %s: operation_key must be a non-blank text of at most 255 characters', v_item.n));
    end if;
    if v_item.kind is null or v_item.kind ~ '^\s*$' or length(v_item.kind) > 128 then
      perform app.raise_invalid(format('job %s: kind must be a non-blank text of at most 128 characters', v_item.n));
    end if;
    if v_item.payload is null or jsonb_typeof(v_item.payload) <> 'object' then
      perform app.raise_invalid(format('job %s: payload must be a JSON object (got %s)',
        v_item.n, coalesce(jsonb_typeof(v_item.payload), 'NULL')));
    end if;
    if jsonb_path_exists(v_item.payload, '$.**{101}') then
      perform app.raise_invalid(format('job %s: payload must nest at most 100 levels below the top-level object', v_item.n));
    end if;
    if octet_length(v_item.payload::text) > 262144 then
      perform app.raise_invalid(format('job %s: payload must be at most 262144 bytes as JSON text (got %s)',
        v_item.n, octet_length(v_item.payload::text)));
    end if;
    if p_available_ats is not null and p_available_ats[v_item.n] > v_now + interval '365 days' then
      perform app.raise_invalid(format('job %s: available_at must be at most 365 days ahead (got %s)',
        v_item.n, p_available_ats[v_item.n]));
    end if;
    if p_max_attempts is not null then
      perform app.check_range(format('job %s: max_attempts', v_item.n),
        coalesce(p_max_attempts[v_item.n], 6), 1, 20);
    end if;
    if p_correlation_ids is not null and length(p_correlation_ids[v_item.n]) not between 1 and 200 then
      perform app.raise_invalid(format('job %s: correlation_id must have 1 to 200 characters', v_item.n));
    end if;
  end loop;

  with input as (
    select u.*
    from unnest(
      p_tenant_ids, p_operation_keys, p_kinds, p_payloads,
      coalesce(p_available_ats, array_fill(null::timestamptz, array[v_count])),
      coalesce(p_max_attempts, array_fill(null::integer, array[v_count])),
      coalesce(p_correlation_ids, array_fill(null::text, array[v_count]))
    ) with ordinality as u(tenant_id, operation_key, kind, payload, available_at, max_attempts, correlation_id, n)
  ), inserted as (
    insert into app.jobs (
      tenant_id, operation_key, kind, payload, available_at, max_attempts,
      correlation_id, created_at, updated_at
    )
    select i.tenant_id, i.operation_key, i.kind, i.payload,
           greatest(coalesce(i.available_at, v_now), v_now),
           coalesce(i.max_attempts, 6), i.correlation_id, v_now, v_now
    from input i
    order by i.n
    on conflict (tenant_id, operation_key) do nothing
    returning id, tenant_id, kind, available_at, max_attempts, correlation_id
  )
  , audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, details, created_at)
    select ins.tenant_id, ins.id, 'created', 'enqueue',
           jsonb_strip_nulls(jsonb_build_object(
             'kind', ins.kind,
             'availableAt', ins.available_at,
             'maxAttempts', ins.max_attempts,
             'correlationId', ins.correlation_id)),
           v_now
    from inserted ins
  )
  select coalesce(array_agg(ins.id), '{}') into v_created from inserted ins;

  -- A new statement, so it sees the rows the insert above wrote and those that
  -- concurrent enqueues committed while it waited on their unique-key conflict.
  return query
  select i.n::integer,
         j.id,
         case
           when j.id = any (v_created)
                and i.n = min(i.n) over (partition by i.tenant_id, i.operation_key)
             then 'created'
           when j.kind = i.kind and j.payload = i.payload then 'existing'
           else 'conflict'
         end,
         j.state
  from unnest(p_tenant_ids, p_operation_keys, p_kinds, p_payloads)
         with ordinality as i(tenant_id, operation_key, kind, payload, n)
  join app.jobs j on j.tenant_id = i.tenant_id and j.operation_key = i.operation_key
  order by i.n;
end;
$$;

create function app.enqueue_job(
  p_tenant_id uuid,
  p_operation_key text,
  p_kind text,
  p_payload jsonb,
  p_available_at timestamptz default null,
  p_max_attempts integer default 6
)
returns app.jobs
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_result record;
  v_job app.jobs;
begin
  perform app.check_range('p_max_attempts', p_max_attempts, 1, 20);
  select * into v_result
  from app.enqueue_jobs(array[p_tenant_id], array[p_operation_key], array[p_kind],
                        array[p_payload], array[p_available_at], array[p_max_attempts]);
  select * into v_job from app.jobs where id = v_result.job_id and tenant_id = p_tenant_id;
  if v_result.status = 'conflict' then
    raise exception using
      errcode = '23505',
      message = format('operation_key %L of tenant %s already names job %s (kind %L) with a different kind or payload',
                       p_operation_key, p_tenant_id, v_job.id, v_job.kind),
      hint = 'Use a new operation_key for a different job, or repeat the original kind and payload.';
  end if;
  -- A producer learns the job's state, never the lease that a worker holds on it.
  v_job.lease_token := null;
  return v_job;
end;
$$;

-- Claim --------------------------------------------------------------------------------

-- Claim rows this transaction has already locked FOR UPDATE: one INSERT ... SELECT of
-- 'claimed' audit rows, then one UPDATE. The audit rows come first so that the foreign
-- key check of each finds its job row already locked FOR UPDATE by the claim and takes
-- no second row lock (one heap LOCK WAL record per job fewer). Internal: owner only.
create function app.claim_locked_jobs(
  p_ids uuid[],
  p_owner text,
  p_lease interval,
  p_now timestamptz
)
returns setof app.jobs
language plpgsql
set search_path = ''
as $$
declare
  v_tokens uuid[];
begin
  select array_agg(gen_random_uuid()) into v_tokens from unnest(p_ids);

  insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
  select j.tenant_id, j.id, 'claimed', p_owner, c.token,
         jsonb_build_object('attempt', j.attempts + 1, 'leaseExpiresAt', p_now + p_lease),
         p_now
  from unnest(p_ids, v_tokens) as c(id, token)
  join app.jobs j on j.id = c.id;

  return query
  with claimed as (
    update app.jobs j
    set state = 'running',
        attempts = j.attempts + 1,
        lease_owner = p_owner,
        lease_token = c.token,
        lease_expires_at = p_now + p_lease,
        updated_at = p_now
    from unnest(p_ids, v_tokens) as c(id, token)
    where j.id = c.id
    returning j.*
  )
  select * from claimed c order by c.available_at, c.created_at, c.id;
end;
$$;
revoke all on function app.claim_locked_jobs(uuid[], text, interval, timestamptz) from public;

-- Claims take the oldest ready rows with FOR UPDATE SKIP LOCKED in a subquery whose
-- LIMIT applies to rows this transaction actually locked, so concurrent claimers walk
-- past each other instead of queueing on the same rows; claim_locked_jobs then writes
-- all their 'claimed' audit rows with one INSERT ... SELECT and updates them with one
-- UPDATE. Argument checks are plain expressions; the helper that raises the detailed
-- message only runs when one fails.
create or replace function app.claim_jobs(
  p_tenant_id uuid,
  p_owner text,
  p_limit integer default 10,
  p_lease interval default interval '30 seconds'
)
returns setof app.jobs
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_ids uuid[];
begin
  if p_tenant_id is null then
    perform app.check_required('p_tenant_id', p_tenant_id);
  end if;
  perform app.check_claim(p_owner, p_limit, p_lease);

  select array_agg(c.id) into v_ids
  from (
    select j.id
    from app.jobs j
    where j.tenant_id = p_tenant_id
      and j.state in ('pending', 'retry_wait')
      and j.available_at <= v_now
    order by j.available_at, j.created_at, j.id
    for update skip locked
    limit p_limit
  ) c;
  if v_ids is null then
    return;
  end if;
  return query select * from app.claim_locked_jobs(v_ids, p_owner, p_lease, v_now);
end;
$$;

-- Tenants with claimable work, in tenant_id order, found by a loose index scan over
-- jobs_claimable_idx: one index probe per tenant (its first entry carries both the
-- tenant and its oldest available_at), never a scan of the backlog.
-- oldest_ready_at is the tenant's oldest pending/retry_wait available_at; a tenant
-- whose work is all in the future is left out.
create function app.ready_tenants(p_limit integer default 100)
returns table (tenant_id uuid, oldest_ready_at timestamptz)
language plpgsql
stable
security definer
set search_path = ''
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
begin
  if p_limit is null or p_limit < 1 or p_limit > 10000 then
    perform app.check_range('p_limit', p_limit, 1, 10000);
  end if;
  return query
  with recursive tenants as (
    (select j.tenant_id, j.available_at
     from app.jobs j
     where j.state in ('pending', 'retry_wait')
     order by j.tenant_id, j.available_at
     limit 1)
    union all
    select following.tenant_id, following.available_at
    from tenants t
    cross join lateral (
      select j.tenant_id, j.available_at
      from app.jobs j
      where j.state in ('pending', 'retry_wait')
        and j.tenant_id > t.tenant_id
      order by j.tenant_id, j.available_at
      limit 1
    ) following
  )
  select t.tenant_id, t.available_at
  from tenants t
  where t.available_at <= v_now
  limit p_limit;
end;
$$;

-- Fair claim across tenants, for scheduled workers that serve everyone.
-- Up to p_limit ready tenants are served, the one waiting longest first. Each locks a
-- share of ceil(limit / tenants) candidates, and the batch takes them round by round:
-- every tenant's first job, then every tenant's second, and so on; shares left unused
-- by small tenants are then refilled from the others. So while no more than p_limit
-- tenants have ready work, every one of them gets at least one job into every batch: a
-- backlog of any size in one tenant delays another tenant's job by at most one batch.
-- Locked candidates beyond the limit (a share's rounding) unlock at commit.
create function app.claim_ready_jobs(
  p_owner text,
  p_limit integer default 10,
  p_lease interval default interval '30 seconds'
)
returns setof app.jobs
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_tenants uuid[];
  v_share integer;
  v_ids uuid[];
  v_more uuid[];
begin
  perform app.check_claim(p_owner, p_limit, p_lease);

  select array_agg(r.tenant_id order by r.oldest_ready_at, r.tenant_id)
  into v_tenants
  from (
    select rt.tenant_id, rt.oldest_ready_at
    from app.ready_tenants(10000) rt
    order by rt.oldest_ready_at, rt.tenant_id
    limit p_limit
  ) r;
  if v_tenants is null then
    return;
  end if;
  v_share := ceil(p_limit::numeric / cardinality(v_tenants));

  select array_agg(c.id) into v_ids
  from (
    select ranked.id
    from unnest(v_tenants) with ordinality as t(tenant_id, pos)
    cross join lateral (
      select picked.id,
             row_number() over (order by picked.available_at, picked.created_at, picked.id)
               as round
      from (
        select j.id, j.available_at, j.created_at
        from app.jobs j
        where j.tenant_id = t.tenant_id
          and j.state in ('pending', 'retry_wait')
          and j.available_at <= v_now
        order by j.available_at, j.created_at, j.id
        for update skip locked
        limit v_share
      ) picked
    ) ranked
    order by ranked.round, t.pos
    limit p_limit
  ) c;
  v_ids := coalesce(v_ids, '{}');

  if cardinality(v_ids) < p_limit and cardinality(v_tenants) > 1 then
    select array_agg(c.id) into v_more
    from (
      select picked.id
      from unnest(v_tenants) with ordinality as t(tenant_id, pos)
      cross join lateral (
        select j.id
        from app.jobs j
        where j.tenant_id = t.tenant_id
          and j.state in ('pending', 'retry_wait')
          and j.available_at <= v_now
          and j.id <> all (v_ids)
        order by j.available_at, j.created_at, j.id
        for update skip locked
        limit p_limit - cardinality(v_ids)
      ) picked
      limit p_limit - cardinality(v_ids)
    ) c;
    v_ids := v_ids || coalesce(v_more, '{}');
  end if;

  if cardinality(v_ids) = 0 then
    return;
  end if;
  return query select * from app.claim_locked_jobs(v_ids, p_owner, p_lease, v_now);
end;
$$;

create or replace function app.renew_job_lease(
  p_tenant_id uuid,
  p_job_id uuid,
  p_owner text,
  p_token uuid,
  p_lease interval default interval '30 seconds'
)
returns boolean
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_renewed boolean;
begin
  perform app.check_required('p_tenant_id', p_tenant_id);
  perform app.check_required('p_job_id', p_job_id);
  perform app.check_owner(p_owner);
  perform app.check_required('p_token', p_token);
  perform app.check_lease(p_lease);

  update app.jobs
  set lease_expires_at = v_now + p_lease,
      updated_at = v_now
  where tenant_id = p_tenant_id
    and id = p_job_id
    and state = 'running'
    and lease_owner = p_owner
    and lease_token = p_token
    and lease_expires_at > v_now
  returning true into v_renewed;

  return coalesce(v_renewed, false);
end;
$$;

-- Finish -------------------------------------------------------------------------------

-- Raises the detailed 22023 message for outcome number p_n; called only when the
-- set-based check in finish_jobs found that outcome invalid.
create function app.explain_invalid_outcome(
  p_n bigint,
  p_tenant_id uuid,
  p_job_id uuid,
  p_token uuid,
  p_outcome text,
  p_detail jsonb,
  p_delay interval
)
returns void
language plpgsql
set search_path = ''
as $$
begin
  if p_tenant_id is null or p_job_id is null or p_token is null then
    perform app.raise_invalid(format('outcome %s: tenant_id, job_id and token are required', p_n));
  end if;
  if p_outcome is null or p_outcome not in ('succeeded', 'retry', 'dead', 'exhausted') then
    perform app.raise_invalid(format('outcome %s: must be succeeded, retry, dead or exhausted (got %s)',
      p_n, coalesce(p_outcome, 'NULL')));
  end if;
  if p_outcome = 'retry' then
    perform app.check_interval(format('outcome %s: retry delay', p_n),
      p_delay, interval '0 seconds', interval '30 days');
  end if;
  if p_outcome = 'succeeded' and octet_length(p_detail::text) > 262144 then
    perform app.raise_invalid(format('outcome %s: result must be at most 262144 bytes as JSON text (got %s)',
      p_n, octet_length(p_detail::text)));
  end if;
end;
$$;
revoke all on function app.explain_invalid_outcome(bigint, uuid, uuid, uuid, text, jsonb, interval) from public;

-- Record a batch of outcomes in one statement, each fenced by owner + token + a live
-- lease. p_outcomes: 'succeeded' (p_details is the result), 'retry' (p_details is the
-- error; retry_wait after p_retry_delays[i], or dead with reason max_attempts once the
-- job's attempts are used up), 'dead' (the error; dead at once, reason discarded),
-- 'exhausted' (the error; dead at once, reason max_attempts: the kind's own retry
-- policy allowed no more attempts). The batch is validated by one set-based query.
-- The fences are in the UPDATE's WHERE, which PostgreSQL re-checks on a row updated
-- concurrently (by the reaper, say), so the rows need no lock beforehand.
-- Returns one row per outcome that was applied; a stale token simply returns no row.
create function app.finish_jobs(
  p_owner text,
  p_tenant_ids uuid[],
  p_job_ids uuid[],
  p_tokens uuid[],
  p_outcomes text[],
  p_details jsonb[],
  p_retry_delays interval[]
)
returns table (job_id uuid, state app.job_state)
language plpgsql
security definer
set search_path = ''
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_count integer := coalesce(cardinality(p_job_ids), 0);
  v_bad record;
begin
  if p_owner is null or p_owner ~ '^\s*$' or length(p_owner) > 200 then
    perform app.check_owner(p_owner);
  end if;
  if v_count < 1 or v_count > 1000 then
    perform app.check_range('number of outcomes', v_count, 1, 1000);
  end if;
  if coalesce(cardinality(p_tenant_ids), -1) <> v_count
     or coalesce(cardinality(p_tokens), -1) <> v_count
     or coalesce(cardinality(p_outcomes), -1) <> v_count
     or coalesce(cardinality(p_details), -1) <> v_count
     or coalesce(cardinality(p_retry_delays), -1) <> v_count then
    perform app.raise_invalid('finish arrays must all have the same length');
  end if;

  select u.* into v_bad
  from unnest(p_tenant_ids, p_job_ids, p_tokens, p_outcomes, p_details, p_retry_delays)
    with ordinality as u(tenant_id, job_id, token, outcome, detail, delay, n)
  where u.tenant_id is null or u.job_id is null or u.token is null
     or u.outcome is null or u.outcome not in ('succeeded', 'retry', 'dead', 'exhausted')
     or (u.outcome = 'retry' and (u.delay is null or u.delay < interval '0 seconds'
                                  or u.delay > interval '30 days'))
     or (u.outcome = 'succeeded' and octet_length(u.detail::text) > 262144)
  order by u.n
  limit 1;
  if found then
    perform app.explain_invalid_outcome(v_bad.n, v_bad.tenant_id, v_bad.job_id, v_bad.token,
                                        v_bad.outcome, v_bad.detail, v_bad.delay);
  end if;

  return query
  with input as (
    select u.tenant_id, u.job_id, u.token, u.outcome,
           case when u.outcome = 'succeeded' then coalesce(u.detail, 'null'::jsonb)
                else app.error_document(u.detail) end as detail,
           u.delay
    from unnest(p_tenant_ids, p_job_ids, p_tokens, p_outcomes, p_details, p_retry_delays)
      as u(tenant_id, job_id, token, outcome, detail, delay)
  ), finished as (
    update app.jobs j
    set state = case
                  when i.outcome = 'succeeded' then 'succeeded'
                  when i.outcome = 'retry' and j.attempts < j.max_attempts then 'retry_wait'
                  else 'dead'
                end::app.job_state,
        result = case when i.outcome = 'succeeded' then i.detail else j.result end,
        last_error = case when i.outcome = 'succeeded' then j.last_error else i.detail end,
        available_at = case when i.outcome = 'retry' and j.attempts < j.max_attempts
                            then v_now + i.delay else j.available_at end,
        lease_owner = null,
        lease_token = null,
        lease_expires_at = null,
        completed_at = case when i.outcome = 'retry' and j.attempts < j.max_attempts
                            then null else v_now end,
        updated_at = v_now
    from input i
    where j.id = i.job_id
      and j.tenant_id = i.tenant_id
      and j.state = 'running'
      and j.lease_owner = p_owner
      and j.lease_token = i.token
      and j.lease_expires_at > v_now
    returning j.id, j.tenant_id, j.state, j.attempts, j.available_at, i.token, i.outcome, i.detail
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
    select f.tenant_id, f.id,
           case f.state when 'succeeded' then 'succeeded' when 'dead' then 'dead' else 'retry_scheduled' end,
           p_owner, f.token,
           case f.state
             when 'succeeded' then jsonb_build_object('attempt', f.attempts)
             when 'dead' then jsonb_build_object(
               'attempt', f.attempts,
               'reason', case when f.outcome = 'dead' then 'discarded' else 'max_attempts' end,
               'error', f.detail)
             else jsonb_build_object('attempt', f.attempts, 'retryAt', f.available_at, 'error', f.detail)
           end,
           v_now
    from finished f
  )
  select f.id, f.state from finished f;
end;
$$;

create or replace function app.complete_job(
  p_tenant_id uuid,
  p_job_id uuid,
  p_owner text,
  p_token uuid,
  p_result jsonb
)
returns boolean
language sql
security definer
set search_path = ''
as $$
  select exists (
    select 1 from app.finish_jobs(p_owner, array[p_tenant_id], array[p_job_id], array[p_token],
                                  array['succeeded'], array[p_result], array[null::interval])
  )
$$;

create or replace function app.fail_job(
  p_tenant_id uuid,
  p_job_id uuid,
  p_owner text,
  p_token uuid,
  p_error jsonb,
  p_retry_delay interval default interval '5 seconds'
)
returns app.job_state
language sql
security definer
set search_path = ''
as $$
  select (select f.state
          from app.finish_jobs(p_owner, array[p_tenant_id], array[p_job_id], array[p_token],
                               array['retry'], array[p_error], array[p_retry_delay]) f)
$$;

-- A failure that retrying cannot fix (unknown kind, invalid payload, a handler's
-- explicit discard): dead at once, whatever attempts remain.
create function app.discard_job(
  p_tenant_id uuid,
  p_job_id uuid,
  p_owner text,
  p_token uuid,
  p_error jsonb
)
returns app.job_state
language sql
security definer
set search_path = ''
as $$
  select (select f.state
          from app.finish_jobs(p_owner, array[p_tenant_id], array[p_job_id], array[p_token],
                               array['dead'], array[p_error], array[null::interval]) f)
$$;

-- Release ------------------------------------------------------------------------------

-- Expired leases go back to retry_wait (available now) or, at max_attempts, to dead.
-- One statement updates the rows and writes their audit rows; the old owner and token
-- are kept in the event. p_tenant_id NULL means every tenant (internal use only).
create function app.release_expired(p_tenant_id uuid, p_limit integer)
returns integer
language plpgsql
set search_path = ''
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_count integer;
begin
  with expired as materialized (
    select j.id, j.lease_owner, j.lease_token
    from app.jobs j
    where j.state = 'running'
      and j.lease_expires_at <= v_now
      and (p_tenant_id is null or j.tenant_id = p_tenant_id)
    order by j.lease_expires_at
    for update skip locked
    limit p_limit
  ), released as (
    update app.jobs j
    set state = case when j.attempts >= j.max_attempts then 'dead'::app.job_state
                     else 'retry_wait'::app.job_state end,
        available_at = case when j.attempts >= j.max_attempts then j.available_at else v_now end,
        last_error = jsonb_build_object('code', 'LEASE_EXPIRED',
                                        'retryable', j.attempts < j.max_attempts,
                                        'leaseOwner', e.lease_owner),
        lease_owner = null,
        lease_token = null,
        lease_expires_at = null,
        completed_at = case when j.attempts >= j.max_attempts then v_now else null end,
        updated_at = v_now
    from expired e
    where j.id = e.id
    returning j.id, j.tenant_id, j.state, j.attempts, e.lease_owner, e.lease_token
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
    select r.tenant_id, r.id,
           case when r.state = 'dead' then 'dead' else 'lease_expired' end,
           'watchdog', r.lease_token,
           jsonb_build_object('attempt', r.attempts, 'leaseOwner', r.lease_owner,
                              'recoveredState', r.state,
                              'reason', case when r.state = 'dead' then 'lease_expired_at_max_attempts'
                                             else 'lease_expired' end),
           v_now
    from released r
  )
  select count(*) into v_count from released;
  return v_count;
end;
$$;

create or replace function app.release_expired_jobs(
  p_tenant_id uuid,
  p_limit integer default 100
)
returns integer
language plpgsql
security definer
set search_path = ''
as $$
begin
  perform app.check_required('p_tenant_id', p_tenant_id);
  perform app.check_range('p_limit', p_limit, 1, 1000);
  return app.release_expired(p_tenant_id, p_limit);
end;
$$;

-- The scheduled reaper's single call: expired leases of every tenant, oldest expiry
-- first, at most p_limit rows per call, walking jobs_lease_expiry_idx.
create function app.release_all_expired_jobs(p_limit integer default 1000)
returns integer
language plpgsql
security definer
set search_path = ''
as $$
begin
  perform app.check_range('p_limit', p_limit, 1, 10000);
  return app.release_expired(null, p_limit);
end;
$$;
