"""Structured logs: one JSON object per line, carrying the request id of the request being served.

The request id comes from the caller's `X-Request-ID` header when it is sane (printable, at most
128 characters), else it is generated; it is echoed in the response and in every log line written
while the request is served (a context variable, so solver threads started with
`contextvars.copy_context()` keep it).
"""

from __future__ import annotations

import json
import logging
import secrets
import sys
from contextvars import ContextVar
from datetime import UTC, datetime

LOGGER_NAME = "hydraplan"
REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_CHARS = 128

_request_id: ContextVar[str | None] = ContextVar("hydraplan_request_id", default=None)
# Attributes every LogRecord has; anything else a caller passes with `extra=` is logged as a field.
_STANDARD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured copy of msg
}


def current_request_id() -> str | None:
    """The id of the request being served in this context, if any."""
    return _request_id.get()


def set_request_id(request_id: str | None) -> object:
    """Bind `request_id` to this context; returns a token for `reset_request_id`."""
    return _request_id.set(request_id)


def reset_request_id(token: object) -> None:
    _request_id.reset(token)  # type: ignore[arg-type]


def request_id_from(header_value: str | None) -> str:
    """The caller's id when it is printable ASCII of sane length, else a fresh random one."""
    if header_value and len(header_value) <= MAX_REQUEST_ID_CHARS and header_value.isprintable():
        if header_value.isascii() and " " not in header_value:
            return header_value
    return secrets.token_hex(8)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line: time, level, logger, message, request id, extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = current_request_id()
        if request_id is not None:
            entry["request_id"] = request_id
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str) -> logging.Logger:
    """Send the `hydraplan` loggers to stderr as JSON lines (once per process)."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    if not any(getattr(handler, "_hydraplan_json", False) for handler in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        handler._hydraplan_json = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
    return logger


def uvicorn_log_config(level: str) -> dict[str, object]:
    """uvicorn's own loggers as JSON lines too (its access log is off: the app writes one)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": level, "propagate": False},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
        },
    }


def access_logger() -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.access")
