"""``toolfleet dev``: the whole fleet on one machine, with embedded servers."""
