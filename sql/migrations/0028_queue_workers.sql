-- leaseq 0028: the named queues' worker functions, registered at deploy time.
--
-- A queue declared as a nested application (infra/queue.yaml) has its own worker function,
-- created after the leaseq stack and unknown to the enqueue function's environment. Its
-- deploy registers the function here (the Registration custom resource, handled by the
-- leaseq stack's migrations function as the schema owner), so that:
--   * an enqueue that wins a queue's wake ticket can find the worker to start
--     (app.queue_worker_function, the producers' one read of this table);
--   * the connection budget counts every queue's worker: each execution holds one
--     connection, and a queue's reserved concurrency caps its executions, so the leaseq
--     stack's own functions plus every registered queue must fit the database's
--     connections. The leaseq stack's own need is kept in app.connection_budget by its
--     migrations resource; a registration is refused when the sum would not fit.
--
-- Only the owner writes either table (the deploy); no function's login reads them, but the
-- producers through app.queue_worker_function.

create table app.queue_workers (
  queue text primary key
    constraint queue_workers_queue_name check (queue ~ '^[a-z][a-z0-9_-]{0,39}$'),
  -- A function name or ARN (at most 170 characters, as Lambda's Invoke takes it).
  function_name text not null
    constraint queue_workers_function_shape check (
      function_name ~ '^(arn:aws[a-zA-Z-]*:lambda:[a-z0-9-]+:[0-9]{12}:function:)?[A-Za-z0-9_-]{1,64}(:[A-Za-z0-9_$-]{1,128})?$'
      and length(function_name) <= 170),
  -- The connections the queue's worker can open: its reserved concurrency, or, left
  -- unreserved, its pool plus the schedule's tick; 0 for a worker of the leaseq stack
  -- itself (the slow queue's), which the stack's own figure already counts.
  connections integer not null
    constraint queue_workers_connections_range check (connections between 0 and 10000),
  -- The CloudFormation stack that registered it: only that stack's delete removes it.
  stack_id text not null
    constraint queue_workers_stack_shape check (length(stack_id) between 1 and 2048),
  registered_at timestamptz not null default clock_timestamp(),
  updated_at timestamptz not null default clock_timestamp()
);
revoke all on app.queue_workers from public;
alter table app.queue_workers enable row level security;

create table app.connection_budget (
  only_row boolean primary key default true check (only_row),
  -- What the leaseq stack's own functions and operators can open (connection_budget.py).
  stack_connections integer not null
    constraint connection_budget_stack_range check (stack_connections between 0 and 100000),
  -- ProxyMaxConnectionsPercent when the functions go through RDS Proxy, else NULL.
  proxy_percent integer
    constraint connection_budget_proxy_range check (proxy_percent between 1 and 100),
  updated_at timestamptz not null default clock_timestamp()
);
revoke all on app.connection_budget from public;
alter table app.connection_budget enable row level security;

comment on table app.queue_workers is
  'Each named queue''s worker function, registered by the queue''s deploy: what an enqueue '
  'wakes, and what the connection budget counts.';
comment on column app.queue_workers.connections is
  'Database connections the queue''s worker can open (its reserved concurrency).';
comment on column app.queue_workers.stack_id is
  'The stack that registered the worker; only its delete unregisters it.';
comment on table app.connection_budget is
  'One row: the connections the leaseq stack''s own functions can open, as its last deploy '
  'checked them, for the queues'' registrations to add to.';
