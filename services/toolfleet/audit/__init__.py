"""Audit: one PII-safe, OCSF-projected audit event per lifecycle event, for SIEMs."""
