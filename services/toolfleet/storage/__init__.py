"""Connections to Redis and Postgres, and the Postgres migrations."""
