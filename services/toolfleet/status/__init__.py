"""Status: projects every lifecycle event into the ``tool_invocations`` table."""
