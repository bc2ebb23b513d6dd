"""What the validator checks in a tool's result beyond its schema (pure logic, no I/O).

:mod:`~toolfleet.contract.result_rules` is the per-tool declaration the registry stores in the
manifest; :mod:`~toolfleet.results.coercion` and :mod:`~toolfleet.results.sanitizer`
apply it; :mod:`~toolfleet.results.checks` runs the whole sequence the validator runs.
"""
