"""Consumers: claim tasks, run handlers, keep leases, write outcomes."""

from mscheduler.runtime.consumer.consumer import Consumer, TaskContext

__all__ = ["Consumer", "TaskContext"]
