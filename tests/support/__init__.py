"""Test support: real servers (broker, Redis, Postgres), polling, fleet processes."""
