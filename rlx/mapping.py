"""Weight files mapped into memory, through 2 MiB pages where the kernel can.

`map_file(path)` maps a file read-only (np.memmap uint8); the weights are views of it, never
copied. Decode reads every weight once per token, and through 4 KiB pages that read is slower:
each page is a TLB entry to walk and the hardware prefetchers stop at page ends. Measured on an
Intel Xeon (AVX-512, Linux 6.18, ext4), Qwen3-0.6B Q4_K_M, one sequence, KV f16: a decode step
49.0 -> 35.3 ms at 1 thread, 27.6 -> 21.4 ms at 2 threads when the same file is mapped through
2 MiB pages; Q4_K matvecs of the layers' shapes from DRAM, 1 thread: 0.67 -> 0.88 of the read
probe (cache-resident they run at 1.6x the probe: the kernels were waiting on memory, not
computing).

Linux maps a file through 2 MiB pages only where its page cache holds 2 MiB folios, and it makes
those when the pages are read in through a mapping advised MADV_HUGEPAGE (transparent huge pages
"madvise" or "always", a file system with large folios: ext4 on recent kernels, XFS). So:
- every mapping is advised MADV_HUGEPAGE (and MADV_RANDOM: `_advise`): a file read from disk
  through it comes in as 2 MiB folios (and any later mapping of it, by rlx or by another program,
  gets 2 MiB pages);
- a file of 64 MiB and more is sampled first (`_SAMPLES` 2 MiB-aligned places, each faulted
  through a fresh advised mapping, `_BATCH` at a time and let go after, so that the sample adds
  little to the peak RSS): if some place comes as a 2 MiB page (so this file system and
  kernel can: a place read from disk by the fault, or one cached so) while a place that was
  already cached comes as 4 KiB pages (read earlier without the advice: a download, a copy,
  another program), the file's clean, unmapped cached pages are dropped (posix_fadvise DONTNEED)
  so that they come back as 2 MiB folios. That costs one read of the file from disk, once. Where
  no place comes as a 2 MiB page nothing is dropped: a file system without large folios would
  otherwise be re-read at every load. So a file wholly cached in 4 KiB folios stays so (rlx cannot
  tell it from a file system that cannot do better); `mapped_pages` shows it. Pages other
  processes map stay as they are.
`mapped_pages(path)` tells how this process maps a file: resident bytes and those through 2 MiB
pages (the benchmarks record it for every engine). Elsewhere than Linux: plain mappings, None.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import random
import sys

import numpy as np

_PMD = 2 << 20        # one 2 MiB page
_SAMPLE_MIN = 64 << 20  # files smaller than this are mapped without sampling
_SAMPLES = 64
_BATCH = 8            # sampled places resident at once
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


def map_file(path: str) -> np.memmap:
    """The file mapped read-only (uint8), advised MADV_HUGEPAGE (module docstring), remembering
    the file as it was (`rlx_source`: path and os.stat) so that a model reading views of it can
    tell when it is modified in place."""
    if _linux_thp() and os.path.getsize(path) >= _SAMPLE_MIN:
        _refresh_small_pages(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    _advise(data._mmap)
    data.rlx_source = (os.path.abspath(path), os.stat(path))
    return data


def mapped_pages(path: str, pid: int | str = "self") -> tuple[int, int] | None:
    """(resident bytes, bytes mapped through 2 MiB pages) over process pid's mappings of the file
    at path (/proc/<pid>/smaps); None where there is no such file to read (not Linux)."""
    real = os.path.realpath(path)
    maps = _smaps(pid)
    if maps is None:
        return None
    ours = [f for start, name, f in maps if name == real]
    return sum(f.get("Rss", 0) for f in ours), sum(f.get("FilePmdMapped", 0) for f in ours)


def _smaps(pid: int | str) -> list[tuple[int, str, dict[str, int]]] | None:
    """Process pid's mappings from /proc/<pid>/smaps: (start address, path or "", {field: bytes
    for the fields counted in kB}); None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    maps = []
    for line in lines:
        head, _, rest = line.partition(" ")
        if "-" in head and not head.endswith(":"):  # a mapping's first line: range perms offset dev inode path
            parts = line.split(None, 5)
            maps.append((int(head.split("-")[0], 16), parts[5] if len(parts) == 6 else "", {}))
        elif maps and rest.endswith(" kB"):
            maps[-1][2][head.rstrip(":")] = int(rest.split()[0]) << 10
    return maps


