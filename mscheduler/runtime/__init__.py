"""The runtime: what runs in a user's process — the ``Publisher`` and the ``Consumer`` (discovery,
claimer, runner, pinger, finisher, flow-limit slots), hosting the background services.

May import: ``mscheduler.observability``, ``mscheduler.services``, ``mscheduler.operations``,
``mscheduler.drivers``, ``mscheduler.domain``.
"""
