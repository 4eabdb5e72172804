"""The pages' routes over plain HTTP: security headers on every page file, open without the API key
while the API stays closed, `server.ui=false` answers 404 at `/` (the docs page stays), the files are
small and name only relative URLs (the page works under a path prefix), and /openapi.json lists no page.
In a browser, the page of a pipeline without one of its own shows the server's state only where no key
is needed."""
import re
import tomllib

import httpx
import pytest

from appliance.serving.ui.routes import ASSETS, CSP, STATIC, prefix_redirect
from tests.conftest import FRAME_CONF, REPO
from tests.server_process import server_process
from tests.servers import error

PAGES = ["/", "/index.html", "/docs", "/docs.html", *ASSETS]


def test_every_page_file_has_the_security_headers(llava_server):
    for path in PAGES:
        answer = httpx.get(f"{llava_server.base}{path}")
        assert answer.status_code == 200, path
        assert answer.headers["content-security-policy"] == CSP
        assert "frame-ancestors 'none'" in CSP and "script-src 'self';" in CSP and "unsafe" not in CSP
        assert answer.headers["x-content-type-options"] == "nosniff"
        kind = {"js": "text/javascript", "css": "text/css"}.get(path.rsplit(".", 1)[-1], "text/html")
        assert answer.headers["content-type"].startswith(kind), path


def test_openapi_json_lists_only_api_routes(llava_server):
    paths = httpx.get(f"{llava_server.base}/openapi.json").json()["paths"]
    assert "/v1/chat/completions" in paths
    assert not set(paths) & {"/", "/index.html", "/docs.html", *ASSETS}


def test_a_pool_server_with_a_key_serves_its_page_without_the_key_and_keeps_the_api_closed(flood_server):
    page = httpx.get(f"{flood_server.base}/")
    assert page.status_code == 200 and "<title>appliance map</title>" in page.text
    assert all(httpx.get(f"{flood_server.base}{path}").status_code == 200 for path in ASSETS)
    assert httpx.get(f"{flood_server.base}/v1/models").status_code == 401


@pytest.mark.parametrize("path, prefix, served, expected", [
    ("/", b"/appliance", True, "/appliance/index.html"),
    ("/", b"/apps/chat/", True, "/apps/chat/index.html"),  # a prefix given with its slash
    ("/", None, True, None),  # no proxy: the page is served at /
    ("/", b"/", True, None),
    ("/", b"//evil.example", True, None),  # not a plain path: ignored, the answer stays on this origin
    ("/", b"https://evil.example/x", True, None),
    ("/", b"/a b", True, None),
    ("/index.html", b"/appliance", True, None),  # the page's own path: served
    ("/docs", b"/appliance", True, None),
    ("/", b"/appliance", False, None),  # server.ui=false: / stays a 404
])
def test_prefix_redirect(path, prefix, served, expected):
    headers = [(b"x-forwarded-prefix", prefix)] if prefix is not None else []
    assert prefix_redirect({"path": path, "headers": headers}, served) == expected


def test_a_proxy_prefix_sends_the_root_to_the_page_under_it(llava_server):
    answer = httpx.get(f"{llava_server.base}/", headers={"X-Forwarded-Prefix": "/appliance"})
    assert answer.status_code == 307 and answer.headers["location"] == "/appliance/index.html"
    assert httpx.get(f"{llava_server.base}/", headers={"X-Forwarded-Prefix": "//evil.example"}).status_code == 200


def test_server_ui_false_answers_404_at_the_root_and_keeps_the_docs(tmp_path):
    with server_process("server.ui=false", cwd=tmp_path, conf_dir=FRAME_CONF) as server:
        for path in ("/", "/index.html"):
            root = httpx.get(f"{server.base}{path}")
            assert root.status_code == 404 and "no such route" in error(root)["message"]
        assert httpx.get(f"{server.base}/docs").status_code == 200
    with server_process(cwd=tmp_path, conf_dir=FRAME_CONF) as server:  # on by default
        assert "no page of its own yet" in httpx.get(f"{server.base}/").text


def test_the_page_files_are_small_and_name_only_relative_urls():
    files = [path for path in STATIC.iterdir() if path.is_file()]
    assert sum(path.stat().st_size for path in files) <= 150_000
    for path in files:
        text = path.read_text()
        assert not re.search(r"https?://", text), f"{path.name} names another origin"
        assert not re.search(r"""(?:src|href)=["']/|fetch\(["'`]/""", text), f"{path.name} names an absolute path"
        assert "innerHTML" not in text and "eval(" not in text, path.name


def test_the_vendored_libraries_ship_with_their_licenses_in_the_package():
    vendor = STATIC / "vendor"
    readme = (vendor / "README.md").read_text()
    for library in vendor.glob("*.js"):
        row = next((line for line in readme.splitlines() if f"`{library.name}`" in line), None)
        assert row, f"vendor/README.md does not list {library.name}"
        licenses = re.findall(r"`([\w.-]+\.LICENSE)`", row)
        assert licenses and all((vendor / name).is_file() for name in licenses), row
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["appliance"]
    packaged = {path for pattern in patterns for path in (REPO / "appliance").glob(pattern)}
    unshipped = [path.name for path in STATIC.rglob("*") if path.is_file() and path not in packaged]
    assert unshipped == [], "pyproject.toml's package-data leaves them out of the package"


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/../conf"])
def test_only_the_shipped_files_are_served(llava_server, path):
    assert httpx.get(f"{llava_server.base}{path}").status_code == 404


def test_a_pool_server_page_loads_without_the_key_and_shows_nothing_of_the_server(flood_server, open_page):
    page = open_page(f"{flood_server.base}/")
    page.wait_for_selector("#key-dialog[open]")  # the map page's first API call asks for the key
    assert f"HTTP 401: {flood_server.base}/v1/scenes" in page.problems
    assert page.text_content("#status") == ""
    assert not [url for url in page.requested if url.endswith(("/ready", "/metrics"))], page.requested
    assert [p for p in page.problems if "401" not in p] == []


def test_a_plain_server_without_a_key_shows_its_state_on_its_page(tmp_path, open_page):
    with server_process(cwd=tmp_path, conf_dir=FRAME_CONF) as server:
        page = open_page(f"{server.base}/")
        page.wait_for_selector("#status .state.ready")  # /v1/models answered 404: past the key check
        assert [p for p in page.problems if "404" not in p] == []
