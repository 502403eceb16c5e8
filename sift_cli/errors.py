"""One exception type for bad input: the CLI turns it into one error line and a non-zero exit."""


class SiftError(Exception):
    """A problem the user can fix (bad path, bad file, mismatched shards...).

    The message is shown as one line; it should name the file or document and say what to do.
    """

    exit_code = 2

