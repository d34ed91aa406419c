"""Storage: schema, engine, ingest writer, queries and retention."""
