"""User-facing errors: each says where the problem is (file, line, field) and what to do."""
from __future__ import annotations


class BertflowError(Exception):
    """An error a user can act on. Raised before expensive work wherever possible."""


class ConfigError(BertflowError):
    """A run configuration value is invalid; the message names the field."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        super().__init__(f"config field '{field}': {reason}")


class DataError(BertflowError):
    """Input data is unusable; the message names the file and, where known, the line."""

    def __init__(self, path: str, reason: str, line: int | None = None, hint: str = ""):
        self.path = path
        self.line = line
        self.reason = reason
        where = f"{path}, line {line}" if line is not None else path
        msg = f"{where}: {reason}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class StorageError(BertflowError):
    """A storage operation failed; the message names the URI."""


class WorkerError(BertflowError):
    """A training/evaluation worker process failed."""


# Exit code of a worker that was told it will be preempted, saved at the agreed step and
# stopped: "resume me" (EX_TEMPFAIL, sysexits.h). Controllers re-provision on it.
PREEMPTED_EXIT_CODE = 75
