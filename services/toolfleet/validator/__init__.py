"""Validator: checks results against the tool's output schema, redacts, emits the outcome."""
