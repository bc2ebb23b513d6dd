"""The consumer runtime's parts: its spec, its shared core and its modes.

Callers import from :mod:`toolfleet.bus.runtime`, which assembles them.
"""
