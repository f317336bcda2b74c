-- leaseq 0014: the number of the worker pool's migration (app.worker_pool), which comes
-- with the worker pool itself; this file only keeps the numbers without a gap until it
-- does, and is replaced by it. It changes nothing.
select 1;
