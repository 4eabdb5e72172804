"""Errors caused by the user's config or input; the CLI prints them as one line and exits 2, the server
answers them with a 4xx whose body names the field."""
from typing import Optional


class UserError(Exception):
    """A problem the user can fix: the message says what was wrong and what is allowed."""


class ConfigError(UserError):
    pass


class InputError(UserError):
    """Bad input. `param` names the request field at fault (the `param` of an OpenAI error body) and
    `status` is the HTTP status a server answers with."""

    def __init__(self, message: str, param: Optional[str] = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.status = status
