"""Counts in words, for what people read (progress lines, messages): `1 tile`, `2 tiles`, `0 tiles`."""


def plural(noun: str) -> str:
    """The plural of the nouns we count (tile, answer, token, request): an added s."""
    return f"{noun}s"


def counted(count: int, noun: str) -> str:
    """`count noun`, the noun singular only for one."""
    return f"{count} {noun if count == 1 else plural(noun)}"
