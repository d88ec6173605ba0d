"""The domain: pure rules and value types (tasks, state, retries, schedules, plans, limits, events,
outcomes, listing filters, exceptions, the clock seam) — no store, no network, no files.

May import: nothing of mscheduler outside ``mscheduler.domain`` (checked by ``make lint``).
"""
