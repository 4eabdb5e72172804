"""The chat page of a generate pipeline (`GET /` of `pipeline=llava_chat`) in a real browser, against the
shared tiny-LLaVA server (tests/servers.py): it loads clean, a chat with the sample image shows streamed
the answer the API gives for the same body, errors show the server's own message, and model output, file
names and server messages stay text (an answer renders as Markdown: test_chat_markdown.py). Screenshots
at desktop and phone width go to the test's tmp dir."""
import json
import re

import httpx

from tests.servers import SAMPLE_IMAGE
from tests.ui.conftest import PHONE
from tests.ui.prefix_proxy import prefix_proxy

MARKUP = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def other_problems(page, status):
    """The page's problems but the answers of `status` the test provoked (and the console lines on them)."""
    return [p for p in page.problems if f"HTTP {status}" not in p and f"status of {status}" not in p]


def open_settings(page, **values):
    page.click("#toggle-settings")
    for name, value in values.items():
        page.fill(f"#{name}", str(value))


def send(page, text, *files):
    if files:
        page.set_input_files("#picker", list(files))
        page.wait_for_selector("#thumbnails .thumbnail")
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def last_answer(page):
    """The last answer's text and figures, once it has ended (its figures line is written then)."""
    answer = page.locator(".message.assistant").last
    answer.locator(".stats:not(:empty), .error:not([hidden])").first.wait_for(timeout=120_000)
    return answer


def test_the_page_loads_with_no_error_and_shows_model_and_status(llava_server, open_page):
    page = open_page(f"{llava_server.base}/")
    page.wait_for_selector("#status .state.ready")
    rate = page.locator("#status >> text=tokens/s")
    rate.wait_for(timeout=10_000)  # from two readings of /metrics
    assert re.fullmatch(r"server \d+\.\d tokens/s", rate.text_content())  # labelled: the server's, all requests
    assert "all requests" in rate.get_attribute("title")
    assert page.text_content("#model") == httpx.get(f"{llava_server.base}/v1/models").json()["data"][0]["id"]
    unlabelled = page.evaluate("""[...document.querySelectorAll('input, textarea, button')]
        .filter(c => !(c.labels?.length || c.getAttribute('aria-label') || c.textContent.trim())).map(c => c.id)""")
    assert unlabelled == []
    assert page.problems == []


def test_a_chat_with_the_sample_image_streams_the_answer_the_api_gives(llava_server, open_page, screenshot):
    page = open_page(f"{llava_server.base}/")
    open_settings(page, temperature=0, max_tokens=32)
    with page.expect_response("**/v1/chat/completions") as answered:
        send(page, "What color is the shape?", SAMPLE_IMAGE)
    response = answered.value
    answer = last_answer(page)
    body = json.loads(response.request.post_data)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert response.headers["content-type"].startswith("text/event-stream")
    parts = body["messages"][0]["content"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[1]["text"] == "What color is the shape?"

    api = httpx.post(f"{llava_server.base}/v1/chat/completions", timeout=120,
                     json={**body, "stream": False, "stream_options": None}).json()
    shown = answer.locator(".text").inner_text()  # the answer as rendered (Markdown), as people read it
    assert shown == api["choices"][0]["message"]["content"] and shown.strip()
    usage = api["usage"]
    stats = answer.locator(".stats").text_content()
    figures = re.search(rf"answer {usage['completion_tokens']} tokens in (\d+\.\d\d) s, (\d+\.\d) tokens/s", stats)
    assert figures, stats  # the message's one speed figure: the answer's tokens over its time
    # the time is shown to 0.01 s, the rate from the unrounded time: it lies within the rounding interval's rates
    tokens, seconds, rate = usage["completion_tokens"], float(figures[1]), float(figures[2])
    assert tokens / (seconds + 0.005) - 0.05 <= rate <= tokens / max(seconds - 0.005, 1e-9) + 0.05, stats
    assert stats.count("/s") == 1 and f"prompt {usage['prompt_tokens']} tokens" in stats, stats
    assert f"finish: {api['choices'][0]['finish_reason']}" in stats and "first token" in stats, stats
    assert page.locator(".message.user figcaption").text_content() == SAMPLE_IMAGE.name
    assert page.problems == []

    screenshot(page, "page-chat-desktop.png")
    page.set_viewport_size(PHONE)
    page.click("[data-closes=settings]")  # at phone width the panels cover the conversation
    page.click("[data-closes=conversations]")
    screenshot(page, "page-chat-phone.png")


def test_an_attached_image_stays_whole_and_a_phone_placeholder_names_no_keys(llava_server, open_page):
    page = open_page(f"{llava_server.base}/")
    assert "Shift+Enter" in page.get_attribute("#prompt", "placeholder")
    page.set_input_files("#picker", [SAMPLE_IMAGE])
    picture = page.locator("#thumbnails .thumbnail img").bounding_box()
    remove = page.locator("#thumbnails .remove").bounding_box()
    assert remove["y"] >= picture["y"] + picture["height"], (picture, remove)  # under the picture, not on it
    page.click("#thumbnails .remove")
    assert page.locator("#thumbnails .thumbnail").count() == 0
    page.set_viewport_size(PHONE)  # turned to a phone's width: the placeholder follows
    phone = open_page(f"{llava_server.base}/", viewport=PHONE)  # opened on one
    for shown in (page, phone):
        placeholder = shown.get_attribute("#prompt", "placeholder")
        assert placeholder.startswith("Ask something") and not re.search(r"Enter|Esc", placeholder), placeholder
        assert shown.problems == []


def test_regenerate_edit_and_new_conversation(llava_server, open_page):
    page = open_page(f"{llava_server.base}/")
    open_settings(page, temperature=0, max_tokens=8)
    send(page, "Say something.")
    first = last_answer(page).locator(".text").text_content()
    page.click(".message.assistant .actions >> text=Regenerate")
    page.wait_for_selector(".message.assistant .stats:not(:empty)")
    assert page.locator(".message.assistant").count() == 1
    assert last_answer(page).locator(".text").text_content() == first  # temperature 0: the same answer

    page.click(".message.user .actions >> text=Edit")
    assert page.input_value("#prompt") == "Say something." and page.is_visible("#edit-banner")
    send(page, "Say something else.")
    last_answer(page)
    assert page.locator(".message.user .text").all_text_contents() == ["Say something else."]

    page.click("#new-chat")
    assert page.locator(".message").count() == 0
    assert page.locator("#conversation-list li").count() == 2  # the first is kept (localStorage)
    page.reload()
    page.click("#conversation-list .open >> text=Say something.")  # titled by its first question
    assert page.locator(".message.user .text").all_text_contents() == ["Say something else."]
    assert page.locator(".message.assistant").count() == 1
    assert page.problems == []


def test_an_answer_of_one_token_says_token(llava_server, open_page):
    page = open_page(f"{llava_server.base}/")
    chunks = [{"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]},
              {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}]
    stream = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"content-type": "text/event-stream"}, body=stream))
    send(page, "Hello")
    stats = last_answer(page).locator(".stats").text_content()
    assert re.search(r"answer 1 token in \d+\.\d\d s, \d+\.\d tokens/s · prompt 1 token · finish: stop$", stats), stats
    assert page.problems == []


