"""``toolfleet worker maintenance``: scheduled housekeeping of the fleet's Postgres rows."""