def _linux_thp() -> bool:
    """Whether this is Linux with transparent huge pages not switched off."""
    if not sys.platform.startswith("linux") or _MADV_HUGEPAGE is None:
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def _advise(m: mmap.mmap) -> None:
    """MADV_HUGEPAGE, and MADV_RANDOM: without it a fault's readahead runs on asynchronously, and
    where it met folios already cached it went on in smaller ones (measured: after a sample, a
    file read in order through an advised mapping came in with 105 of 627 runs of 2 MiB as 4 KiB
    folios, in runs between the sampled places); with it every fault reads one 2 MiB folio."""
    if _MADV_HUGEPAGE is None:  # not Linux: a plain mapping, with the system's readahead
        return
    for advice in (_MADV_HUGEPAGE, mmap.MADV_RANDOM):
        try:
            m.madvise(advice)
        except OSError:  # a kernel without THP: a plain mapping
            pass


def _refresh_small_pages(path: str) -> None:
    """Samples the file's page cache (module docstring) and drops it where it holds 4 KiB folios
    that 2 MiB ones could replace."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
            _advise(m)
            anchor = np.frombuffer(m, dtype=np.uint8)
            base = anchor.ctypes.data
            del anchor  # the mapping must not be exported when it closes
            first = -(-base // _PMD) * _PMD - base  # the first offset at a 2 MiB boundary of the address
            runs = (size - first) // _PMD
            # golden-ratio steps through the 2 MiB runs from a random start: a fixed sample never sees
            # what lies between its own places, and those were where a file was left in 4 KiB folios
            # (the readahead of _advise's docstring, around the places sampled before a drop)
            phase = random.random()
            places = sorted({first + int((phase + i * 0.6180339887498949) % 1.0 * runs) * _PMD
                             for i in range(_SAMPLES)}
                            if runs > 0 else ())
            vec = (ctypes.c_ubyte * 1)()
            warm, cold = [], []
            for o in places:
                if libc.mincore(ctypes.c_void_p(base + o), ctypes.c_size_t(4096), vec) == 0:
                    (warm if vec[0] & 1 else cold).append(o)
            warm_huge = _faulted_huge(m, base, warm)  # the cached places first, then the cold ones
            cold_huge = _faulted_huge(m, base, cold)  # 2 MiB folios read from disk, where the kernel can
        if (cold_huge > 0 or warm_huge > 0) and warm_huge < len(warm):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _faulted_huge(m: mmap.mmap, base: int, places: list[int]) -> int:
    """Faults the 2 MiB at each offset of places in m (mapped at base) and counts those that came
    as 2 MiB pages. _BATCH places at a time, each batch let go (MADV_DONTNEED: this mapping's
    pages, not the page cache) before the next, so the sample holds at most _BATCH * 2 MiB of
    the file resident at once (all _SAMPLES places, 128 MiB, raised every load's peak RSS)."""
    huge = 0
    for i in range(0, len(places), _BATCH):
        batch = places[i:i + _BATCH]
        for o in batch:
            _ = m[o]
        huge += _vma_pmd(base) // _PMD
        for o in batch:
            m.madvise(mmap.MADV_DONTNEED, o, _PMD)
    return huge


def _vma_pmd(base: int) -> int:
    """FilePmdMapped bytes of this process's mapping that starts at base (0 if unreadable)."""
    return next((f.get("FilePmdMapped", 0) for start, _, f in _smaps("self") or () if start == base), 0)
