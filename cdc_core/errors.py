"""Every error the product raises: one root, retry semantics in the type, exit codes here."""

from __future__ import annotations

import re
from collections.abc import Iterator

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_TRANSIENT = 75  # EX_TEMPFAIL: safe to retry


class CdcError(Exception):
    """Root of the product's errors; `exit_code` is what the command line exits with."""

    exit_code = EXIT_FAILURE


class ConfigError(CdcError):
    """Bad configuration or usage: names the file, the key path, the bad value and the fix."""

    exit_code = EXIT_USAGE

    def __init__(self, file: str, key: str | None, message: str) -> None:
        self.file = file
        self.key = key
        self.message = message
        where = f"{file}: {key}: " if key else f"{file}: "
        super().__init__(where + message)


class UsageError(CdcError):
    """The command line was used wrongly; the message says the right usage."""

    exit_code = EXIT_USAGE


class TransientError(CdcError):
    """A failure that may pass by itself (lost connection, server restart): safe to retry.
    `sqlstate`: the source's, when the failure is one of its errors; `server`: then its first
    line as the server (or the driver) gave it, for a message that says the rest itself."""

    exit_code = EXIT_TRANSIENT

    def __init__(
        self, message: str, *, sqlstate: str | None = None, server: str | None = None
    ) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.server = server


class TerminalError(CdcError):
    """A failure that retrying will not fix; the message says what to do."""


class DriverDiedError(TerminalError):
    """The Spark driver's JVM died (most often out of heap); the message says the remedy."""

    SAID = "the Spark driver (its JVM) died"  # how every such message begins


class LoginError(TerminalError):
    """The server refused the connection for good (no such database or role, a wrong password,
    pg_hba.conf): retrying changes nothing until someone fixes the connection string or the
    server's set-up."""

    def __init__(self, failure: str, fix: str) -> None:
        self.failure = failure  # what the server said, and where (no password)
        self.fix = fix
        super().__init__(f"{failure}; retrying will not help: {fix}")


class SetupError(TerminalError):
    """The environment is missing something the product needs (a binary, a jar, a server)."""


class DecodeError(TerminalError):
    """Bytes from the server that do not follow the protocol; names the byte and the LSN."""


def causes(error: BaseException, limit: int | None = None) -> Iterator[BaseException]:
    """`error` and what caused it, or was being handled when it came, each once; at most
    `limit` of them."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) != limit:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def text_of(error: BaseException) -> str | None:
    """`str(error)` without Java stack frames, or None when it cannot be had (a Py4J error asks
    the JVM for its text, and the JVM may be gone)."""
    try:
        return without_java_frames(str(error))
    except Exception:
        return None


_JAVA_FRAME = re.compile(r"^\s+(at \S|\.\.\. \d+ more)|^Driver stacktrace:\s*$")


def without_java_frames(text: str) -> str:
    """`text` without the frames of the Java stack traces in it (`\tat ...`, `... 12 more`).
    What is left names each exception with its message and each `Caused by:`, which a failed
    Spark job otherwise buries under a few hundred frames, its task's trace inside its own.
    `--debug` prints the traceback with every frame."""
    return "\n".join(line for line in text.splitlines() if not _JAVA_FRAME.match(line))


def first_line(error: BaseException | str) -> str:
    """An error's first line (a server's message has DETAIL, HINT and CONTEXT lines after it);
    when it has no text, the error's type's name, or "no message" for a text."""
    text = str(error).strip()
    if text:
        return text.splitlines()[0]
    return "no message" if isinstance(error, str) else type(error).__name__
