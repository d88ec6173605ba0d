"""``/api/v1/limits``: flow limits with their running slots; create, replace, remove."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from mscheduler.web.auth import Role
from mscheduler.web.deps import COMMON_DEPENDENCIES, ERROR_ANSWERS, Ops, Who
from mscheduler.web.models import ErrorOut, LimitIn, LimitOut

limits = APIRouter(
    prefix="/limits", tags=["limits"], dependencies=COMMON_DEPENDENCIES, responses=ERROR_ANSWERS
)


_NO_LIMIT: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "no such limit"}}


@limits.get("", response_model=list[LimitOut], summary="Flow limits, with their running slots")
async def list_limits(operations: Ops, who: Who) -> list[LimitOut]:
    """Every limit; a read token sees the slot holders' attempt tokens blanked."""
    return [LimitOut.of(info, secrets=who.role is Role.ADMIN) for info in await operations.list_limits()]


@limits.get("/{key}", response_model=LimitOut, responses=_NO_LIMIT, summary="A flow limit and its state")
async def get_limit(key: str, operations: Ops, who: Who) -> LimitOut:
    """The limit; a read token sees the slot holders' attempt tokens blanked."""
    return LimitOut.of(await operations.get_limit(key), secrets=who.role is Role.ADMIN)


@limits.put("/{key}", response_model=LimitOut, summary="Create or replace a flow limit")
async def set_limit(key: str, body: LimitIn, operations: Ops) -> LimitOut:
    """``max_running``, ``rate`` or both over ``names`` (default ``[key]``); applies to every
    consumer's next claim (their next limit refresh for new names). 422 for a name another
    limit covers."""
    info = await operations.set_limit(key, names=body.names, max_running=body.max_running, rate=body.rate)
    return LimitOut.of(info)


@limits.delete("/{key}", status_code=204, responses=_NO_LIMIT, summary="Remove a flow limit")
async def remove_limit(key: str, operations: Ops) -> Response:
    """Its names are unlimited from every consumer's next limit refresh."""
    await operations.remove_limit(key)
    return Response(status_code=204)
