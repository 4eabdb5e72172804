"""One log format for every process of the appliance (docs/serving.md, "Logs").

Each process calls `setup_logging` at its start: the CLI's (and so `serve`'s main process, whose forked
HTTP process inherits it) and the engine process, which LitServe spawns and which inherits nothing.
Every line has the same shape, `TIME LEVEL LOGGER: MESSAGE`, or with `log_format=json` one JSON object
per line (`time`, `level`, `logger`, `message`, plus the record's `fields`: a request line's method,
path, status, ...).

LitServe (at import and in `LitServer.run`) and uvicorn (its default log config) give their loggers
handlers of their own, in their own formats; `adopt_library_loggers` sends their records to ours.
LitServe also logs a line through the root logger in each inference worker ("LitServe will use
ApplianceSpec spec"); `QuietLibraryRoot` holds such records to LitServe's own level.
"""
import datetime
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Dict, Optional

from appliance.errors import ConfigError

if TYPE_CHECKING:
    from appliance.config.schema import LogFormat

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SERVE_LEVEL = "INFO"  # `serve`'s level when log_level is unset: its start-up, ready, request and stats lines
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LIBRARY_LOGGERS = ("litserve", "uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


def setup_logging(level: str, log_format: "LogFormat") -> None:
    """This process's root logger: one handler on stderr, in the chosen format (the composed config's
    `log_format`), at `level`."""
    from appliance.config.schema import LogFormat  # with the config, not with every import of this module

    name = str(level).upper()
    if name not in LEVELS:
        raise ConfigError(f"log_level: {level!r}; allowed: {', '.join(LEVELS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format is LogFormat.json else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(QuietLibraryRoot())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(name)
    logging.captureWarnings(True)  # Python's warnings too, as lines of ours (logger py.warnings)
    adopt_library_loggers()


def adopt_library_loggers() -> None:
    """LitServe's and uvicorn's records go to the root logger's handler, in our format. LitServe's own
    level stays WARNING (its INFO lines repeat ours), as `serve` asks of it in the main process."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in logger.handlers[:]:
            logger.removeHandler(handler)
        logger.propagate = True
    logging.getLogger("litserve").setLevel(logging.WARNING)


class QuietLibraryRoot(logging.Filter):
    """Drops records below WARNING that LitServe's code logs through the root logger rather than its own
    (which stays at WARNING): they repeat what our start-up lines say."""

    LIBRARY_DIR = f"{os.sep}litserve{os.sep}"

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "root" and record.levelno < logging.WARNING and self.LIBRARY_DIR in record.pathname)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log collectors: time (ISO 8601, local with its offset), level,
    logger, message, the record's `fields` as keys of their own, and a traceback as `exception`."""

    def format(self, record: logging.LogRecord) -> str:
        line: Dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        fields: Optional[Dict[str, Any]] = getattr(record, "fields", None)
        if fields:
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)
