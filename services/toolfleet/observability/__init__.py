"""Logs, traces and metrics, set up once per process."""
