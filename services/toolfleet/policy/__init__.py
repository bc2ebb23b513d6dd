"""Policy: verifies the capability token, resolves the tool, applies policy-as-data."""
