"""What `appliance run` prints (appliance/display.py): a chat answer's Markdown rendered on a terminal,
printed as written when piped; any other display as it is, terminal or not."""
import io
import re

import pytest

from appliance.display import MarkdownText, show

ANSWER = "# Colours\n\n- **orange** star\n- `#ff8800`\n\n```python\nprint('hi')\n```"


class Terminal(io.StringIO):
    def isatty(self):
        return True


def printed(text, stream, terminal=None):
    show(text, stream, terminal)
    return stream.getvalue()


@pytest.mark.parametrize("stream", [io.StringIO, Terminal])
def test_piped_an_answer_is_printed_as_written(stream):
    assert printed(MarkdownText(ANSWER), stream(), terminal=False) == ANSWER + "\n"


@pytest.mark.parametrize("terminal", [True, None], ids=["told", "found"])  # None: the stream says it is one
def test_on_a_terminal_an_answer_is_rendered(terminal):
    shown = printed(MarkdownText(ANSWER), Terminal(), terminal)
    assert "\x1b[" in shown  # styled
    for source in ("# Colours", "**orange**", "- ", "```"):  # Markdown's marks are gone ...
        assert source not in shown, (source, shown)
    text = re.sub(r"\x1b\[[0-9;]*m", "", shown)
    for words in ("Colours", "• orange star", "• #ff8800", "print('hi')"):  # ... its text is there
        assert words in text, (words, text)


def test_a_display_that_is_not_markdown_is_printed_as_it_is_on_a_terminal():
    line = "wrote **m**.tif: 130x100, 6 tiles"
    assert printed(line, Terminal()) == line + "\n"
