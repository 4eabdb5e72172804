"""What `appliance run` prints on stdout: each result's `display`.

A chat model's answer is Markdown (lists, code blocks, tables), marked as such by its stage
(`MarkdownText`). On a terminal rich renders it; piped or redirected it is printed as the model wrote
it, so scripts and files get the text itself. Every other display (`wrote mask.tif: ...`) is printed as
it is.
"""
import sys
from typing import Optional, TextIO


class MarkdownText(str):
    """A display written in Markdown: a model's answer."""


def show(text: str, stream: Optional[TextIO] = None, terminal: Optional[bool] = None) -> None:
    """Print `text` on `stream` (stdout); Markdown is rendered when `terminal` (default: whether `stream`
    is one)."""
    stream = stream if stream is not None else sys.stdout
    if terminal is None:
        terminal = stream.isatty()
    if terminal and isinstance(text, MarkdownText):
        from rich.console import Console
        from rich.markdown import Markdown

        Console(file=stream, force_terminal=True).print(Markdown(text))
        stream.flush()
        return
    print(text, file=stream, flush=True)
