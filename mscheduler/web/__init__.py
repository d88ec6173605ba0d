"""The REST API (``pip install 'mscheduler[web]'``): ``create_app(operations=..., tokens=...)``.

See ``mscheduler.web.app`` for the routes and rules, ``mscheduler.web.auth`` for tokens, and
``mscheduler web`` for the standalone server.
"""

from mscheduler.web.app import API, create_app
from mscheduler.web.auth import ApiTokens, Role, parse_tokens, read_tokens_file

__all__ = ["API", "ApiTokens", "Role", "create_app", "parse_tokens", "read_tokens_file"]
