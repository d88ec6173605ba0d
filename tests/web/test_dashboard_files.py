"""The dashboard's files as the app serves them (no browser: ``tests/browser`` has those tests):
no token needed for them, a strict CSP, nothing loaded from elsewhere, no HTML built from
strings, every module present and shipped as package data, and ``GET /whoami``."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import httpx

from mscheduler import MemoryDriver, Operations
from mscheduler.web import create_app
from mscheduler.web.dashboard import STATIC_DIR
from tests.web.support import ADMIN, READ, TOKENS

ROOT = Path(__file__).parents[2]
HTML_SINKS = (".innerHTML", ".outerHTML", ".insertAdjacentHTML", "document.write", "eval(", "Function(")
JS_IMPORT = re.compile(r"""^import .* from "(\.{1,2}/[^"]+)";$""", re.MULTILINE)


def _files() -> list[Path]:
    return sorted(p for p in STATIC_DIR.rglob("*") if p.is_file())


async def test_the_pages_need_no_token_and_carry_a_strict_policy(client: httpx.AsyncClient) -> None:
    root = await client.get("/")
    assert root.status_code == 307 and root.headers["location"] == "ui/"
    page = await client.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert (await client.get("/ui/js/main.js")).headers["content-type"].startswith("text/javascript")
    # the data stays behind the token
    assert (await client.get("/api/v1/tasks")).status_code == 401
    missing = await client.get("/ui/nothing-here.js")
    assert missing.status_code == 404


async def test_every_module_imported_is_served(client: httpx.AsyncClient) -> None:
    for path in STATIC_DIR.rglob("*.js"):
        for target in JS_IMPORT.findall(path.read_text()):
            resolved = (path.parent / target).resolve().relative_to(STATIC_DIR)
            response = await client.get(f"/ui/{resolved.as_posix()}")
            assert response.status_code == 200, (path.name, target)
    index = (STATIC_DIR / "index.html").read_text()
    for ref in re.findall(r'(?:src|href)="([^"#]+)"', index):
        assert (await client.get(f"/ui/{ref}")).status_code == 200, ref


def test_nothing_is_loaded_from_elsewhere_and_no_html_is_built_from_strings() -> None:
    for path in _files():
        text = path.read_text()
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"'`)]*", text))
        assert urls <= {"http://www.w3.org/2000/svg"}, (path.name, urls)
        if path.suffix == ".js":
            for sink in HTML_SINKS:
                assert sink not in text, (path.name, sink)


def test_every_static_file_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["mscheduler"]
    package = STATIC_DIR.parents[1]
    for path in _files():
        relative = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatchcase(relative, p) for p in patterns), relative


async def test_whoami_names_the_tokens_role(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api/v1/whoami", headers=ADMIN)).json() == {"role": "admin", "name": "admin-1"}
    assert (await client.get("/api/v1/whoami", headers=READ)).json() == {"role": "read", "name": "read-1"}
    assert (await client.get("/api/v1/whoami")).status_code == 401


async def test_the_dashboard_can_be_left_out() -> None:
    app = create_app(operations=Operations(MemoryDriver()), tokens=TOKENS, dashboard=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        assert (await http.get("/ui/")).status_code == 404
        assert (await http.get("/")).status_code == 404
        assert (await http.get("/api/v1/whoami", headers=READ)).status_code == 200


async def test_mounted_under_a_prefix_the_links_stay_relative() -> None:
    from fastapi import FastAPI

    outer = FastAPI()
    outer.mount("/scheduler", create_app(operations=Operations(MemoryDriver()), tokens=TOKENS))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=outer), base_url="http://test") as http:
        root = await http.get("/scheduler/")
        assert root.status_code == 307 and root.headers["location"] == "ui/"
        assert (await http.get("/scheduler/ui/")).status_code == 200
        assert (await http.get("/scheduler/ui/js/api.js")).status_code == 200
        assert (await http.get("/scheduler/api/v1/whoami", headers=READ)).json()["role"] == "read"
