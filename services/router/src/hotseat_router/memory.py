"""Memory settings of a router process: freed request bodies given back to the operating
system at once, and the startup heap kept out of the garbage collector's way.

glibc's allocator serves a block of at least its mmap threshold (128 KiB to start with)
by mapping fresh pages, which it unmaps when the block is freed. But each such free
raises the threshold to the freed size (up to 32 MiB), so after one large body the next
ones come from the heap, whose freed space the process keeps: under many large bodies
at once the router's resident memory then grew far past what it held at any moment
(docs/reliability.md, "Hostile load"). Setting the threshold once turns that adjustment
off. Elsewhere (another C library) nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

from hotseat_common.logging import get_logger

log = get_logger(__name__)

M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number (malloc.h)."""
MMAP_THRESHOLD = 128 * 1024
"""glibc's own initial threshold: blocks from here up are mapped, and unmapped when freed."""


def return_large_blocks_to_the_os() -> bool:
    """Fix glibc's mmap threshold (see the module docstring); False where it is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1)
    log.debug("malloc_mmap_threshold", bytes=MMAP_THRESHOLD, set=done)
    return done


def freeze_startup_heap() -> int:
    """Move every object alive now (the imported modules, the app, its config: hundreds of
    thousands) into the collector's permanent generation, once startup is done.

    A full collection otherwise walks all of them; under load the router ran one every
    few seconds, each holding the event loop for tens to hundreds of milliseconds: the
    p99 stall measured in docs/benchmarks.md. Objects made later are collected as before.
    Returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
