"""Errors caused by the user's config or input; the CLI prints them as one line and exits 2."""


class UserError(Exception):
    """A problem the user can fix: the message says what was wrong and what is allowed."""


class ConfigError(UserError):
    pass


class InputError(UserError):
    pass
