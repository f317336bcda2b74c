-- leaseq functions: record outcomes.
--
-- Every transition here is fenced by owner + lease token + an unexpired lease, and a
-- stale lease is not an error: the function returns no row, false or NULL. The
-- single-job completions are thin wrappers over app.finish_jobs, so that every terminal
-- transition, and the audit row it writes, is expressed exactly once. A retry delay is
-- 0 .. 30 days (never in the past); a result at most 256 KiB, nested at most 100 levels,
-- with no number longer than 1000 characters (app.document_problem: a producer reading
-- it back could not decode it); a batch 1 .. 1000 outcomes, each array one-dimensional
-- and indexed from 1.

-- Raises the detailed 22023 message for outcome number p_n; called only when the
-- set-based check in finish_jobs found that outcome invalid.
create or replace function app.explain_invalid_outcome(
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
set search_path = pg_catalog, pg_temp
as $$
declare
  v_problem text;
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
  if p_outcome = 'succeeded' then
    v_problem := app.document_problem(p_detail, p_detail::text, 262144);
    if v_problem is not null then
      perform app.raise_invalid(format('outcome %s: result %s', p_n, v_problem));
    end if;
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
-- The fences are in the DELETE of the lease (app.leases), which PostgreSQL re-checks on
-- a row deleted concurrently (by the reaper, say), so the rows need no lock beforehand:
-- of a finish and a reaper racing for one lease, exactly one deletes it. The job row is
-- then written once, its final outcome (or a retry, a HOT update).
-- Returns one row per outcome that was applied; a stale token simply returns no row.
-- A job with a cancel request (app.request_job_cancel) ends 'cancelled' whatever the
-- outcome, never retried: its 'cancelled' event names the operator who asked (actor),
-- the worker (leaseOwner) and the outcome it reported. A success's result is kept in
-- result (the handler did the work; a producer reading it sees the state cancelled), a
-- failure's error in last_error.
create or replace function app.finish_jobs(
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
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_step interval := app.priority_step();
  v_count integer := coalesce(cardinality(p_job_ids), 0);
  v_bad record;
  v_retry_tenants uuid[];
  v_retry_ats timestamptz[];
  v_retry_kinds text[];
  v_retry_queues text[];
begin
  if p_owner is null or length(p_owner) > 200 or p_owner ~ '[^ -~]'
     or (ascii(p_owner) not between 33 and 126 and app.is_blank(p_owner)) then
    perform app.check_owner(p_owner);
  end if;
  if v_count < 1 or v_count > 1000 then
    perform app.check_range('number of outcomes', v_count, 1, 1000);
  end if;
  -- The shape of the six arrays in one plain expression (this is the hot path); the
  -- shared check, which names the argument, runs only when it fails.
  if array_ndims(p_tenant_ids) <> 1 or array_lower(p_tenant_ids, 1) <> 1
     or array_ndims(p_job_ids) <> 1 or array_lower(p_job_ids, 1) <> 1
     or array_ndims(p_tokens) <> 1 or array_lower(p_tokens, 1) <> 1
     or array_ndims(p_outcomes) <> 1 or array_lower(p_outcomes, 1) <> 1
     or array_ndims(p_details) <> 1 or array_lower(p_details, 1) <> 1
     or array_ndims(p_retry_delays) <> 1 or array_lower(p_retry_delays, 1) <> 1 then
    perform app.check_array('p_tenant_ids', p_tenant_ids);
    perform app.check_array('p_job_ids', p_job_ids);
    perform app.check_array('p_tokens', p_tokens);
    perform app.check_array('p_outcomes', p_outcomes);
    perform app.check_array('p_details', p_details);
    perform app.check_array('p_retry_delays', p_retry_delays);
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
     -- CASE, not AND: octet_length of a NULL result is NULL, which AND does not
     -- short-circuit, so the call would run for every result-less outcome.
     or case when u.outcome = 'succeeded' and octet_length(u.detail::text) > 200
             then app.document_problem(u.detail, u.detail::text, 262144) is not null
             else false end
  order by u.n
  limit 1;
  if found then
    perform app.explain_invalid_outcome(v_bad.n, v_bad.tenant_id, v_bad.job_id, v_bad.token,
                                        v_bad.outcome, v_bad.detail, v_bad.delay);
  end if;

  -- A retry makes its job claimable again at now + delay: its tenant and kind are due a
  -- turn then (app.wake_tenants, before the update: the turn may then be a little early,
  -- never late). The kind is read from the job (one primary-key probe per retry); a job
  -- not found (a wrong id, which the update then skips) wakes its tenant only.
  if 'retry' = any (p_outcomes) then
    select array_agg(u.tenant_id order by u.n), array_agg(v_now + u.delay order by u.n),
           array_agg(j.kind order by u.n), array_agg(j.queue order by u.n)
    into v_retry_tenants, v_retry_ats, v_retry_kinds, v_retry_queues
    from unnest(p_tenant_ids, p_job_ids, p_outcomes, p_retry_delays)
      with ordinality as u(tenant_id, job_id, outcome, delay, n)
    left join app.jobs j on j.id = u.job_id and j.tenant_id = u.tenant_id
    where u.outcome = 'retry';
    perform app.wake_tenants(v_retry_queues, v_retry_tenants, v_retry_ats, v_retry_kinds);
  end if;

  return query
  with input as (
    select u.tenant_id, u.job_id, u.token, u.outcome,
           case when u.outcome = 'succeeded' then coalesce(u.detail, 'null'::jsonb)
                else app.error_document(u.detail) end as detail,
           u.delay
    from unnest(p_tenant_ids, p_job_ids, p_tokens, p_outcomes, p_details, p_retry_delays)
      as u(tenant_id, job_id, token, outcome, detail, delay)
  ), ended as (
    -- The lease, fenced by owner, token and expiry: one primary-key probe each.
    delete from app.leases l
    using input i
    where l.job_id = i.job_id
      and l.tenant_id = i.tenant_id
      and l.lease_owner = p_owner
      and l.lease_token = i.token
      and l.expires_at > v_now
    returning l.job_id, l.tenant_id, i.token, i.outcome, i.detail, i.delay
  ), finished as (
    update app.jobs j
    set state = case
                  when j.cancel_requested_at is not null then 'cancelled'
                  when i.outcome = 'succeeded' then 'succeeded'
                  when i.outcome = 'retry' and j.attempts < j.max_attempts then 'retry_wait'
                  else 'dead'
                end::app.job_state,
        result = case when i.outcome = 'succeeded' then i.detail else j.result end,
        last_error = case when i.outcome = 'succeeded' then j.last_error else i.detail end,
        available_at = case when i.outcome = 'retry' and j.attempts < j.max_attempts
                                 and j.cancel_requested_at is null
                            then v_now + i.delay else j.available_at end,
        claim_key = case when i.outcome = 'retry' and j.attempts < j.max_attempts
                              and j.cancel_requested_at is null
                         then v_now + i.delay - (j.priority - 1) * v_step
                         else j.claim_key end,
        lease_owner = null,
        completed_at = case when i.outcome = 'retry' and j.attempts < j.max_attempts
                                 and j.cancel_requested_at is null
                            then null else v_now end,
        updated_at = v_now
    from ended i
    where j.id = i.job_id
      and j.tenant_id = i.tenant_id
      and j.state = 'running'
    returning j.id, j.tenant_id, j.state, j.attempts, j.available_at, i.token, i.outcome, i.detail,
              j.cancel_requested_by, j.cancel_requested_at
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
    select f.tenant_id, f.id,
           case f.state when 'succeeded' then 'succeeded' when 'dead' then 'dead'
                        when 'cancelled' then 'cancelled' else 'retry_scheduled' end,
           case f.state when 'cancelled' then f.cancel_requested_by else p_owner end, f.token,
           case f.state
             when 'succeeded' then jsonb_build_object('attempt', f.attempts)
             when 'cancelled' then jsonb_build_object(
               'attempt', f.attempts, 'previousState', 'running', 'leaseOwner', p_owner,
               'outcome', f.outcome, 'requestedAt', f.cancel_requested_at,
               'reason', 'cancel_requested')
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
revoke all on function app.finish_jobs(text, uuid[], uuid[], uuid[], text[], jsonb[], interval[]) from public;
grant execute on function app.finish_jobs(text, uuid[], uuid[], uuid[], text[], jsonb[], interval[]) to leaseq_worker;

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
set search_path = pg_catalog, pg_temp
as $$
  select exists (
    select 1 from app.finish_jobs(p_owner, array[p_tenant_id], array[p_job_id], array[p_token],
                                  array['succeeded'], array[p_result], array[null::interval])
  )
$$;
revoke all on function app.complete_job(uuid, uuid, text, uuid, jsonb) from public;
grant execute on function app.complete_job(uuid, uuid, text, uuid, jsonb) to leaseq_worker;

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
set search_path = pg_catalog, pg_temp
as $$
  select (select f.state
          from app.finish_jobs(p_owner, array[p_tenant_id], array[p_job_id], array[p_token],
                               array['retry'], array[p_error], array[p_retry_delay]) f)
$$;
revoke all on function app.fail_job(uuid, uuid, text, uuid, jsonb, interval) from public;
grant execute on function app.fail_job(uuid, uuid, text, uuid, jsonb, interval) to leaseq_worker;

-- A failure that retrying cannot fix (unknown kind, invalid payload, a handler's
-- explicit discard): dead at once, whatever attempts remain.
create or replace function app.discard_job(
  p_tenant_id uuid,
  p_job_id uuid,
  p_owner text,
  p_token uuid,
  p_error jsonb
)
returns app.job_state
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
  select (select f.state
          from app.finish_jobs(p_owner, array[p_tenant_id], array[p_job_id], array[p_token],
                               array['dead'], array[p_error], array[null::interval]) f)
$$;
revoke all on function app.discard_job(uuid, uuid, text, uuid, jsonb) from public;
grant execute on function app.discard_job(uuid, uuid, text, uuid, jsonb) to leaseq_worker;

-- Give back claimed jobs that were never started. A worker checks before each job that
-- the time left in its invocation covers that job's budget; a job it cannot start in
-- time is handed back at once with its claim undone: the attempt is not counted, and
-- other workers may claim it at once instead of waiting for the lease to expire. It
-- goes behind the work that is ready now (available_at = now): a job no invocation has
-- time for must not come back first on every claim and hold up the rest of the queue.
-- The tenth give-back (counting `released` events since the job was last redriven) makes
-- it dead instead, reason given_back_too_often, with the attempt of that claim counted
-- (claims minus give-backs stay equal to attempts): a kind whose timeout no invocation
-- leaves room for would otherwise be handed round for ever.
-- A job given back after a cancel was requested is not handed round: it ends
-- 'cancelled' (its attempt counted, as it was claimed), never claimable again.
create or replace function app.release_jobs(
  p_owner text,
  p_tenant_ids uuid[],
  p_job_ids uuid[],
  p_tokens uuid[]
)
returns table (job_id uuid)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_step interval := app.priority_step();
  v_count integer := coalesce(cardinality(p_job_ids), 0);
begin
  perform app.check_owner(p_owner);
  perform app.check_array('p_tenant_ids', p_tenant_ids);
  perform app.check_array('p_job_ids', p_job_ids);
  perform app.check_array('p_tokens', p_tokens);
  perform app.check_range('number of jobs', v_count, 1, 1000);
  if coalesce(cardinality(p_tenant_ids), -1) <> v_count
     or coalesce(cardinality(p_tokens), -1) <> v_count then
    perform app.raise_invalid('release arrays must all have the same length');
  end if;
  if array_position(p_job_ids, null) is not null
     or array_position(p_tenant_ids, null) is not null
     or array_position(p_tokens, null) is not null then
    perform app.raise_invalid('tenant_id, job_id and token are required for every job');
  end if;

  -- A job given back is claimable at once: its tenant and kind are due a turn now (the
  -- kind and queue read from the job, one primary-key probe per job).
  perform app.wake_tenants(w.queues, p_tenant_ids, null, w.kinds)
  from (
    select array_agg(j.kind order by u.n) as kinds, array_agg(j.queue order by u.n) as queues
    from unnest(p_tenant_ids, p_job_ids) with ordinality as u(tenant_id, job_id, n)
    left join app.jobs j on j.id = u.job_id and j.tenant_id = u.tenant_id
  ) w;

  return query
  with input as (
    select u.tenant_id, u.job_id, u.token,
           (select count(*) >= 9
            from app.job_events e
            where e.tenant_id = u.tenant_id and e.job_id = u.job_id
              and e.event_type = 'released'
              and e.sequence > coalesce((select max(r.sequence) from app.job_events r
                                         where r.tenant_id = u.tenant_id
                                           and r.job_id = u.job_id
                                           and r.event_type = 'redriven'), 0)) as too_often
    from unnest(p_tenant_ids, p_job_ids, p_tokens) as u(tenant_id, job_id, token)
  ), ended as (
    delete from app.leases l
    using input i
    where l.job_id = i.job_id
      and l.tenant_id = i.tenant_id
      and l.lease_owner = p_owner
      and l.lease_token = i.token
      and l.expires_at > v_now
    returning l.job_id, l.tenant_id, i.token, i.too_often
  ), given_back as (
    update app.jobs j
    set state = case when j.cancel_requested_at is not null then 'cancelled'::app.job_state
                     when i.too_often then 'dead'::app.job_state
                     when j.attempts <= 1 then 'pending'::app.job_state
                     else 'retry_wait'::app.job_state end,
        attempts = case when i.too_often or j.cancel_requested_at is not null then j.attempts
                        else j.attempts - 1 end,
        available_at = case when j.cancel_requested_at is not null then j.available_at
                            else v_now end,
        claim_key = case when j.cancel_requested_at is not null then j.claim_key
                         else v_now - (j.priority - 1) * v_step end,
        completed_at = case when i.too_often or j.cancel_requested_at is not null then v_now
                            else j.completed_at end,
        last_error = case when j.cancel_requested_at is not null then j.last_error
                          when i.too_often then jsonb_build_object(
                       'code', 'GIVEN_BACK_TOO_OFTEN', 'kind', j.kind, 'givenBack', 10,
                       'message', format('kind %s was given back 10 times without being '
                         'started: no worker invocation left the time its timeout needs. '
                         'Raise the worker''s invocation time (WorkerTimeoutSeconds, '
                         'LEASEQ_WORKER_TIMEOUT_SECONDS) or lower the kind''s timeout, '
                         'then redrive it', j.kind))
                     else j.last_error end,
        lease_owner = null,
        updated_at = v_now
    from ended i
    where j.id = i.job_id
      and j.tenant_id = i.tenant_id
      and j.state = 'running'
    returning j.id, j.tenant_id, j.state, j.attempts, i.token, i.too_often, j.last_error,
              j.cancel_requested_by, j.cancel_requested_at
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
    select g.tenant_id, g.id,
           case when g.state = 'cancelled' then 'cancelled'
                when g.too_often then 'dead' else 'released' end,
           case when g.state = 'cancelled' then g.cancel_requested_by else p_owner end, g.token,
           case when g.state = 'cancelled'
                then jsonb_build_object('attempt', g.attempts, 'previousState', 'running',
                                        'leaseOwner', p_owner, 'outcome', 'not_started',
                                        'requestedAt', g.cancel_requested_at,
                                        'reason', 'cancel_requested')
                when g.too_often
                then jsonb_build_object('attempt', g.attempts, 'reason', 'given_back_too_often',
                                        'error', g.last_error)
                else jsonb_build_object('attempts', g.attempts, 'reason', 'not_started') end,
           v_now
    from given_back g
  )
  select g.id from given_back g;
end;
$$;
revoke all on function app.release_jobs(text, uuid[], uuid[], uuid[]) from public;
grant execute on function app.release_jobs(text, uuid[], uuid[], uuid[]) to leaseq_worker;

-- Record a batch's outcomes and claim the next batch in one call: one round trip and one
-- commit per batch, which bench/ measured as the largest remaining cost of a no-op drain
-- when claim and finish were separate (docs/benchmarks.md). Both halves are the functions
-- above, so fences, bounds, fairness and audit rows are exactly theirs; they share one
-- transaction, so a refused outcome also refuses the claim (the worker then records and
-- claims apart). Rows: first one per outcome applied (claimed = false: id and the job's
-- new state; a stale token gives no row), then the jobs claimed (claimed = true, with
-- what a worker needs to run them). p_limit 0 claims nothing; an empty outcome list
-- records nothing. p_kinds / p_exclude_kinds are the claim's kind filter
-- (app.claim_ready_jobs); a bad one refuses the whole call, also when p_limit is 0.
-- The payload is cast to jsonb because RETURN QUERY wants the declared column types
-- exactly and the column's type is the domain app.job_payload.
create or replace function app.finish_and_claim_jobs(
  p_owner text,
  p_tenant_ids uuid[],
  p_job_ids uuid[],
  p_tokens uuid[],
  p_outcomes text[],
  p_details jsonb[],
  p_retry_delays interval[],
  p_limit integer default 10,
  p_lease interval default interval '30 seconds',
  p_kinds text[] default null,
  p_exclude_kinds text[] default null,
  p_queue text default null
)
returns table (
  claimed boolean,
  id uuid,
  tenant_id uuid,
  state app.job_state,
  operation_key text,
  kind text,
  payload jsonb,
  attempts integer,
  max_attempts integer,
  available_at timestamptz,
  created_at timestamptz,
  lease_owner text,
  lease_token uuid,
  lease_expires_at timestamptz,
  correlation_id text,
  priority smallint
)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  if p_limit is null or p_limit < 0 or p_limit > 100 then
    perform app.check_range('p_limit', p_limit, 0, 100);
  end if;
  -- The claim below checks the kind filter; without a claim it is checked here.
  if p_limit = 0 and (p_kinds is not null or p_exclude_kinds is not null) then
    perform app.check_kind_filter(p_kinds, p_exclude_kinds);
  end if;
  if p_limit = 0 and p_queue is not null then
    perform app.check_queue('p_queue', p_queue);
  end if;
  if coalesce(cardinality(p_job_ids), 0) > 0 then
    return query
    select false, f.job_id, null::uuid, f.state, null::text, null::text, null::jsonb,
           null::integer, null::integer, null::timestamptz, null::timestamptz,
           null::text, null::uuid, null::timestamptz, null::text, null::smallint
    from app.finish_jobs(p_owner, p_tenant_ids, p_job_ids, p_tokens, p_outcomes, p_details,
                         p_retry_delays) f;
  else
    -- Nothing to record, and finish_jobs (which checks the arrays) is not called: the
    -- arrays are still held to its shape rule, so that no argument is taken unchecked.
    if array_ndims(p_tenant_ids) <> 1 or array_lower(p_tenant_ids, 1) <> 1
       or array_ndims(p_job_ids) <> 1 or array_lower(p_job_ids, 1) <> 1
       or array_ndims(p_tokens) <> 1 or array_lower(p_tokens, 1) <> 1
       or array_ndims(p_outcomes) <> 1 or array_lower(p_outcomes, 1) <> 1
       or array_ndims(p_details) <> 1 or array_lower(p_details, 1) <> 1
       or array_ndims(p_retry_delays) <> 1 or array_lower(p_retry_delays, 1) <> 1 then
      perform app.check_array('p_tenant_ids', p_tenant_ids);
      perform app.check_array('p_job_ids', p_job_ids);
      perform app.check_array('p_tokens', p_tokens);
      perform app.check_array('p_outcomes', p_outcomes);
      perform app.check_array('p_details', p_details);
      perform app.check_array('p_retry_delays', p_retry_delays);
    end if;
  end if;
  if p_limit > 0 then
    return query
    select true, c.id, c.tenant_id, c.state, c.operation_key, c.kind, c.payload::jsonb,
           c.attempts, c.max_attempts, c.available_at, c.created_at,
           c.lease_owner, c.lease_token, c.lease_expires_at, c.correlation_id, c.priority
    from app.claim_ready_jobs(p_owner, p_limit, p_lease, p_kinds, p_exclude_kinds,
                                p_queue) c;
  end if;
end;
$$;
revoke all on function app.finish_and_claim_jobs(text, uuid[], uuid[], uuid[], text[], jsonb[], interval[], integer, interval, text[], text[], text) from public;
grant execute on function app.finish_and_claim_jobs(text, uuid[], uuid[], uuid[], text[], jsonb[], interval[], integer, interval, text[], text[], text) to leaseq_worker;

-- A hand edit of a succeeded job's completed_at moves its 'succeeded' event to the same
-- time (trigger jobs_succeeded_event_follows, 0032): retention, the succeeded list and
-- the activity counts find succeeded jobs by that event (job_events_succeeded_idx), so
-- the two must agree. The functions never move a succeeded job's completion time, so
-- this never runs on their paths.
create or replace function app.move_succeeded_event()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  update app.job_events e
  set created_at = new.completed_at
  where e.job_id = new.id and e.tenant_id = new.tenant_id
    and e.event_type = 'succeeded' and e.created_at = old.completed_at;
  return null;
end;
$$;
revoke all on function app.move_succeeded_event() from public;
