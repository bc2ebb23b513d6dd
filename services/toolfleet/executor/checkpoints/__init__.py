"""Checkpoints: hot and durable stores, codec, schedule, and the sink a tool writes to."""
