"""Circuit breakers: the state machine and breaker, and the store it shares across executors."""
