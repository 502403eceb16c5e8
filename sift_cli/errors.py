"""One exception type for bad input: the CLI turns it into one error line and a non-zero exit."""


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
