"""``mscheduler web``: tokens from the environment or a file, refused without them (exit 2), and
the served app is the REST API over the given store (uvicorn's serve replaced by a request)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

from mscheduler import MemoryDriver, Operations
from mscheduler.cli import web as cli_web
from mscheduler.cli.main import full_app
from tests.web.support import ADMIN, ADMIN_TOKEN, READ_TOKEN

app = full_app()

URI = "mongodb://unused.invalid/"


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(cli_web, "operations_override", lambda: Operations(MemoryDriver()))
    # the real one changes the whole test process's garbage collector
    monkeypatch.setattr(cli_web, "quiet_collector", lambda: seen.setdefault("collector", "quieted"))

    async def serve(self: uvicorn.Server, sockets: Any = None) -> None:
        seen["host"], seen["port"] = self.config.host, self.config.port
        transport = httpx.ASGITransport(app=self.config.app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            seen["stats"] = (await client.get("/api/v1/stats", headers=ADMIN)).status_code
            seen["anonymous"] = (await client.get("/api/v1/stats")).status_code
            seen["metrics"] = (await client.get("/metrics")).status_code
            seen["limits"] = self.config.app.state.limits  # type: ignore[union-attr]

    monkeypatch.setattr(uvicorn.Server, "serve", serve)
    return seen


def _run(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner(env={"MSCHEDULER_MONGODB_URI": URI, **env}).invoke(app, ["web", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stderr


def test_tokens_from_the_environment(served: dict[str, Any]) -> None:
    code, err = _run({"MSCHEDULER_API_TOKENS": f"admin:{ADMIN_TOKEN},read:{READ_TOKEN}"}, "--port", "8123")
    assert code == 0, err
    limits = served.pop("limits")
    assert served.pop("collector") == "quieted"
    assert served == {"host": "127.0.0.1", "port": 8123, "stats": 200, "anonymous": 401, "metrics": 401}
    assert (limits.max_body_bytes, limits.streams_per_token) == (4 * 1024 * 1024, 8)  # the defaults


def test_metrics_public(served: dict[str, Any]) -> None:
    code, err = _run({"MSCHEDULER_API_TOKENS": f"admin:{ADMIN_TOKEN}"}, "--metrics-public")
    assert code == 0, err
    assert served["metrics"] == 200 and served["anonymous"] == 401
    assert ADMIN_TOKEN not in err


def test_tokens_from_a_file(served: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# operators\nadmin:{ADMIN_TOKEN}\n", encoding="utf-8")
    code, err = _run({"MSCHEDULER_API_TOKENS_FILE": str(path)}, "--host", "0.0.0.0")
    assert code == 0, err
    assert served["host"] == "0.0.0.0" and served["stats"] == 200


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no API tokens"),
        ({"MSCHEDULER_API_TOKENS": "admin:short"}, "16 to 512 characters"),
        ({"MSCHEDULER_API_TOKENS": f"root:{ADMIN_TOKEN}"}, "item #1"),
        ({"MSCHEDULER_API_TOKENS_FILE": "/nonexistent/tokens"}, "tokens file"),
    ],
)
def test_missing_or_bad_tokens_exit_2(served: dict[str, Any], env: dict[str, str], message: str) -> None:
    code, err = _run(env)
    assert code == 2 and message in err, err
    assert ADMIN_TOKEN not in err and "stats" not in served


def test_the_caps_are_options(served: dict[str, Any]) -> None:
    env = {"MSCHEDULER_API_TOKENS": f"admin:{ADMIN_TOKEN}"}
    caps = ("--max-body-mb", "1", "--streams-per-token", "2", "--waits-per-token", "5", "--waits-total", "10")
    code, err = _run(env, *caps)
    assert code == 0, err
    limits = served["limits"]
    assert (limits.max_body_bytes, limits.streams_per_token, limits.waits_total) == (1024 * 1024, 2, 10)
    code, err = _run(env, "--streams-per-token", "100", "--streams-total", "10")
    assert code == 2 and "per-token cap" in err


def test_the_server_keeps_the_collectors_pauses_short() -> None:
    import gc

    threshold = gc.get_threshold()
    try:
        cli_web.quiet_collector(young=12_345)
        assert gc.get_freeze_count() > 1000  # modules, functions: out of the full passes
        assert gc.get_threshold()[0] == 12_345
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
