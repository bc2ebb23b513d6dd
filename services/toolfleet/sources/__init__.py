"""Tool sources: MCP servers and HTTP APIs whose tools run through the normal pipeline.

An operator registers a source (``toolfleet sources add``, ``POST /v1/sources``); the
API stores it and requests a listing, which an executor does
(:mod:`toolfleet.sources.listing`: the API never starts or reaches a source). Its
tools are registered as ``mcp__{server}__{tool}``, or for HTTP under their manifest id
(``http__{source}__{operation}`` when none is declared), at a version derived from their
schema, and executors run them through a
:class:`~toolfleet.sources.provider.SourceToolProvider`. No policy allows them until an
operator names them (:func:`toolfleet.sources.naming.is_untrusted`).
"""
