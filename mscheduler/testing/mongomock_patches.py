"""Where mongomock (4.3) departs from MongoDB in what ``MongoDriver`` sends, mongomock is patched to
follow the server: the driver is written for MongoDB alone and runs unchanged on the stand-in.

Each patch below implements one documented server rule (its docstring says which), and
``tests/unit/test_mongomock_patches.py`` checks each against the manual's own examples:

expressions (update pipelines and aggregations alike)
    ``$add`` of a date and milliseconds; ``$slice`` with computed position and length;
    ``$reduce``; ``$indexOfArray``; ``$not`` of ``[expression]``; the expressions inside an
    array literal; ``$sum`` / ``$max`` / ``$min`` of one expression that is an array.
commands
    ``hint`` on updates, deletes, ``findAndModify``, finds, counts and aggregations: accepted,
    and refused (code 2) when it names no index; a partial unique index is checked against the
    documents its filter holds, and creating an index that exists with the same spec does
    nothing (mongomock checked every document, every time); stages sent as ``RawBSONDocument``
    (PyMongo copies them into the command as they are); ``collMod`` of a TTL index's period;
    commands mongomock does not know answered as a server answers an unknown command (59);
    ``watch`` answered as a server without a replica set (40573); ``with_options`` of an async
    collection stays async; ``UpdateOne(sort=...)`` (PyMongo 4.11+) accepted when empty.

Importing this module patches nothing: ``apply()`` does, once per process (mongomock's classes
change for every mongomock database of the process). It needs ``mongomock-motor``.
"""

from __future__ import annotations

import datetime
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import bson
import mongomock.aggregate
import mongomock.collection
import mongomock.database
import mongomock.filtering
import mongomock.helpers
import mongomock_motor
from bson.raw_bson import RawBSONDocument
from pymongo.errors import DuplicateKeyError, OperationFailure, WriteError

# mongomock's modules and classes, patched below (typed as Any: mongomock's hints are partial)
aggregate: Any = mongomock.aggregate
database: Any = mongomock.database
filtering: Any = mongomock.filtering
helpers: Any = mongomock.helpers
BulkOperationBuilder: Any = mongomock.collection.BulkOperationBuilder
Collection: Any = mongomock.collection.Collection
Cursor: Any = mongomock.collection.Cursor
AsyncMongoMockCollection: Any = mongomock_motor.AsyncMongoMockCollection

BAD_VALUE = 2
INDEX_NOT_FOUND = 27
COMMAND_NOT_FOUND = 59
NO_REPLICA_SET = 40573  # "The $changeStream stage is only supported on replica sets"
HINT_REFUSED = "hint provided does not correspond to an existing index"

_applied = False


def apply() -> None:
    """Patch mongomock and mongomock-motor (idempotent)."""
    global _applied
    if _applied:
        return
    _applied = True
    _patch_expressions()
    _patch_commands()
    _patch_async_collection()
    _patch_bulk_sort()


# -- expressions ------------------------------------------------------------------------------------

_MISSING = object()


def _value(parser: Any, expression: Any) -> Any:
    """An expression's value; a missing field is null (as inside an array literal)."""
    try:
        return parser.parse(expression)
    except KeyError:
        return None


def _child(parser: Any, variables: dict[str, Any]) -> Any:
    """A parser of the same document with more variables (``$$value``, ``$$this``, ...)."""
    return aggregate._Parser(
        parser._doc_dict,
        dict(parser._user_vars, **variables),
        ignore_missing_keys=parser._ignore_missing_keys,
    )


