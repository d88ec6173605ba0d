"""The REST API (``pip install 'mscheduler[web]'``): ``create_app(operations=..., tokens=...)``.

``app`` assembles it; ``routes/`` holds one router per resource and ``deps`` what they share
(auth, errors, the operations); ``auth`` the tokens; ``guards`` the caps (413, 429) and the
headers; ``bulk`` the bulk actions' jobs; ``dashboard`` the web dashboard's files.
May import: everything below the surfaces (never ``mscheduler.cli``).
"""

from mscheduler.web.app import create_app
from mscheduler.web.auth import ApiTokens, Role, Token, parse_tokens, read_tokens_file
from mscheduler.web.deps import API
from mscheduler.web.guards import ApiLimits

__all__ = ["API", "ApiLimits", "ApiTokens", "Role", "Token", "create_app", "parse_tokens", "read_tokens_file"]
