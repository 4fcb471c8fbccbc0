"""The router gives freed large blocks back to the operating system (glibc's mmap
threshold fixed: docs/reliability.md, "Hostile load")."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import ctypes, sys
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "fixed":
    from hotseat_router.memory import return_large_blocks_to_the_os
    assert return_large_blocks_to_the_os()
big = bytes(30 << 20)  # freed at once: glibc raises its threshold past 1 MiB
del big
before = libc.mallinfo2().hblks
block = bytearray(1 << 20)
print(libc.mallinfo2().hblks - before)
"""


def _mapped_blocks_for_one_mib(mode: str) -> int:
    """Blocks glibc maps for a 1 MiB allocation made after a 30 MiB one was freed."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_large_block_is_mapped_even_after_a_larger_one_was_freed() -> None:
    """With the threshold fixed, a 1 MiB block after a freed 30 MiB one is still mapped
    (unmapped when freed); glibc's own adjustment would serve it from the heap, which
    the process keeps."""
    assert _mapped_blocks_for_one_mib("default") == 0
    assert _mapped_blocks_for_one_mib("fixed") == 1
