"""`--docs` and `--query` read from a pipe as from a file (a shell's `<(…)`), and name what is wrong otherwise."""

import os
import threading

import pytest

from sift_cli.errors import SiftError
from sift_cli.prefill.inputs import read_documents, read_query


def _pipe(text: str) -> str:
    """A path that reads as `text` once, as bash's process substitution gives (/dev/fd/N)."""
    r, w = os.pipe()
    threading.Thread(target=lambda: (os.write(w, text.encode()), os.close(w)), daemon=True).start()
    return f"/dev/fd/{r}"


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="no /dev/fd")
def test_docs_and_query_read_from_pipes():
    assert read_documents(_pipe("doc-a\n# a comment\ndoc-b\n")) == ["doc-a", "doc-b"]
    assert read_query(_pipe("  Who wrote it?\n")) == "Who wrote it?"


def test_missing_empty_and_folder_paths_are_one_line_each(tmp_path):
    with pytest.raises(SiftError, match="docs file not found"):
        read_documents(tmp_path / "nope.txt")
    with pytest.raises(SiftError, match="no document ids"):
        read_documents(os.devnull)
    with pytest.raises(SiftError, match="is a folder"):
        read_query(tmp_path)
    with pytest.raises(SiftError, match="query is empty"):
        read_query(os.devnull)
