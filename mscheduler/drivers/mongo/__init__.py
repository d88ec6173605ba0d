"""The MongoDB driver: every filter, update, pipeline, index and change stream of the product,
one module per collection or concern beside ``driver.py``.

May import: ``mscheduler.drivers.base``, ``mscheduler.domain``, PyMongo.
"""

from mscheduler.drivers.mongo.driver import MongoDriver

__all__ = ["MongoDriver"]
