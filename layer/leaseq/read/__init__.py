"""What an operator's or a tenant's dashboard reads and does, as Python calls of the SQL
functions granted to the reader and operator duties."""
