"""Observability: structured logs, OpenTelemetry spans (``tracing``), Prometheus metrics
(``metrics``, fed by consumers' and publishers' listeners and by ``Operations``).

May import: ``mscheduler.operations``, ``mscheduler.services``, ``mscheduler.drivers``, ``mscheduler.domain``.
"""
