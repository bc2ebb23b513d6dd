"""Execution leases: fencing epochs, the leases in Redis, and the guard a run goes through."""
