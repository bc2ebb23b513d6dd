"""Stopping without LeaveGroup: the dev broker's coordinator wedges on it.

The dev broker keeps a leader that sends LeaveGroup while its group rebalances as the
group's leader, and that group never assigns a partition again (a clean bounce of the
leading executor while another one starts). A member that stays silent instead is
evicted after the session timeout, leadership included, and the group reforms: a
stopped worker's partitions move after ``TOOLFLEET_SESSION_TIMEOUT_MS``. (The dev broker
numbers a group's first generation 0, and aiokafka sends LeaveGroup only from a later
one: a member of a group that never rebalanced leaves silently under any profile.)

aiokafka has no option for it, so :func:`without_leave_group` replaces its coordinator's
private ``_maybe_leave_group``: only the dev profile may touch aiokafka's private
attributes (``tests/unit/test_no_private_aiokafka.py``). With an aiokafka that changes
it, the consumer leaves as usual.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer


def without_leave_group(consumer: AIOKafkaConsumer) -> None:
    """Make ``consumer.stop()`` forget its group membership without a LeaveGroup request
    (its coordinator exists once ``start`` has begun)."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None or not hasattr(coordinator, "_maybe_leave_group"):
        return  # not started, or an aiokafka that changed: it leaves as usual

    async def forget() -> None:
        coordinator.reset_generation()

    coordinator._maybe_leave_group = forget
