"""Executor: runs tools under timeouts, with checkpoints, resume and cancellation."""
