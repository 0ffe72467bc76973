"""rlx.mapping: weight files mapped advised MADV_HUGEPAGE, a page cache of 4 KiB folios replaced
by 2 MiB ones where the kernel shows it can, and mapped_pages read from /proc (Linux)."""
import os
import sys

import numpy as np
import pytest

from rlx import mapping

linux_thp = pytest.mark.skipif(not mapping._linux_thp(), reason="Linux with transparent huge pages only")
MIB = 1 << 20


def write_file(path, nbytes: int) -> None:
    """nbytes of a pattern, written, synced and dropped from the page cache (cold)."""
    with open(path, "wb") as f:
        block = (np.arange(MIB, dtype=np.uint32) * 2654435761).astype(np.uint8).tobytes()
        for _ in range(nbytes // MIB):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def cache_small(path, start: int, stop: int) -> None:
    """Reads [start, stop) one 4 KiB page at a time without readahead: 4 KiB folios in the cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for o in range(start, stop, 4096):
            os.pread(fd, 1, o)
    finally:
        os.close(fd)


def vm_flags(addr: int) -> list[str]:
    """The VmFlags of this process's mapping that holds addr."""
    lines = open("/proc/self/smaps").read().splitlines()
    inside = False
    for line in lines:
        head = line.split(" ", 1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_map_file_is_read_only_and_remembers_the_file(tmp_path):
    p = tmp_path / "w.bin"
    p.write_bytes(bytes(range(256)) * 64)
    data = mapping.map_file(str(p))
    assert data.dtype == np.uint8 and data.shape == (16384,) and not data.flags.writeable
    assert data[255] == 255 and data.rlx_source[0] == str(p) and data.rlx_source[1].st_size == 16384


@linux_thp
def test_map_file_advises_huge_pages(tmp_path):
    p = tmp_path / "w.bin"
    write_file(p, 4 * MIB)
    data = mapping.map_file(str(p))
    assert "hg" in vm_flags(data.ctypes.data)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_mapped_pages_counts_this_files_resident_bytes(tmp_path):
    p = tmp_path / "w.bin"
    write_file(p, 3 * MIB)
    assert mapping.mapped_pages(str(p)) == (0, 0)  # not mapped
    data = mapping.map_file(str(p))
    int(data[:MIB:4096].sum())  # the first MiB faulted in
    rss, huge = mapping.mapped_pages(str(p))
    assert MIB <= rss <= 3 * MIB and 0 <= huge <= rss
    other = tmp_path / "other.bin"
    write_file(other, MIB)
    assert mapping.mapped_pages(str(other)) == (0, 0)
    assert mapping.mapped_pages(str(p), pid=2**31 - 1) is None  # no such process
    del data


def mapped_whole(path) -> tuple[int, int]:
    """mapped_pages of the file mapped by map_file and read in whole (one byte per page)."""
    data = mapping.map_file(str(path))
    int(data[::4096].sum())
    pages = mapping.mapped_pages(str(path))
    del data
    return pages


def huge_pages_here(tmp_path) -> bool:
    """Whether a cold file read through an advised mapping comes in as 2 MiB pages here."""
    p = tmp_path / "probe.bin"
    write_file(p, 8 * MIB)
    return mapped_whole(p)[1] > 0


@linux_thp
def test_a_cold_file_comes_in_through_2mib_pages(tmp_path):
    if not huge_pages_here(tmp_path):
        pytest.skip("this kernel / file system gives no 2 MiB file pages")
    p = tmp_path / "w.bin"
    write_file(p, 80 * MIB)
    rss, huge = mapped_whole(p)
    assert rss == 80 * MIB and huge >= 76 * MIB  # all but the runs not 2 MiB-aligned in the address


@linux_thp
def test_small_folios_of_a_partly_cached_file_are_replaced(tmp_path):
    """Half the file cached one 4 KiB page at a time, the other half cold: map_file's sample finds a
    cold place coming in as a 2 MiB page and cached places in 4 KiB pages, drops the cache, and the
    whole file then maps through 2 MiB pages. Wholly cached in 4 KiB folios, nothing shows that the
    kernel could do better: it is left so."""
    if not huge_pages_here(tmp_path):
        pytest.skip("this kernel / file system gives no 2 MiB file pages")
    p = tmp_path / "w.bin"
    write_file(p, 80 * MIB)
    cache_small(p, 0, 40 * MIB)
    rss, huge = mapped_whole(p)
    assert rss == 80 * MIB and huge >= 76 * MIB

    q = tmp_path / "small.bin"
    write_file(q, 80 * MIB)
    cache_small(q, 0, 80 * MIB)
    rss, huge = mapped_whole(q)
    assert rss == 80 * MIB and huge == 0


@linux_thp
def test_the_sample_holds_few_places_resident_at_once(tmp_path, monkeypatch):
    """map_file's sample of a large file faults its places a batch at a time and lets each batch go:
    the file's resident bytes in this process never pass mapping._BATCH places of 2 MiB (all 64
    places, 128 MiB, were resident at once before, raising the peak RSS of every load)."""
    p = tmp_path / "w.bin"
    write_file(p, 80 * MIB)
    cache_small(p, 0, 40 * MIB)  # warm places and cold ones: both kinds are sampled
    seen = []
    vma_pmd = mapping._vma_pmd

    def counting(base):
        seen.append(mapping.mapped_pages(str(p))[0])
        return vma_pmd(base)

    monkeypatch.setattr(mapping, "_vma_pmd", counting)
    data = mapping.map_file(str(p))
    assert len(seen) >= 2 and max(seen) <= mapping._BATCH * 2 * MIB, seen
    assert mapping.mapped_pages(str(p))[0] == 0  # nothing of the sample stays mapped
    data[::4096].sum()  # touch every page through the returned mapping
    assert mapping.mapped_pages(str(p))[0] == 80 * MIB
