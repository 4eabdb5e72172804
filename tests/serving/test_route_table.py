"""The route table is the one list of routes: each kind has one main route, every schema it names exists,
`serve --help` lists every route from it without importing torch, and a path's methods and openness are
read from it as a request finds them."""
import re
import subprocess
import sys

import pytest

from appliance.cli import SERVE_HELP
from appliance.field_rules import check_fields
from appliance.config.schema import ServerConfig
from appliance.errors import ConfigError
from appliance.serving.http.route_table import EVERY, HELP_COLUMN, ROUTES, Ref, resolved, routes_help, served
from appliance.serving.http.served_routes import ServedRoutes
from tests.conftest import REPO


def test_each_kind_serves_one_main_route_and_the_page_only_with_ui():
    for kind in EVERY:
        assert len([route for route in served(kind, ui=True) if route.main]) == 1, kind
        assert "/" in {route.path for route in served(kind, ui=True)}
        assert not {"/", "/index.html"} & {route.path for route in served(kind, ui=False)}
        assert "/docs" in {route.path for route in served(kind, ui=False)}


def test_every_schema_the_table_names_exists():
    def refs(value):
        if isinstance(value, Ref):
            yield value
        elif isinstance(value, dict):
            for item in value.values():
                yield from refs(item)
        elif isinstance(value, tuple):
            for item in value:
                yield from refs(item)

    named = [ref for route in ROUTES for schemas in (route.body, route.answers, route.params) for ref in refs(schemas)]
    assert len(named) > 20
    for route in ROUTES:
        assert not list(refs(resolved(route).body)) and not list(refs(resolved(route).params)), route.path


def help_entries(text):
    """The help's lines, a long path's continuation (its help, in the column) joined to it."""
    entries = []
    for line in text.splitlines():
        if line.startswith(" " * HELP_COLUMN) and entries:
            entries[-1] += " " + line.strip()
        else:
            entries.append(line)
    return entries


def test_serve_help_lists_every_route_without_importing_torch():
    routes_lines = routes_help().splitlines()
    assert max(map(len, routes_lines)) <= 100, max(routes_lines, key=len)  # a long path moves its help down
    for route in ROUTES:
        line = next((line for line in help_entries(SERVE_HELP) if f" {route.openapi_path} " in line
                     and line.split()[0] == route.methods[0]), None)
        assert line is not None and route.help in line, route.path
        assert line.endswith("(open)") == (not route.auth), route.path
    imported = subprocess.run([sys.executable, "-c", "import sys, appliance.cli; print(sorted(m for m in "
                               "('torch', 'pydantic', 'fastapi') if m in sys.modules))"],
                              cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert imported.strip() == "[]"


POOL = ServedRoutes(served("pool", ui=True))


@pytest.mark.parametrize("path, methods, open_", [
    ("/v1/scenes", ["GET", "POST"], False),  # two routes, one path: both methods
    ("/v1/scenes/scene-1", ["DELETE", "GET"], False),
    ("/v1/scenes/scene-1/mask.png", ["GET"], False),
    ("/v1/models/a/b", ["GET"], False),  # {model_id:path} takes slashes
    ("/health", ["GET"], True),
    ("/", ["GET", "HEAD"], True),
    ("/ui/map.js", ["GET", "HEAD"], True),
    ("/ui/vendor/marked.js", ["GET", "HEAD"], True),  # {file:path}: the vendored libraries below ui/
    ("/v1/chat/completions", [], False),  # another kind's route
    ("/nothing", [], False),
])
def test_a_paths_methods_and_openness(path, methods, open_):
    assert POOL.methods(path) == methods
    assert POOL.is_open(path) == open_


@pytest.mark.parametrize("origins, refused", [
    ([], None), (["https://app.example.com"], None), (["http://localhost:5173", "*"], None),
    (["https://app.example.com/"], "https://app.example.com/"), (["app.example.com"], "app.example.com"),
    (["https://a.example", "ftp://b.example"], "ftp://b.example"),
])
def test_cors_origins_are_origins(origins, refused):
    settings = ServerConfig(cors_origins=origins)
    if refused is None:
        check_fields(settings, ServerConfig, "server.")
    else:
        with pytest.raises(ConfigError, match=f"^server.cors_origins: '{re.escape(refused)}'; allowed: an origin"):
            check_fields(settings, ServerConfig, "server.")
