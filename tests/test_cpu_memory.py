"""keep_freed_memory sets glibc's allocator once and says whether it could."""

import platform
import sys

from sift_cli import cpu_memory


def test_keep_freed_memory_is_set_once():
    first = cpu_memory.keep_freed_memory()
    assert cpu_memory.keep_freed_memory() is first  # cached: mallopt is called once per process
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert first is True
