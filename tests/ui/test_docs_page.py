"""The API docs page (`/docs`: Swagger UI, vendored) in a real browser, against the shared servers
(tests/servers.py): it renders every operation of `/openapi.json` from this server alone, under the pages'
Content-Security-Policy, with no console error; a request body's schema expands to its fields; on the keyed
`flood_server`, behind a path prefix, the key given once in Authorize makes "Try it out" on
`GET /v1/models` answer 200 from the same server, and is still there after a reload."""
import re

import httpx
import pytest

from appliance.serving.http.route_table import ROUTES
from tests.servers import API_KEY
from tests.ui.prefix_proxy import prefix_proxy


# Each violation of the page's Content-Security-Policy, as the page sees it (Chromium also logs it).
WATCH_CSP = ("window.violations = []; document.addEventListener('securitypolicyviolation', "
             "event => window.violations.push(`${event.violatedDirective} ${event.blockedURI}`))")


def operation(page, method, path):
    """The operation's block (Swagger UI's), found by its method and path."""
    return page.locator(f".opblock-{method}:has(.opblock-summary-path[data-path='{path}'])")


def test_the_document_states_which_routes_need_the_key(llava_server, flood_server):
    keyless = httpx.get(f"{llava_server.base}/openapi.json").json()
    keyed = httpx.get(f"{flood_server.base}/openapi.json").json()
    assert keyless["servers"] == keyed["servers"] == [{"url": "."}]
    assert "securitySchemes" not in keyless["components"]
    assert all("security" not in op for item in keyless["paths"].values() for op in item.values())
    scheme = keyed["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, item in keyed["paths"].items():  # what the document says needs the key is what answers 401
        for method, op in item.items():
            answer = httpx.request(method.upper(), flood_server.base + re.sub(r"{\w+}", "x", path))
            assert (answer.status_code == 401) == ("security" in op), (method, path, answer.status_code)
    assert keyed["paths"]["/v1/models"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in keyed["paths"]["/health"]["get"]


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_every_operation_renders_and_a_request_schema_expands(llava_server, open_page, path):
    page = open_page(f"{llava_server.base}{path}", init_script=WATCH_CSP)
    page.wait_for_selector(".opblock")
    document = httpx.get(f"{llava_server.base}/openapi.json").json()
    rendered = page.eval_on_selector_all(".opblock", """blocks => blocks.map(block => [
        block.className.match(/opblock-(get|post|delete)\\b/)[1],
        block.querySelector(".opblock-summary-path").dataset.path])""")
    documented = [[method, path] for path, item in document["paths"].items() for method in item]
    assert sorted(rendered) == sorted(documented)

    chat = operation(page, "post", "/v1/chat/completions")
    chat_route = next(route for route in ROUTES if route.path == "/v1/chat/completions")
    assert chat.locator(".opblock-summary-description").text_content() == chat_route.help
    chat.locator(".opblock-summary").click()
    chat.locator(".opblock-section-request-body button.tablinks[data-name='model']").click()  # "Schema"
    body = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    fields = chat.locator("article[data-json-schema-level='1'] > .json-schema-2020-12-head .json-schema-2020-12__title")
    assert sorted(fields.all_text_contents()) == sorted(body["schema"]["properties"])
    messages = chat.locator(".json-schema-2020-12-head", has=page.locator(
        ".json-schema-2020-12__title", has_text=re.compile("^messages$")))
    messages.locator(".json-schema-2020-12-expand-deep-button").click()  # "Expand all": the Message schema
    message = messages.locator("xpath=..").locator(".json-schema-2020-12-body .json-schema-2020-12__title")
    for name in ("role", "content", "tool_calls"):  # drawn level by level after the click: wait for each
        message.filter(has_text=re.compile(f"^{name}$")).first.wait_for()
    assert not [url for url in page.requested if not url.startswith(llava_server.base)], page.requested
    assert page.evaluate("window.violations") == [] and page.problems == []


def test_the_key_given_once_in_authorize_runs_try_it_out_behind_a_prefix(flood_server, open_page):
    with prefix_proxy(flood_server.base, "/apps/flood") as base:
        page = open_page(f"{base}/docs", init_script=WATCH_CSP)
        page.click(".auth-wrapper .authorize")
        page.fill(".auth-container input", API_KEY)
        page.click(".auth-container .auth-btn-wrapper .authorize")
        page.click(".auth-container .btn-done")

        models = operation(page, "get", "/v1/models")
        models.locator(".opblock-summary").click()
        models.locator(".try-out__btn").click()
        with page.expect_request("**/v1/models") as sent:
            models.locator(".execute").click()
        assert sent.value.url == f"{base}/v1/models"
        assert sent.value.headers["authorization"] == f"Bearer {API_KEY}"
        status = models.locator(".live-responses-table tr.response .response-col_status").first
        assert status.text_content().strip() == "200"
        assert '"flood"' in models.locator(".live-responses-table tr.response .microlight").first.text_content()

        page.reload()  # the key is kept: Execute again without Authorize
        page.wait_for_selector(".auth-wrapper .authorize.locked")
        models.locator(".opblock-summary").click()
        models.locator(".try-out__btn").click()
        with page.expect_response("**/v1/models") as answered:
            models.locator(".execute").click()
        assert answered.value.status == 200
        assert page.evaluate("window.violations") == []
    assert all(url.startswith(f"{base}/") for url in page.requested), page.requested
    assert page.problems == []
