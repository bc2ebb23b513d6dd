"""Document context: the documents a call may read through ``ctx.documents``.

A document source is an MCP server exposing ``get_source_of_truth``,
``search_documents``, ``find_overlaps`` and ``get_document_metadata``
(:mod:`~toolfleet.documents.mcp_source`; :mod:`~toolfleet.documents.reference_server`
is a small one). :class:`~toolfleet.documents.reader.CallDocuments` is what a tool sees:
it checks access, caches in Redis and pins versions at the first read.
"""
