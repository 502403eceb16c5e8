"""One exception type for bad input: the CLI turns it into one error line and a non-zero exit; and how any error
is said in one line (the CLI, and the benchmarks' failed rows)."""

import os


class SiftError(Exception):
    """A problem the user can fix (bad path, bad file, mismatched shards...).

    The message is shown as one line, `<what> — <what to do>`: it names the file or document and says what to do.
    `details` (optional) are shown under it, one indented line each: every item when there are several (every
    bad document of a corpus, say), so that one run reports them all.
    """

    exit_code = 2

    def __init__(self, message: str, details: list[str] | tuple[str, ...] = ()):
        super().__init__(message)
        self.details = list(details)


def error_line(exc: BaseException, limit: int | None = None) -> str:
    """The error's first line, after its type unless it is a SiftError (whose message is written for the user),
    cut to `limit` characters."""
    first = (str(exc).splitlines() or [""])[0]
    line = first if isinstance(exc, SiftError) else f"{type(exc).__name__}: {first}"
    return line[:limit] if limit is not None else line


def debug_enabled() -> bool:
    """SIFT_DEBUG set (and not 0): tracebacks instead of one-line errors."""
    return os.environ.get("SIFT_DEBUG", "") not in ("", "0")
