"""``toolfleet doctor``: a deployment checked against what production needs.

One line per check, in this order (``--json`` for machines), exit 1 on any failure:

=============== ==============================================================
keys            grant key, token verification key, signing key and Kafka secret
                files present, parseable, owner-only where secret (:mod:`.keys`)
kafka-security  TLS and client authentication unless every broker is on loopback
broker-api      the brokers support the APIs the profile's clients use
topics          contract and pool topics exist with their partition counts
retention       ``retention.ms``, ``cleanup.policy`` ... as ``topics.yaml`` says
replication     replicas and ``min.insync.replicas`` as configured and as production
                sizes them
redis           AOF or RDB snapshots on (a warning when Redis will not say)
migrations      every shipped Postgres migration applied
pools           every pool in use has a live executor
=============== ==============================================================

Under the ``dev`` broker profile, what only production needs (TLS/SASL on loopback,
replication, Redis persistence) is a warning, not a failure. Checks are pure functions
of facts (:mod:`.keys`, :mod:`.kafka`, :mod:`.topics`, :mod:`.stores`);
:func:`~toolfleet.doctor.run.examine` gathers the facts, each bounded by a timeout.
"""

from toolfleet.doctor.results import CheckResult, CheckStatus, Profile

__all__ = ["CheckResult", "CheckStatus", "Profile"]
