"""A module that fails while it is imported (for ``mscheduler dev``'s bad-input test)."""

raise RuntimeError("the app's settings are missing")
