"""The benchmark harness: drivers for each queue, meters shared by all, the report."""
