"""Consumers: claim tasks, run handlers, keep leases, write outcomes."""

from mscheduler.runtime.consumer.consumer import Consumer, TaskContext
from mscheduler.runtime.consumer.handlers import SyncTaskContext

__all__ = ["Consumer", "SyncTaskContext", "TaskContext"]
