"""Runnable examples: ``mscheduler dev examples.shop:app``."""
