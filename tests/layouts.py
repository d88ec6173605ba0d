"""The stores the model-based tests and the lockstep test run on, and how long they search.

``LAYOUTS`` is every driver and layout: the memory driver, the Mongo driver on mongomock with one
partition and with four, and on the mongos stand-in (a sharded store of four partitions). The state
machines (``tests/scenarios/test_model_based*.py``) run once per layout, and the lockstep test
(``tests/conformance/test_conformance_lockstep.py``) compares each Mongo layout with a memory
driver of as many partitions. A new layout is one more ``Layout`` appended to ``LAYOUTS``; every
test parametrised over it picks it up.

How many examples each search draws is a profile, chosen by ``MSCHEDULER_TEST_PROFILE``: ``ci``
(the default: the suite's size, minutes for the whole suite) or ``nightly`` (many more, mostly on
the Mongo side, whose runs are the slower and the fewer). Hypothesis draws from a new seed every
run; ``tests/conftest.py`` prints it in the report header, and ``pytest --hypothesis-seed=<seed>``
replays the run.
"""

from __future__ import annotations

import os
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from mscheduler.drivers.base import Driver
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.clock import FakeClock
from mscheduler.testing.mongomock import mongomock_database
from mscheduler.testing.mongos import mongos_database


@dataclass(frozen=True)
class Layout:
    """One kind of store: ``make(clock)`` opens a fresh, empty one (set it up before use)."""

    id: str
    make: Callable[[FakeClock], Driver]
    partitions: int = 1
    mongo: bool = True  # a Mongo driver (slower per step: fewer examples per profile)

    def __str__(self) -> str:
        return self.id


def memory(partitions: int = 1) -> Layout:
    suffix = f"-p{partitions}" if partitions > 1 else ""
    return Layout(
        f"memory{suffix}",
        lambda clock: MemoryDriver(clock=clock, partitions=partitions),
        partitions,
        mongo=False,
    )


def mongomock(partitions: int = 1) -> Layout:
    suffix = f"-p{partitions}" if partitions > 1 else ""
    store = lambda clock: MongoDriver(  # noqa: E731
        mongomock_database(), partitions=partitions, create_indexes=True
    )
    return Layout(f"mongomock{suffix}", store, partitions)


def sharded(partitions: int = 4) -> Layout:
    """The Mongo driver on a sharded store, behind the mongos stand-in (``set_up`` shards it)."""
    store = lambda clock: MongoDriver(  # noqa: E731
        mongos_database(), partitions=partitions, sharded=True, create_indexes=True
    )
    return Layout(f"sharded-p{partitions}", store, partitions)


async def set_up(store: Driver) -> None:
    """Set ``store`` up as ``mscheduler setup`` does (and shard it, on the mongos stand-in)."""
    await store.setup()
    if isinstance(store, MongoDriver) and store.sharded:
        await store.shard()


MEMORY = memory()
LAYOUTS: list[Layout] = [MEMORY, mongomock(), mongomock(4), sharded(4)]
MONGO_LAYOUTS = [layout for layout in LAYOUTS if layout.mongo]

# max_examples per search, by profile: (memory, mongo). A model run here is ~50 steps; the memory
# driver takes a fraction of a second per run, mongomock a few times longer.
PROFILES: Mapping[str, Mapping[str, tuple[int, int]]] = {
    "ci": {"lease": (100, 25), "limit": (100, 20), "reserve": (200, 0), "lockstep": (0, 50)},
    "nightly": {"lease": (2000, 600), "limit": (2000, 400), "reserve": (3000, 0), "lockstep": (0, 1500)},
}
PROFILE = os.environ.get("MSCHEDULER_TEST_PROFILE", "ci")
if PROFILE not in PROFILES:
    raise ValueError(f"MSCHEDULER_TEST_PROFILE must be one of {sorted(PROFILES)}, got {PROFILE!r}")


def examples(search: str, layout: Layout) -> int:
    """How many examples ``search`` draws on ``layout`` in this run's profile."""
    on_memory, on_mongo = PROFILES[PROFILE][search]
    return on_mongo if layout.mongo else on_memory


def layout_params(layouts: list[Layout]) -> list[Any]:
    """``layouts`` as pytest parameters, with their ids."""
    return [pytest.param(layout, id=layout.id) for layout in layouts]


def run_seed() -> str:
    """This run's Hypothesis seed (``tests/conftest.py`` chooses it, or ``--hypothesis-seed``)."""
    return os.environ.get(SEED_VARIABLE, "")


SEED_VARIABLE = "MSCHEDULER_TEST_SEED"


def search(
    search: str,
    layout: Layout,
    machine: Callable[[Counter[str]], RuleBasedStateMachine],
    paths: Sequence[str],
    *,
    steps: int,
    rounds: int = 4,
) -> Counter[str]:
    """Run the state machine ``machine(reached)`` on ``layout`` for the profile's examples of
    ``search``; each example adds the paths it took to ``reached``. See ``until_reached``."""
    reached: Counter[str] = Counter()

    def one_search(seed: int | None) -> None:
        def factory() -> RuleBasedStateMachine:
            return machine(reached)

        if seed is not None:
            factory._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
        run_state_machine_as_test(
            factory,  # type: ignore[arg-type]  # (a factory is documented: a class or a callable)
            settings=settings(
                max_examples=examples(search, layout),
                stateful_step_count=steps,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )

    until_reached(f"{search}/{layout}", one_search, reached, paths, rounds)
    return reached


def until_reached(
    name: str,
    one_search: Callable[[int | None], None],
    reached: Counter[str],
    paths: Sequence[str],
    rounds: int = 4,
) -> None:
    """Call ``one_search(seed)`` (a Hypothesis search that counts the paths its examples took in
    ``reached``) with the run's seed (None), and while one of ``paths`` has not been reached,
    again from a seed derived from the run's (replayable), up to ``rounds`` searches in all;
    then fail, naming the paths never reached: a generator that drifted away from a path leaves
    it unchecked, and this says so."""
    for attempt in range(rounds):
        one_search(zlib.crc32(f"{run_seed()}/{name}/{attempt}".encode()) if attempt else None)
        if all(reached[path] for path in paths):
            return
    missed = [path for path in paths if not reached[path]]
    raise AssertionError(f"{rounds} searches of {name} never reached {missed} (reached: {dict(reached)})")
