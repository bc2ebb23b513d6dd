"""Capability tokens (JWT, RS256): issuing and verifying."""
