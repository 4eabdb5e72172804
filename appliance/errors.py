"""Errors caused by the user's config or input; the CLI prints them as one line and exits 2, the server
answers them with a 4xx whose body names the field."""
from typing import Optional

PROBLEMS_JOIN = " | "  # between the problems of one request, each naming its field (messages hold `;` already)


class UserError(Exception):
    """A problem the user can fix: the message says what was wrong and what is allowed. `param` names the
    field at fault (a request's: the `param` of an OpenAI error body), given by whoever raises it: nothing
    reads it back out of the message."""

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param


class ConfigError(UserError):
    pass


class InputError(UserError):
    """Bad input. `status` is the HTTP status a server answers with."""

    def __init__(self, message: str, param: Optional[str] = None, status: int = 400):
        super().__init__(message, param)
        self.status = status
