"""What an application declares: its job kinds and their handlers, their retry policy,
what a running handler sees of its own job, and what it may raise to steer it."""
