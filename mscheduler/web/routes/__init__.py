"""The REST API's routers, one module per resource, each a thin layer over one ``Operations``
method per route; ``web/deps.py`` holds what they share (auth, errors, the operations).

May import: ``mscheduler.web.deps``, ``mscheduler.web.models`` and everything below the surfaces.
"""

from fastapi import APIRouter

from mscheduler.web.routes.bulk import bulk
from mscheduler.web.routes.events import events
from mscheduler.web.routes.executors import executors
from mscheduler.web.routes.handlers import handlers
from mscheduler.web.routes.health import health
from mscheduler.web.routes.limits import limits
from mscheduler.web.routes.plans import plans
from mscheduler.web.routes.stats import misc
from mscheduler.web.routes.tasks import tasks
from mscheduler.web.routes.workers import workers
from mscheduler.web.routes.workflows import workflows

# in the order the OpenAPI schema lists them
ROUTERS: tuple[APIRouter, ...] = (
    tasks,
    workflows,
    bulk,
    handlers,
    plans,
    limits,
    workers,
    misc,
    health,
    events,
    executors,
)
