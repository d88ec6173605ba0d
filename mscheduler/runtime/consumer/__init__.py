"""Consumers: claim tasks, run handlers, keep leases, write outcomes."""

from mscheduler.runtime.consumer.consumer import Consumer
from mscheduler.runtime.consumer.handlers import SyncTaskContext
from mscheduler.runtime.consumer.runner import TaskContext

__all__ = ["Consumer", "SyncTaskContext", "TaskContext"]
