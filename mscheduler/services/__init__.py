"""Background services: passes over the store with ``run_once()`` (planner, expiry, retention,
children reconciler) on ``PeriodicService``, and the event log's recorder and reader.

May import: ``mscheduler.drivers`` and ``mscheduler.domain``.
"""
