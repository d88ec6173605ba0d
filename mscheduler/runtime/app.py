"""An application's handlers, consumers and plans, defined apart from the store.

``App`` is a registry: handlers (``@app.handler(name)``, any kind ``Consumer.register`` takes),
the consumers to run them (``app.consumer(...)``: which names, with which settings; one consumer
for every handler when none is declared) and recurring plans to create if missing
(``app.plan(...)``). ``app.consumers(driver)`` builds the consumers on a store — so one module
runs unchanged under ``mscheduler worker myapp:app`` (MongoDB), ``mscheduler dev myapp:app`` (an
in-memory store with the API and the dashboard) and in tests (``mscheduler.testing``)::

    app = App("shop")

    @app.handler("send_invoice")
    async def send_invoice(params: Invoice, ctx: TaskContext) -> dict[str, str]: ...

    @app.handler("render_pdf")          # a plain function: runs in a thread
    def render_pdf(params: dict[str, Any]) -> str: ...

    app.consumer(concurrency=20)        # optional: settings of the consumer(s)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mscheduler.domain.clock import Clock
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import validate_name
from mscheduler.domain.plans import Plan
from mscheduler.drivers.base import Driver, is_driver
from mscheduler.operations import Operations
from mscheduler.runtime.consumer.consumer import Consumer
from mscheduler.runtime.consumer.handlers import Handler, HandlerPools, RunIn, inspect_handler

# settings that name the store or the clock: the caller of ``consumers`` gives those
_NOT_SETTINGS = ("driver", "clock")


@dataclass(slots=True)
class _ConsumerSpec:
    names: tuple[str, ...] | None  # None: every handler of the app
    settings: dict[str, Any] = field(default_factory=dict)


class App:
    """Handlers, consumers and plans of one application, with no store (see the module doc).

    :param name: names the app in messages (``mscheduler dev`` prints it).
    """

    def __init__(self, name: str = "app") -> None:
        if not isinstance(name, str) or not name.strip():
            raise InvalidInput(f"App name: a non-empty string, got {name!r}")
        self.name = name
        self._handlers: dict[str, tuple[Handler, RunIn | None]] = {}
        self._consumers: list[_ConsumerSpec] = []
        self._plans: dict[str, Plan] = {}
        self._check = HandlerPools(1, 1, "check")  # never started: register checks only

    def __repr__(self) -> str:
        return f"App({self.name!r}, handlers={sorted(self._handlers)}, consumers={len(self._consumers)})"

    # -- definition ----------------------------------------------------------------------------

    def register(self, name: str, fn: Handler, *, run_in: RunIn | None = None) -> None:
        """Add a handler, as ``Consumer.register`` (checked now: a bad one is ``InvalidInput``)."""
        try:
            validate_name(name)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from exc
        if name in self._handlers:
            raise InvalidInput(f"a handler for {name!r} is already registered in {self.name!r}")
        inspect_handler(name, fn, run_in, self._check)
        self._handlers[name] = (fn, run_in)

    def handler(self, name: str, *, run_in: RunIn | None = None) -> Callable[[Handler], Handler]:
        """Decorator form of ``register``."""

        def decorate(fn: Handler) -> Handler:
            self.register(name, fn, run_in=run_in)
            return fn

        return decorate

    def consumer(self, *, names: Sequence[str] | None = None, **settings: Any) -> None:
        """Declare a consumer: the handler ``names`` it runs (default: all of them) and its
        ``Consumer`` settings (``concurrency``, ``groups``, ``thread_pool_size``, ...; not the
        store nor the clock). Declare several to split names or settings; none declared: one
        consumer runs every handler with the defaults."""
        for bad in _NOT_SETTINGS:
            if bad in settings:
                raise InvalidInput(f"app.consumer(): {bad} is given when the consumers are built, not here")
        if names is not None:
            if isinstance(names, (str, bytes)) or not isinstance(names, Sequence) or not names:
                raise InvalidInput(f"app.consumer(): names is a non-empty list of task names, got {names!r}")
            names = tuple(names)
        try:  # the settings are checked now, by building a consumer that is never started
            Consumer(_NoStore(), **settings)  # type: ignore[arg-type]
        except TypeError as exc:
            raise InvalidInput(f"app.consumer(): {exc}") from exc
        self._consumers.append(_ConsumerSpec(names, dict(settings)))

    def plan(self, plan: Plan) -> None:
        """A recurring plan the app needs: created at start if no plan has its id (an existing
        one is left as it is, as an operator may have changed it)."""
        if not isinstance(plan, Plan):
            raise InvalidInput(f"app.plan() takes a Plan, got {type(plan).__name__}")
        if plan.plan_id in self._plans:
            raise InvalidInput(f"plan {plan.plan_id!r} is already declared in {self.name!r}")
        self._plans[plan.plan_id] = plan

    # -- use -------------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        """The task names the app handles."""
        return sorted(self._handlers)

    @property
    def plans(self) -> list[Plan]:
        return list(self._plans.values())

    def consumers(self, driver: Driver, *, clock: Clock | None = None, **overrides: Any) -> list[Consumer]:
        """The app's consumers on ``driver`` (on ``clock`` when given; ``overrides`` replace
        settings of every one, as tests do with ``poll_interval``). ``InvalidInput`` for an app
        with no handler, or a consumer naming a handler the app lacks."""
        if not self._handlers:
            raise InvalidInput(f"app {self.name!r} defines no handler, so no consumer")
        specs = self._consumers or [_ConsumerSpec(None)]
        built: list[Consumer] = []
        for spec in specs:
            names = spec.names or tuple(self._handlers)
            missing = [n for n in names if n not in self._handlers]
            if missing:
                raise InvalidInput(f"app {self.name!r}: a consumer runs {missing}, which has no handler")
            settings = spec.settings | overrides | ({"clock": clock} if clock is not None else {})
            consumer = Consumer(driver, **settings)
            for name in names:
                fn, run_in = self._handlers[name]
                consumer.register(name, fn, run_in=run_in)
            built.append(consumer)
        return built

    async def add_plans(self, store: Driver | Operations) -> list[str]:
        """Create the app's plans that do not exist yet on ``store`` (a driver, or the
        ``Operations`` over one); the ids of those created. ``mscheduler dev``, ``mscheduler
        worker`` and the testing kit call it at start; a plain script calls it once before it
        starts the app's consumers, whose planners then turn due occurrences into tasks."""
        if isinstance(store, Operations):
            operations = store
        elif is_driver(store):
            operations = Operations(store)
        else:
            raise InvalidInput(
                f"app.add_plans() takes the store: a driver (app.add_plans(driver)) or "
                f"Operations(driver), got {type(store).__name__}"
            )
        created = []
        for plan in self._plans.values():
            try:
                await operations.get_plan(plan.plan_id)
            except LookupError:
                await operations.add_plan(plan)
                created.append(plan.plan_id)
        return created


class _NoStore:
    """Stands for a store while ``App.consumer`` checks settings (a consumer touches its store
    only when it starts)."""
