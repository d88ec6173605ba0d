"""Remote executors over HTTP: the protocol's server side (``executors``:
``RemoteExecutors``, which the REST API serves) and its Python client (``client``, needs httpx).

May import: ``mscheduler.runtime`` and everything below it.
"""

from mscheduler.remote.executors import RemoteExecutors

__all__ = ["RemoteExecutors"]
