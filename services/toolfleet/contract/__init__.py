"""The published shapes that are not events, one floor above :mod:`toolfleet.events`.

- :mod:`~toolfleet.contract.manifest`: a tool version's manifest
  (``schemas/manifest.json``, ``GET /v1/tools/{id}``), with its
  :mod:`~toolfleet.contract.result_rules`;
- :mod:`~toolfleet.contract.http`: the HTTP API's bodies;
- :mod:`~toolfleet.contract.progress`: the agent events a status view means (the SSE
  stream's and the agent runner's).

Pure pydantic over the event models: no I/O and nothing of the server, so the clients
(:mod:`toolfleet.client`, :mod:`toolfleet.agent`) and the API share these models
without importing each other.
"""
