"""The operators' console at ``/console``: page, static files, live feed, timeline."""
