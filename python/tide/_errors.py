"""tide.Error and its subclasses, one per kind of tide_status."""

from __future__ import annotations

from . import _lib


class Error(Exception):
    """A failure reported by tide: ``status`` is the tide_status code,
    ``status_name`` its name ("invalid argument", ...), ``message`` tide's
    message naming the cause (tide_ctx_last_error)."""

    def __init__(self, message: str, status: int = _lib.E_INVALID):
        super().__init__(message)
        self.message = message
        self.status = status
        self.status_name = _lib.lib.tide_status_str(status).decode()


class InvalidInput(Error, ValueError):
    """Bad input: an invalid argument or option, a malformed file, an id out
    of range, something not found or not supported (TIDE_E_INVALID,
    TIDE_E_FORMAT, TIDE_E_NOT_FOUND, TIDE_E_UNSUPPORTED, TIDE_E_RANGE)."""


class OutOfMemory(Error, MemoryError):
    """An allocation failed (TIDE_E_NOMEM)."""


class IOError(Error, OSError):  # noqa: A001 - tide's own, also an OSError
    """A read, write, open or mmap failed (TIDE_E_IO)."""


class InfeasibleBudget(Error):
    """No plan fits the memory budget (TIDE_E_INFEASIBLE)."""


class DeviceError(Error):
    """The device is absent or a backend call failed (TIDE_E_NO_DEVICE,
    TIDE_E_BACKEND), or a plan failed verification (TIDE_E_VERIFY), or what
    is asked for is busy (TIDE_E_BUSY)."""


_BY_STATUS = {
    _lib.E_INVALID: InvalidInput, _lib.E_FORMAT: InvalidInput, _lib.E_NOT_FOUND: InvalidInput,
    _lib.E_UNSUPPORTED: InvalidInput, _lib.E_RANGE: InvalidInput, _lib.E_NOMEM: OutOfMemory,
    _lib.E_IO: IOError, _lib.E_INFEASIBLE: InfeasibleBudget,
}


def error(status: int, message: str) -> Error:
    """The exception of a tide_status with its message."""
    return _BY_STATUS.get(status, DeviceError)(message, status)


def check(status: int, ctx, what: str | None = None) -> None:
    """Raises the exception of a failed call, message from ctx."""
    if status == _lib.OK:
        return
    msg = _lib.lib.tide_ctx_last_error(ctx).decode(errors="replace") if ctx else ""
    if not msg:
        msg = _lib.lib.tide_status_str(status).decode()
    raise error(status, "%s: %s" % (what, msg) if what else msg)
