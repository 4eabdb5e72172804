"""An answer on the chat page renders as Markdown (lists, tables, code blocks with a copy button) and HTML
from the model never reaches the page: `<script>`, `onerror`, `javascript:` links and images stay text
or go. The answers are streamed by a route stub in the browser (the tiny LLaVA does not write Markdown);
the page is the shared tiny-LLaVA server's (tests/servers.py)."""
import json

from tests.ui.test_chat_page import last_answer, send

CODE = 'def hello():\n    print("<b>hi</b>")\n'
ANSWER = f"""Here is **the plan**:

- first item
- second item

| Shape | Color |
|-------|------:|
| star  | orange |

```python
{CODE}```
"""
HOSTILE = ('<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>\n\n'
           'inline <img src=y onerror="window.__pwned=3"> and <svg onload="window.__pwned=4"></svg>\n\n'
           '[click](javascript:window.__pwned=5) ![photo](z.png)')


def stream_answer(page, text, pieces=3):
    """Answer the page's next chat requests with `text` streamed in `pieces` SSE chunks."""
    size = -(-len(text) // pieces)
    chunks = [{"choices": [{"index": 0, "delta": {"content": text[i:i + size]}, "finish_reason": None}]}
              for i in range(0, len(text), size)]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"content-type": "text/event-stream"}, body=body))


def assert_harmless(page):
    assert page.locator("#messages script, #messages img, #messages svg, #messages [onerror]").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_a_markdown_answer_renders_as_lists_tables_and_code_with_a_copy_button(llava_server, open_page):
    page = open_page(f"{llava_server.base}/")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    stream_answer(page, ANSWER)
    send(page, "Plan?")
    text = last_answer(page).locator(".text")
    assert text.locator("strong").text_content() == "the plan"
    assert text.locator("ul > li").all_text_contents() == ["first item", "second item"]
    assert text.locator("table th").all_text_contents() == ["Shape", "Color"]
    assert text.locator("table td").all_text_contents() == ["star", "orange"]
    code = text.locator(".code-block pre code")
    assert code.text_content() == CODE and code.get_attribute("class") == "language-python"
    assert text.locator("b").count() == 0, "markup inside code is text"
    text.locator(".code-block button.copy").click()
    text.locator(".code-block button.copy:has-text('Copied')").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == CODE.rstrip("\n")
    assert page.problems == []


def test_without_the_clipboard_api_the_copy_button_copies_the_selection(llava_server, open_page):
    # Plain http on a LAN address is no secure context: browsers give such pages no navigator.clipboard.
    page = open_page(f"{llava_server.base}/", init_script="""
        Object.defineProperty(Navigator.prototype, "clipboard", {get: () => undefined});
        document.addEventListener("copy", () => { window.__copied = getSelection().toString(); });""")
    stream_answer(page, ANSWER)
    send(page, "Plan?")
    last_answer(page).locator(".code-block button.copy").click()
    assert page.evaluate("window.__copied") == CODE.rstrip("\n")
    assert page.problems == []


def test_html_from_the_model_never_reaches_the_page(llava_server, open_page):
    page = open_page(f"{llava_server.base}/")
    stream_answer(page, HOSTILE, pieces=7)  # tags split across chunks, as a model streams them
    send(page, "Hello")
    text = last_answer(page).locator(".text")
    shown = text.inner_text()
    assert '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>' in shown
    assert 'inline <img src=y onerror="window.__pwned=3"> and <svg onload="window.__pwned=4"></svg>' in shown
    assert "photo" in shown  # an image the model names shows as its alt text, never loaded
    hrefs = text.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href') ?? '')")
    assert not [href for href in hrefs if href.startswith("javascript:")], hrefs
    text.locator("text=click").click()
    assert_harmless(page)
    again = page.context.new_page()  # the conversation shown again from the browser's storage
    again.goto(f"{llava_server.base}/")
    again.click("#conversation-list .open >> text=Hello")
    last_answer(again)
    assert_harmless(again)
    assert not [url for url in page.requested if url.endswith(("/x", "/y", "/z.png"))], page.requested
    assert page.problems == []