def test_a_server_error_shows_the_server_own_message(llava_server, open_page):
    page = open_page(f"{llava_server.base}/")
    open_settings(page, temperature=-1)
    send(page, "Hello")
    error = last_answer(page).locator(".error")
    direct = httpx.post(f"{llava_server.base}/v1/chat/completions", timeout=60,
                        json={"messages": [{"role": "user", "content": "Hello"}], "temperature": -1})
    assert direct.status_code == 400
    assert error.text_content() == f"400: {direct.json()['error']['message']}"
    assert other_problems(page, 400) == []


def test_markup_in_answers_file_names_and_server_messages_shows_as_text(llava_server, open_page, tmp_path):
    page = open_page(f"{llava_server.base}/")
    chunks = [{"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
              for piece in (MARKUP[:20], MARKUP[20:])]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    stream = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"content-type": "text/event-stream"}, body=stream))
    send(page, MARKUP, {"name": f"{MARKUP}.png", "mimeType": "image/png", "buffer": SAMPLE_IMAGE.read_bytes()})
    answer = last_answer(page)
    assert answer.locator(".text").inner_text() == MARKUP
    assert page.locator(".message.user .text").text_content() == MARKUP
    assert page.locator(".message.user figcaption").text_content() == f"{MARKUP}.png"

    page.unroute("**/v1/chat/completions")
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=400, content_type="application/json",
        body=json.dumps({"error": {"message": MARKUP, "type": "BadRequestError", "param": None, "code": 400}})))
    send(page, "again")
    assert last_answer(page).locator(".error").text_content() == f"400: {MARKUP}"

    assert page.evaluate("window.__pwned") is None
    assert page.locator("#messages script, #messages img[src=x]").count() == 0
    assert other_problems(page, 400) == []


def test_the_page_works_under_a_path_prefix(llava_server, open_page):
    with prefix_proxy(llava_server.base, "/apps/chat") as base:
        page = open_page(base)  # no trailing slash: the server sends the browser to the page's own path
        assert page.url == f"{base}/index.html"
        requests = []
        page.on("request", lambda request: requests.append(request.url))
        page.wait_for_selector("#status .state.ready")
        open_settings(page, temperature=0, max_tokens=8)
        send(page, "What color is the shape?", SAMPLE_IMAGE)
        answer = last_answer(page)
        assert answer.locator(".error").is_hidden() and answer.locator(".text").text_content()
        page.click("text=API docs")
        page.wait_for_selector(".opblock")  # Swagger UI's operations (test_docs_page.py)
        assert page.url == f"{base}/docs"
    assert requests and all(url.startswith(f"{base}/") for url in requests), requests
    assert page.problems == []


def test_a_json_schema_setting_asks_for_structured_output(llava_server, open_page):
    page = open_page(f"{llava_server.base}/")
    open_settings(page, temperature=0, max_tokens=48, json_schema="{not json")
    send(page, "Describe the shape.")
    assert page.text_content("#notice").startswith("JSON schema (settings): not valid JSON")
    assert page.locator(".message").count() == 0 and page.input_value("#prompt") == "Describe the shape."

    schema = {"type": "object", "properties": {"color": {"enum": ["red", "orange", "blue"]}}, "required": ["color"]}
    page.fill("#json_schema", json.dumps(schema))
    with page.expect_request("**/v1/chat/completions") as sent:
        page.press("#prompt", "Enter")
    body = json.loads(sent.value.post_data)
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    shown = last_answer(page).locator(".text").inner_text()
    api = httpx.post(f"{llava_server.base}/v1/chat/completions", timeout=120,
                     json={**body, "stream": False, "stream_options": None}).json()
    assert shown == api["choices"][0]["message"]["content"]  # held to the schema (tests/serving cover how)
    assert shown.lstrip().startswith("{")

    page.fill("#json_schema", "{not json")  # Regenerate checks the settings as sending does
    page.click(".message.assistant .actions >> text=Regenerate")
    assert page.text_content("#notice").startswith("JSON schema (settings): not valid JSON")
    assert last_answer(page).locator(".text").inner_text() == shown
    assert page.problems == []
