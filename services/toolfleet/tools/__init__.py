"""What a tool is and what it sees: the floor every tool runtime builds on.

- :mod:`~toolfleet.tools.spec`: ``@tool`` and the :class:`~toolfleet.tools.spec.ToolSpec`
  it attaches;
- :mod:`~toolfleet.tools.context`: the :class:`~toolfleet.tools.context.ToolContext` a
  running tool gets, and the ports behind it;
- :mod:`~toolfleet.tools.options`: ``@tool``'s option groups (``Results``,
  ``Resilience``, ``Sandbox``), built from :mod:`~toolfleet.tools.resilience` (the
  resilience) and :mod:`~toolfleet.tools.limits` (the limits) a tool declares;
- :mod:`~toolfleet.tools.documents`: the documents a tool reads.

No I/O and nothing of the fleet: the isolation runtime, the sources, the executor and
the SDK build on it. Tool authors import :mod:`toolfleet.sdk`, which re-exports it.
"""
