"""The ``toolfleet`` command line (contract section 6)."""
