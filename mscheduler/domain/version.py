"""The package's version, one place for ``mscheduler.__version__``, the CLI, the API and spans."""

__version__ = "0.1.0"