def add_dates(parser: Any, values: list[Any]) -> Any:
    """``$add``: numbers add up; with one date among them, the numbers are milliseconds added to
    it and the result is a date. Null if an argument is null or missing; two dates: error 16612."""
    parsed = [_value(parser, v) for v in values]
    if any(v is None for v in parsed):
        return None
    dates = [v for v in parsed if isinstance(v, datetime.datetime)]
    if not dates:
        return _MISSING  # numbers only: mongomock's own $add
    if len(dates) > 1:
        raise OperationFailure("only one date allowed in an $add expression", code=16612)
    millis = 0.0
    for v in parsed:
        if isinstance(v, datetime.datetime):
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise OperationFailure(f"$add only supports numeric or date types, not {type(v).__name__}", 16554)
        millis += v
    # a BSON date holds whole milliseconds: the sum is rounded to one
    total = dates[0] + datetime.timedelta(milliseconds=round(millis))
    return total.replace(microsecond=total.microsecond // 1000 * 1000)


def slice_array(parser: Any, value: list[Any]) -> Any:
    """``$slice: [array, n]`` / ``[array, position, n]`` where ``n`` and ``position`` are any
    expressions evaluating to integers (mongomock takes literals only). A null array: null."""
    if not isinstance(value, list) or not 2 <= len(value) <= 3:
        return _MISSING
    array = _value(parser, value[0])
    if array is None:
        return None
    numbers = []
    for argument in value[1:]:
        number = _value(parser, argument)
        if isinstance(number, bool) or not isinstance(number, (int, float)) or number != int(number):
            raise OperationFailure(f"$slice takes integral numbers, got {number!r}", code=28724)
        numbers.append(int(number))
    if not isinstance(array, list):
        raise OperationFailure(f"First argument to $slice must be an array, not {type(array)}", 28724)
    if len(numbers) == 1:
        (n,) = numbers
        return array[:n] if n >= 0 else array[max(len(array) + n, 0) :]
    position, n = numbers
    if n <= 0:
        raise OperationFailure(f"Third argument to $slice must be positive: {n}", code=28729)
    start = position if position >= 0 else max(len(array) + position, 0)
    return array[start : start + n]


def reduce_array(parser: Any, value: Any) -> Any:
    """``$reduce: {input, initialValue, in}``: ``in`` is evaluated for each element of ``input``
    in order with ``$$this`` the element and ``$$value`` the result so far (first
    ``initialValue``). A null or missing ``input``: null; not an array: error 40080."""
    if not isinstance(value, dict) or set(value) != {"input", "initialValue", "in"}:
        raise OperationFailure("$reduce requires exactly 'input', 'initialValue' and 'in'", code=40076)
    array = _value(parser, value["input"])
    if array is None:
        return None
    if not isinstance(array, list):
        raise OperationFailure(f"$reduce requires that 'input' be an array, found: {array!r}", 40080)
    result = parser.parse(value["initialValue"])
    for item in array:
        result = _child(parser, {"value": result, "this": item}).parse(value["in"])
    return result


def index_of_array(parser: Any, value: list[Any]) -> Any:
    """``$indexOfArray: [array, search, start?, end?]``: the first index of an element equal to
    ``search`` within ``[start, end)``, else -1; a null or missing array: null."""
    if not isinstance(value, list) or not 2 <= len(value) <= 4:
        raise OperationFailure("Expression $indexOfArray takes 2 to 4 arguments", code=16020)
    array = _value(parser, value[0])
    if array is None:
        return None
    if not isinstance(array, list):
        raise OperationFailure(f"$indexOfArray requires an array as a first argument, not {array!r}", 40090)
    search = _value(parser, value[1])
    start = _value(parser, value[2]) if len(value) > 2 else 0
    end = _value(parser, value[3]) if len(value) > 3 else len(array)
    for i in range(int(start), min(int(end), len(array))):
        if filtering.bson_compare(lambda a, b: a == b, array[i], search):
            return i
    return -1


def _patch_expressions() -> None:
    parser = aggregate._Parser
    arithmetic = parser._handle_arithmetic_operator
    arrays = parser._handle_array_operator
    booleans = parser._handle_boolean_operator
    project = parser._handle_project_operator
    basic = parser._parse_basic_expression
    # mongomock raises NotImplementedError for these before reaching its handlers
    aggregate.array_operators.append("$reduce")

    def handle_arithmetic(self: Any, operator: str, values: Any) -> Any:
        if operator == "$add" and isinstance(values, list):
            result = add_dates(self, values)
            if result is not _MISSING:
                return result
        return arithmetic(self, operator, values)

    def handle_array(self: Any, operator: str, value: Any) -> Any:
        if operator == "$reduce":
            return reduce_array(self, value)
        if operator == "$indexOfArray":
            return index_of_array(self, value)
        if operator == "$slice":
            result = slice_array(self, value)
            if result is not _MISSING:
                return result
        return arrays(self, operator, value)

    def handle_boolean(self: Any, operator: str, values: Any) -> Any:
        # {$not: [expression]} is the documented form: the negation of the one expression
        if operator == "$not" and isinstance(values, list) and len(values) == 1:
            values = values[0]
        return booleans(self, operator, values)

    def handle_project(self: Any, operator: str, values: Any) -> Any:
        # $sum / $max / $min of one expression: an array is taken element by element
        if operator in ("$sum", "$max", "$min") and isinstance(values, dict):
            return project(self, operator, _spread(_value(self, values)))
        return project(self, operator, values)

    def parse_basic(self: Any, expression: Any) -> Any:
        # an array literal's elements are expressions; a missing field among them is null
        if isinstance(expression, list):
            return [_value(self, e) for e in expression]
        return basic(self, expression)

    parser._handle_arithmetic_operator = handle_arithmetic
    parser._handle_array_operator = handle_array
    parser._handle_boolean_operator = handle_boolean
    parser._handle_project_operator = handle_project
    parser._parse_basic_expression = parse_basic


def _spread(single: Any) -> list[Any]:
    """The operands of ``$sum`` / ``$max`` / ``$min`` given one value: an array's elements, each
    as a literal (so that mongomock does not read them as expressions again)."""
    items = single if isinstance(single, list) else [single]
    return [{"$literal": item} for item in items]


# -- commands ---------------------------------------------------------------------------------------


def _index_keys(keys: Any) -> list[tuple[str, Any]]:
    if isinstance(keys, str):
        return [(keys, 1)]
    if isinstance(keys, Mapping):
        return list(keys.items())
    return [tuple(k) for k in keys]


def check_hint(target: Any, hint: Any, *, write: bool = False) -> None:
    """A ``hint`` must name an index of the collection, by name or by key pattern (error 2,
    BadValue, "hint provided does not correspond to an existing index"); on a collection that
    does not exist yet any hint is taken (there is nothing to plan)."""
    if hint is None or not target._store.is_created:
        return
    indexes = list(target._list_all_indexes())
    if isinstance(hint, str):
        if any(name == hint for name, _ in indexes):
            return
    elif any(_index_keys(info["key"]) == _index_keys(hint) for _, info in indexes):
        return
    message = f"error processing query: ns={target.full_name}: planner returned error :: caused by :: "
    error = WriteError if write else OperationFailure
    raise error(message + HINT_REFUSED, code=BAD_VALUE)


def decoded(document: Any) -> Any:
    """An update (a document or a pipeline) with every ``RawBSONDocument`` decoded to a dict."""
    if isinstance(document, RawBSONDocument):
        return bson.decode(document.raw)
    if isinstance(document, list):
        return [decoded(stage) for stage in document]
    return document


def _patch_commands() -> None:
    update = Collection._update
    delete = Collection._delete
    find_and_modify = Collection._find_and_modify
    cursor_hint = Cursor.hint
    aggregate_ = Collection.aggregate
    count = Collection.count_documents
    create_index = Collection.create_index

    @functools.wraps(update)
    def _update(self: Any, spec: Any, document: Any, *args: Any, hint: Any = None, **kwargs: Any) -> Any:
        check_hint(self, hint, write=True)
        return update(self, spec, decoded(document), *args, **kwargs)

    @functools.wraps(delete)
    def _delete(self: Any, filter: Any, *args: Any, hint: Any = None, **kwargs: Any) -> Any:
        check_hint(self, hint, write=True)
        return delete(self, filter, *args, **kwargs)

    @functools.wraps(find_and_modify)
    def _find_and_modify(
        self: Any, query: Any, projection: Any = None, update: Any = None, *args: Any, **kw: Any
    ) -> Any:
        check_hint(self, kw.pop("hint", None))
        return find_and_modify(self, query, projection, decoded(update), *args, **kw)

    def hint(self: Any, index: Any) -> Any:
        check_hint(self.collection, index)
        return cursor_hint(self, index)

    def aggregate_with_hint(self: Any, pipeline: Any, session: Any = None, **kwargs: Any) -> Any:
        check_hint(self, kwargs.get("hint"))
        return aggregate_(self, pipeline, session, **kwargs)

    def count_documents(self: Any, filter: Any, **kwargs: Any) -> Any:
        check_hint(self, kwargs.get("hint"))
        return count(self, filter, **kwargs)

    Collection._update = _update
    Collection._delete = _delete
    Collection._find_and_modify = _find_and_modify
    Cursor.hint = hint
    Collection.aggregate = aggregate_with_hint
    Collection.count_documents = count_documents
    Collection.create_index = same_index_again(create_index)
    database.Database.command = _command


def same_index_again(create_index: Callable[..., Any]) -> Callable[..., Any]:
    """``create_index``: an index that exists under that name with the same keys and options is
    left as it is (its name returned: a server does not check the documents again); a unique
    index with a ``partialFilterExpression`` holds (and is checked against) only the documents
    its filter matches."""

    def create(self: Any, keys: Any, *args: Any, **options: Any) -> Any:
        key_list = helpers.create_index_list(keys)
        existing = self._store.indexes.get(options.get("name"))
        if existing is not None and _index_keys(existing["key"]) == _index_keys(key_list):
            compared = ("unique", "sparse", "expireAfterSeconds", "partialFilterExpression")
            if all(existing.get(o) == (options.get(o) or None) for o in compared):
                return options["name"]
        partial = options.get("partialFilterExpression")
        if not options.get("unique") or partial is None:
            return create_index(self, keys, *args, **options)
        seen: list[list[Any]] = []
        for doc in self._iter_documents(partial):
            values = [filtering.resolve_key(k, doc) for k, _ in key_list]
            if values in seen:
                raise DuplicateKeyError(f"E11000 duplicate key error collection: {self.full_name}", 11000)
            seen.append(values)
        name = create_index(self, keys, *args, **{**options, "unique": False})
        self._store.indexes[name]["unique"] = True
        return name

    return create


# Commands a mongos stand-in answers (mscheduler.testing.mongos registers them): name -> handler
ADMIN_COMMANDS: dict[str, Callable[[Any, dict[str, Any]], dict[str, Any]]] = {}


def _command(self: Any, command: Any, **unused: Any) -> dict[str, Any]:
    """``Database.command``: ``ping``, ``buildInfo``, ``collMod`` of an index's
    ``expireAfterSeconds``, the commands a stand-in registered (``ADMIN_COMMANDS``); anything
    else is answered as a server answers a command it does not have (59, CommandNotFound)."""
    if isinstance(command, str):
        command = {command: 1}
    name = next(iter(command))
    if name == "ping":
        return {"ok": 1.0}
    if name.lower() == "buildinfo":
        from mongomock import SERVER_VERSION

        return {"ok": 1.0, "version": SERVER_VERSION, "versionArray": _version_array(SERVER_VERSION)}
    if name == "collMod":
        return _coll_mod(self, command)
    handler = ADMIN_COMMANDS.get(name)
    if handler is not None:
        return handler(self, command)
    raise OperationFailure(f"no such command: '{name}'", code=COMMAND_NOT_FOUND)


def _version_array(version: str) -> list[int]:
    return [int(part) for part in version.split(".")[:3]] + [0]


def _coll_mod(db: Any, command: dict[str, Any]) -> dict[str, Any]:
    """``collMod`` with ``index: {name, expireAfterSeconds}``: a TTL index's new period."""
    target = db.get_collection(command["collMod"])
    index = command.get("index") or {}
    found = target._store.indexes.get(index.get("name"))
    if found is None or "expireAfterSeconds" not in index:
        missing = f"cannot find index {index.get('name')} for ns {target.full_name}"
        raise OperationFailure(missing, INDEX_NOT_FOUND)
    old = found.get("expireAfterSeconds")
    found["expireAfterSeconds"] = index["expireAfterSeconds"]
    return {"expireAfterSeconds_old": old, "expireAfterSeconds_new": index["expireAfterSeconds"], "ok": 1.0}


def _patch_async_collection() -> None:
    """mongomock-motor's collection: ``with_options`` returns an async collection (it returned
    mongomock's plain one; the stand-in has one node, so the options change nothing but the
    object), and ``watch`` is refused as a server without a replica set refuses it."""

    def with_options(self: Any, **options: Any) -> Any:
        inner = self._AsyncMongoMockCollection__collection
        return AsyncMongoMockCollection(self.database, inner.with_options(**options))

    def watch(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise OperationFailure("The $changeStream stage is only supported on replica sets", NO_REPLICA_SET)

    AsyncMongoMockCollection.with_options = with_options
    AsyncMongoMockCollection.watch = watch


def _patch_bulk_sort() -> None:
    """``UpdateOne(sort=...)`` (PyMongo 4.11) passes ``sort`` to mongomock's bulk builder, which
    predates it: an empty one is accepted."""
    original: Any = BulkOperationBuilder.add_update
    if "sort" in inspect.signature(original).parameters:
        return

    def add_update(self: Any, *args: Any, sort: Any = None, **kwargs: Any) -> Any:
        if sort:
            raise NotImplementedError("mongomock cannot sort inside bulk updates")
        return original(self, *args, **kwargs)

    BulkOperationBuilder.add_update = add_update
