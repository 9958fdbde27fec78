"""Swap files: round trip, and every kind of damage detected, never read silently."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from offload_agent.device import ALIGN, CpuDevice
from offload_agent.nvme import NvmeStore, SwapFileError, SwapPathError


def _buf(nbytes: int) -> torch.Tensor:
    return CpuDevice().alloc_host(nbytes)


@pytest.fixture
def store(tmp_path: Path) -> NvmeStore:
    s = NvmeStore(tmp_path / "swap")
    s.prepare()
    return s


def test_round_trip_is_aligned_and_checked(store: NvmeStore) -> None:
    src = _buf(3 * ALIGN)
    src[:10000].copy_(torch.arange(10000) % 251)
    store.write("layer.0.weight", src, 10000)
    assert os.path.getsize(store.path("layer.0.weight")) == ALIGN + 3 * ALIGN
    dst = _buf(3 * ALIGN)
    store.read("layer.0.weight", dst, 10000)
    assert torch.equal(dst[:10000], src[:10000])
    assert store.direct is _direct_io_works(store.root)  # settled by prepare()


def _direct_io_works(root: Path) -> bool:
    """A second probe of O_DIRECT on this file system (tmpfs refuses it, ext4 takes it)."""
    import mmap

    try:
        fd = os.open(root / "probe2", os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    try:
        return os.pwrite(fd, mmap.mmap(-1, ALIGN), 0) == ALIGN
    except OSError:
        return False
    finally:
        os.close(fd)
        (root / "probe2").unlink()


def test_constructor_touches_no_file(tmp_path: Path) -> None:
    NvmeStore(tmp_path / "never")
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("kind", ["sum64", "crc32"])
@pytest.mark.parametrize("where", [0, 7, 500, 996, 999])
def test_corrupted_byte_is_detected(tmp_path: Path, kind: str, where: int) -> None:
    store = NvmeStore(tmp_path / "swap", check=kind)
    store.prepare()
    src = _buf(ALIGN)
    src.fill_(7)
    store.write("t", src, 1000)
    with open(store.path("t"), "r+b") as f:
        f.seek(ALIGN + where)
        f.write(b"\x00")
    with pytest.raises(SwapFileError, match="checksum"):
        store.read("t", _buf(ALIGN), 1000)


def test_swapped_words_are_detected(store: NvmeStore) -> None:
    src = _buf(ALIGN)
    src[:16].copy_(torch.arange(16, dtype=torch.uint8))
    store.write("t", src, 64)
    with open(store.path("t"), "r+b") as f:
        f.seek(ALIGN)
        first, second = f.read(8), f.read(8)
        f.seek(ALIGN)
        f.write(second + first)
    with pytest.raises(SwapFileError, match="checksum"):
        store.read("t", _buf(ALIGN), 64)


def test_truncated_file_is_detected(store: NvmeStore) -> None:
    src = _buf(2 * ALIGN)
    store.write("t", src, 2 * ALIGN)
    os.truncate(store.path("t"), ALIGN + ALIGN)
    with pytest.raises(SwapFileError, match="truncated"):
        store.read("t", _buf(2 * ALIGN), 2 * ALIGN)


def test_missing_and_foreign_files_are_detected(store: NvmeStore) -> None:
    with pytest.raises(SwapFileError, match="missing"):
        store.read("nope", _buf(ALIGN), 10)
    store.write("a", _buf(ALIGN), 100)
    os.replace(store.path("a"), store.path("b"))
    with pytest.raises(SwapFileError, match="header"):
        store.read("b", _buf(ALIGN), 200)  # a file of another length/tensor


def test_unusable_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SwapPathError, match="not usable"):
        NvmeStore(blocker / "swap").prepare()
