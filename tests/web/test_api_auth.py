"""Token auth: every route (read from the app, so a new route is covered too) answers 401 with
``WWW-Authenticate: Bearer`` without a known token, 403 to a read token on a change, and serves an
admin token; nothing reaches the store before that. Tokens are compared in constant time against
every configured token and never appear in answers or logs."""

from __future__ import annotations

import logging
import re

import httpx
import pytest

from mscheduler import Operations
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.web import ApiTokens, Role, create_app, parse_tokens
from mscheduler.web import auth as auth_module
from tests.web.support import ADMIN, ADMIN_TOKEN, READ, READ_TOKEN, TOKENS, CountingDriver

PUBLIC = {"/api/v1/health", "/api/v1/openapi.json"}


def _routes() -> list[tuple[str, str]]:
    """Every (method, path) of the API, from its OpenAPI schema (path parameters set to "x")."""
    app = create_app(operations=Operations(CountingDriver()), tokens=TOKENS)
    routes: list[tuple[str, str]] = []
    for path, operations in app.openapi()["paths"].items():
        if path not in PUBLIC:
            routes.extend((method.upper(), re.sub(r"\{[^}]+\}", "x", path)) for method in operations)
    return routes


ROUTES = _routes()
CHANGES = [(m, p) for m, p in ROUTES if m not in ("GET", "HEAD")]
READS = [(m, p) for m, p in ROUTES if m in ("GET", "HEAD")]


def test_the_route_list_covers_the_api() -> None:
    assert (len(READS), len(CHANGES)) == (
        16,
        24,
    )  # + executors; limits; status; send; bulk; plan run; workflows; handlers; waits per key


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": f"Basic {ADMIN_TOKEN}"},
        {"Authorization": "Bearer"},
        {"Authorization": f"Bearer {ADMIN_TOKEN}x"},
    ],
    ids=["none", "unknown", "basic", "empty", "longer"],
)
async def test_no_or_an_unknown_token_is_401_on_every_route(
    client: httpx.AsyncClient, driver: CountingDriver, headers: dict[str, str]
) -> None:
    for method, path in ROUTES:
        response = await client.request(method, path, headers=headers, json={})
        assert response.status_code == 401, (method, path)
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.json()["error"] == "unauthorized"
        assert ADMIN_TOKEN not in response.text
    assert sum(driver.calls.values()) == 0


async def test_a_read_token_may_read_but_not_change(
    client: httpx.AsyncClient, driver: CountingDriver
) -> None:
    for method, path in CHANGES:
        response = await client.request(method, path, headers=READ, json={})
        assert response.status_code == 403, (method, path)
        assert response.json()["error"] == "forbidden"
    assert sum(driver.calls.values()) == 0
    for method, path in READS:
        response = await client.request(method, path, headers=READ)
        assert response.status_code not in (401, 403), (method, path)


async def test_an_admin_token_may_do_everything(client: httpx.AsyncClient) -> None:
    for method, path in ROUTES:
        response = await client.request(method, path, headers=ADMIN, json={})
        assert response.status_code not in (401, 403, 500), (method, path, response.text)


async def test_health_and_schema_are_public(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api/v1/health")).status_code == 200
    schema = await client.get("/api/v1/openapi.json")
    assert schema.status_code == 200
    assert schema.json()["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    # no docs page: FastAPI's loads its assets from a CDN, and these machines are offline
    for path in ("/docs", "/redoc", "/api/v1/docs"):
        assert (await client.get(path, headers=ADMIN)).status_code == 404


def test_every_configured_token_is_compared_without_early_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = ApiTokens(admin=[ADMIN_TOKEN, "second-admin-token-0000"], read=[READ_TOKEN])
    compared: list[tuple[bytes, bytes]] = []
    real = auth_module.hmac.compare_digest  # type: ignore[attr-defined]

    def counting(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", counting)  # type: ignore[attr-defined]
    for presented, role in ((ADMIN_TOKEN, Role.ADMIN), (READ_TOKEN, Role.READ), ("x" * 30, None)):
        compared.clear()
        assert tokens.role_of(presented) is role
        assert len(compared) == 3
        assert {len(a) for a, _ in compared} == {len(b) for _, b in compared} == {32}  # digests


def test_tokens_are_not_shown_by_repr_or_errors() -> None:
    tokens = ApiTokens(admin=[ADMIN_TOKEN], read=[READ_TOKEN])
    assert ADMIN_TOKEN not in repr(tokens) and "admin=1" in repr(tokens)
    with pytest.raises(InvalidInput) as bad:
        parse_tokens(f"admin:{ADMIN_TOKEN},root:{READ_TOKEN}")
    assert "#2" in str(bad.value) and READ_TOKEN not in str(bad.value)
    with pytest.raises(InvalidInput) as short:
        parse_tokens("admin:short")
    assert "short" not in str(short.value).replace("at least", "")
    with pytest.raises(InvalidInput, match="no API token"):
        ApiTokens()
    parsed = parse_tokens(f"# ops tokens\nadmin:{ADMIN_TOKEN}\nread:{READ_TOKEN}\n")
    assert parsed.role_of(READ_TOKEN) is Role.READ and parsed.role_of(ADMIN_TOKEN) is Role.ADMIN


async def test_no_token_is_logged(client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await client.get("/api/v1/tasks", headers={"Authorization": "Bearer wrong-token-0123456789"})
    await client.post("/api/v1/tasks/x/cancel", headers=READ)
    await client.get("/api/v1/tasks/nope", headers=ADMIN)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for token in (ADMIN_TOKEN, READ_TOKEN, "wrong-token-0123456789"):
        assert token not in logged


async def test_an_executor_token_may_use_the_executor_routes_only(driver: CountingDriver) -> None:
    executor_token = "executor-token-0123456789abcdef"
    tokens = parse_tokens(f"admin:{ADMIN_TOKEN},read:{READ_TOKEN},executor:{executor_token}")
    assert tokens.role_of(executor_token) is Role.EXECUTOR and "executor=1" in repr(tokens)
    app = create_app(operations=Operations(driver, clock=driver.clock), tokens=tokens)
    headers = {"Authorization": f"Bearer {executor_token}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        for method, path in ROUTES:
            response = await http.request(method, path, headers=headers, json={})
            if path.startswith("/api/v1/executors/"):
                assert response.status_code == 422, (method, path)  # admitted; the empty body refused
            else:
                assert response.status_code == 403, (method, path)
                assert "executor" in response.json()["detail"]
    assert sum(driver.calls.values()) == 0
