"""PostgreSQL: connections and TLS, the one client that sends every SQL call, its face per
duty (producer, worker, reaper, operator, reader), and the migrator."""
