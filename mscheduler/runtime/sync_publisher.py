"""Publishing from synchronous code (WSGI apps: Django, Flask; scripts; management commands).

``SyncPublisher`` has ``Publisher``'s ``send``, ``send_many``, ``wait``, ``get`` and
``update_option`` as plain blocking methods, with the same rules, results and exceptions
(``InvalidInput``, ``UnknownTask``, ``TaskFailed``, ``TaskExpired``, ``TaskCancelled``,
``TimeoutError``, ``StorageError``) — because it *is* a ``Publisher``: each call runs the async
publisher's coroutine on an event loop in a background thread and blocks until it returns.

Why not a second implementation over PyMongo's synchronous ``MongoClient``: every query lives
once, in the async driver (``mscheduler.drivers.mongo``), with its indexes, retries, explain
tests and the memory driver's conformance suite; a synchronous copy would be a second set of
queries to keep in step. The cost is one thread per ``SyncPublisher`` (an idle event loop) and a
thread hop per call (tens of microseconds beside a database round trip).

The driver's client belongs to that loop: give a ``SyncPublisher`` a ``MongoDriver`` over an
``AsyncMongoClient`` that nothing else uses (or a ``MemoryDriver`` whose consumers run on the
same loop). ``loop=`` runs the calls on a loop you own instead — the loop the store lives on,
as the testing kit does (``kit.sync_publisher()``); the blocking calls must then come from other
threads. The background thread is started on the first call, again in a forked child (a
pre-forking server such as gunicorn), and is a daemon: it never keeps a process from exiting.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import OptionChange, Task, TaskInfo, TaskOption
from mscheduler.drivers.base import Driver, is_driver
from mscheduler.runtime.publisher import Publisher

T = TypeVar("T")


class SyncPublisher:
    """``Publisher`` for synchronous code: the same methods, blocking (see the module doc).

    :param target: the store (``MongoDriver`` or ``MemoryDriver``), or a ``Publisher`` to run
        (the testing kit's, whose ``wait`` drives its fake clock).
    :param loop: run the calls on this event loop (the one the store lives on) instead of one of
        its own in a background thread; calls must then come from other threads.
    :param publisher_settings: ``Publisher``'s own (``clock``, ``max_params_bytes``,
        ``tracing``), when ``target`` is a store.

    Usable as a context manager; ``close()`` stops its own loop (idempotent). A call made on
    the very loop it runs on would wait for itself: it is refused with ``InvalidInput``.
    """

    def __init__(
        self,
        target: Driver | Publisher,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        **publisher_settings: Any,
    ) -> None:
        if isinstance(target, Publisher):
            if publisher_settings:
                raise InvalidInput(
                    f"SyncPublisher: {', '.join(sorted(publisher_settings))} belong to the Publisher given"
                )
            self.publisher = target
        elif is_driver(target):
            self.publisher = Publisher(target, **publisher_settings)
        else:
            raise InvalidInput(f"SyncPublisher() takes a driver or a Publisher, got {type(target).__name__}")
        if loop is not None and not isinstance(loop, asyncio.AbstractEventLoop):
            raise InvalidInput(f"loop: an asyncio event loop, got {type(loop).__name__}")
        self._given_loop = loop
        self._loop: asyncio.AbstractEventLoop | None = loop
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> SyncPublisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the publisher's methods, blocking ------------------------------------------------------

    def send(self, task: Task, *, reset_finished: bool = False) -> bool:
        """``Publisher.send``: publish ``task`` unless its key exists; True if created (or reset)."""
        return self._call(lambda: self.publisher.send(task, reset_finished=reset_finished))

    def send_many(self, tasks: Iterable[Task], *, reset_finished: bool = False) -> list[bool]:
        """``Publisher.send_many``: a bool per task, in order."""
        batch = list(tasks)
        return self._call(lambda: self.publisher.send_many(batch, reset_finished=reset_finished))

    def wait(
        self,
        key: str,
        *,
        timeout: float | None = None,
        poll_interval: float = 0.05,
        max_poll_interval: float = 1.0,
    ) -> Any:
        """``Publisher.wait``: the task's result once it ends, or its failure raised
        (``TaskFailed``, ``TaskExpired``, ``TaskCancelled``); ``TimeoutError`` after ``timeout``."""
        return self._call(
            lambda: self.publisher.wait(
                key, timeout=timeout, poll_interval=poll_interval, max_poll_interval=max_poll_interval
            )
        )

    def get(self, key: str) -> TaskInfo:
        """``Publisher.get``: the task as stored; ``UnknownTask``."""
        return self._call(lambda: self.publisher.get(key))

    def update_option(self, key: str, change: OptionChange) -> TaskOption:
        """``Publisher.update_option``: change a task's options while it may be running."""
        return self._call(lambda: self.publisher.update_option(key, change))

    def close(self) -> None:
        """Stop the background loop (a loop given as ``loop=`` is left running). Later calls are
        refused."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._thread = None
        if thread is not None and loop is not None and os.getpid() == self._pid:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                loop.close()

    # -- the loop ---------------------------------------------------------------------------------

    def _call(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        loop = self._running_loop()
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            raise InvalidInput(
                "SyncPublisher called on the event loop it runs its calls on: it would wait for "
                "itself; await its .publisher there, or call it from another thread (asyncio.to_thread)"
            )
        future = asyncio.run_coroutine_threadsafe(make(), loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # interrupted (Ctrl-C in a script): the coroutine is cancelled too
            raise

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise InvalidInput("this SyncPublisher is closed")
            if self._given_loop is not None:
                return self._given_loop
            if self._thread is None or os.getpid() != self._pid:  # first call, or a forked child
                self._pid = os.getpid()
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=_serve, args=(loop,), name="mscheduler-sync-publisher", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            assert self._loop is not None
            return self._loop


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()
