"""The NVMe tier: one aligned swap file per tensor, O_DIRECT where the file system
allows it, every file checksummed and labelled so a corrupted, truncated or
foreign one is caught.

File layout: one ALIGN-byte header block (magic, payload length, checksum
kind, checksum of the payload, then the file's identity: job id, tensor id,
dtype and shape, plan version), then the payload padded to a multiple of
ALIGN. Every read checks the whole header against what the reader expects, so
another job's file, another tensor's file of the same size, or a file left by
an earlier plan is refused by name. Checksums: `sum64` (default) is two
wrapping 64-bit word sums (all words, and every other word) folded with the
length — any changed byte and any truncation is caught, at memory speed;
`crc32` (zlib) is stronger against reordering but cost a third of the I/O
core in the benchmark (1.8 GB/s), so it is opt-in. Reads and writes go
straight between the file and an ALIGN-aligned buffer slot, so with O_DIRECT
they bypass the page cache (what a real NVMe offload does; without it a "disk"
tier would silently be host memory). Calls are blocking and thread-safe per
file; the engine runs them on its I/O thread pool. Nothing touches the disk
until `prepare` (not in the constructor).

Where the files go: `NvmeStore(root)` writes into its own directory under
`root`, named for the job and the process (`<job>-<pid>-<random>`), so two
processes given the same root (two jobs, or the same job started twice) never
share a file. The directory holds an `owner` file the process keeps locked
(`flock`) while it lives; `prepare` removes the directories under `root`
whose owner lock nobody holds any more (the leftovers of a dead process,
logged), and `remove_all` removes only the files this store wrote. A training
process started by the host agent finds its root in `RLTUNE_SWAP_DIR` (the
agent's swap root on the host's NVMe, joined with the job id; the agent
removes it when the process exits); `swap_dir()` reads it, falling back to a
directory under the system's temporary directory for processes run by hand.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import mmap
import os
import secrets
import shutil
import socket
import struct
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch

from offload_agent.device import ALIGN, align_up

__all__ = ["NvmeStore", "SwapFileError", "SwapPathError", "job_swap_dir", "swap_dir"]

SWAP_DIR_ENV = "RLTUNE_SWAP_DIR"
OWNER = "owner"  # in each store's directory: who wrote it, locked while they live

log = logging.getLogger("rltune.offload")

_MAGIC = b"RLTSWAP2"
# magic, payload bytes, checksum kind, checksum, plan version, identity length
_HEADER = struct.Struct("<8sQBQqH")
_KINDS = {"sum64": 1, "crc32": 2}
_MASK = (1 << 64) - 1


def _sum64(payload: memoryview, nbytes: int) -> int:
    arr = np.frombuffer(payload, dtype=np.uint8, count=nbytes)
    whole = nbytes // 8 * 8
    words = arr[:whole].view(np.uint64)
    every = int(np.add.reduce(words, dtype=np.uint64)) if whole else 0
    other = int(np.add.reduce(words[::2], dtype=np.uint64)) if whole else 0
    tail = int.from_bytes(arr[whole:].tobytes(), "little")
    return (every ^ ((other << 1) & _MASK) ^ tail ^ nbytes) & _MASK


def checksum(kind: str, payload: memoryview, nbytes: int) -> int:
    if kind == "crc32":
        return zlib.crc32(payload[:nbytes])
    return _sum64(payload, nbytes)


class SwapFileError(RuntimeError):
    """A swap file is missing, truncated or fails its checksum: never read silently."""


class SwapPathError(RuntimeError):
    """The NVMe directory cannot be created, written or read."""


def swap_dir() -> Path:
    """This process's swap directory: `RLTUNE_SWAP_DIR`, else `<tmp>/rltune-swap`."""
    return Path(os.environ.get(SWAP_DIR_ENV) or Path(tempfile.gettempdir()) / "rltune-swap")


def _file_name(key: str) -> str:
    """A file name for any string: readable, never a path, distinct for distinct keys
    (the CRC tells apart keys that read the same once sanitised)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in key).lstrip(".")
    return f"{safe}-{zlib.crc32(key.encode()):08x}"


def job_swap_dir(root: Path, job_id: str) -> Path:
    """One job's directory under the agent's swap root."""
    return Path(root) / _file_name(job_id)


def _memview(buf: torch.Tensor) -> memoryview:
    return memoryview(buf.numpy()).cast("B")  # type: ignore[arg-type]


class NvmeStore:
    """Swap files of one process, one per tensor id, in its own directory under `root`."""

    def __init__(
        self,
        root: Path,
        *,
        job_id: str = "local",
        direct: bool | None = None,
        check: str = "sum64",
    ) -> None:
        if check not in _KINDS:
            raise ValueError(f"checksum {check!r}: choose from {', '.join(_KINDS)}")
        self.root = Path(root)
        self.job_id = job_id
        self.dir = self.root  # settled by prepare(): this process's own directory
        self.direct = direct  # None: find out in prepare()
        self.check = check
        self.version = 0  # the plan version files are written under (the engine sets it)
        self.bytes_written = 0
        self.bytes_read = 0
        self._written: dict[Path, int] = {}  # file -> plan version it was written under
        self._lock_fd: int | None = None

    def prepare(self, *, job_id: str | None = None) -> None:
        """Remove dead processes' leftovers, create and lock this process's own
        directory, prove it is writable and readable, settle O_DIRECT. `job_id`
        (the engine passes its own) labels the directory and every file."""
        if self._lock_fd is not None:
            return
        if job_id is not None:
            self.job_id = job_id
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.remove_leftovers()
            name = f"{_file_name(self.job_id)}-{os.getpid()}-{secrets.token_hex(3)}"
            self.dir = self.root / name
            self.dir.mkdir()
            self._lock_fd = self._own(self.dir / OWNER)
            probe = self.dir / ".probe"
            probe.write_bytes(b"x" * 16)
            if probe.read_bytes() != b"x" * 16:
                raise OSError(errno.EIO, "read back differs")
            probe.unlink()
        except OSError as exc:
            self.remove_all()
            raise SwapPathError(
                f"NVMe swap directory {self.root} is not usable ({exc.strerror or exc}); "
                "pass a writable directory on a local disk"
            ) from exc
        if self.direct is None:
            self.direct = self._direct_supported()

    def _own(self, path: Path) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        info = {"job_id": self.job_id, "pid": os.getpid(), "host": socket.gethostname()}
        os.write(fd, json.dumps({**info, "started": time.time()}).encode())
        return fd

    def remove_leftovers(self) -> list[Path]:
        """Directories under `root` with an owner file nobody holds locked: their
        process died without cleaning up. Removed, and returned."""
        gone = []
        for owner in sorted(self.root.glob(f"*/{OWNER}")):
            try:
                fd = os.open(owner, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live process holds it
            finally:
                os.close(fd)
            who = owner.read_text(errors="replace")
            shutil.rmtree(owner.parent, ignore_errors=True)
            log.warning("removed swap files of a process that is gone: %s (%s)", owner.parent, who)
            gone.append(owner.parent)
        return gone

    def _direct_supported(self) -> bool:
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            return False
        try:
            fd = os.open(self.dir / ".probe_direct", os.O_RDWR | os.O_CREAT | flag, 0o600)
        except OSError:
            return False
        try:
            block = mmap.mmap(-1, ALIGN)
            os.pwrite(fd, block, 0)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
            (self.dir / ".probe_direct").unlink(missing_ok=True)

    def path(self, tensor_id: str) -> Path:
        return self.dir / f"{_file_name(tensor_id)}.swap"

    def _identity(self, tensor_id: str, meta: str) -> bytes:
        """Whose file this is: job, tensor, dtype/shape, under which plan."""
        out = "\0".join((self.job_id, tensor_id, meta)).encode()
        if len(out) > ALIGN - _HEADER.size:
            raise ValueError(f"tensor id {tensor_id[:80]!r}... is too long for a swap header")
        return out

    def _open(self, path: Path, flags: int) -> int:
        if self.direct:
            flags |= os.O_DIRECT
        return os.open(path, flags, 0o600)

    def write(self, tensor_id: str, buf: torch.Tensor, nbytes: int, meta: str = "") -> None:
        """Write the first `nbytes` of the aligned buffer `buf` as this tensor's file
        (`meta`: its dtype and shape, checked on every read). A failed write (a
        full disk) leaves no file behind and names the path."""
        path = self.path(tensor_id)
        padded = align_up(nbytes)
        payload = _memview(buf)[:padded]
        header = mmap.mmap(-1, ALIGN)
        digest = checksum(self.check, payload, nbytes)
        ident = self._identity(tensor_id, meta)
        header.write(
            _HEADER.pack(_MAGIC, nbytes, _KINDS[self.check], digest, self.version, len(ident))
        )
        header.write(ident)
        try:
            fd = self._open(path, os.O_WRONLY | os.O_CREAT)
            self._written[path] = self.version
            try:
                os.pwritev(fd, [header, payload], 0)
                os.ftruncate(fd, ALIGN + padded)
            finally:
                os.close(fd)
        except OSError as exc:
            path.unlink(missing_ok=True)
            self._written.pop(path, None)
            raise SwapPathError(
                f"writing swap file {path} for {tensor_id} failed ({exc.strerror or exc}); "
                "free space on that disk or give the job another swap directory"
            ) from exc
        self.bytes_written += padded

    def read(self, tensor_id: str, buf: torch.Tensor, nbytes: int, meta: str = "") -> None:
        """Fill the first `nbytes` of `buf` from the tensor's file, checking its
        identity and its payload whole."""
        path = self.path(tensor_id)
        padded = align_up(nbytes)
        header = mmap.mmap(-1, ALIGN)
        try:
            fd = self._open(path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise SwapFileError(f"swap file {path} for {tensor_id} is missing") from exc
        try:
            got = os.preadv(fd, [header, _memview(buf)[:padded]], 0)
        finally:
            os.close(fd)
        magic, length, kind, digest, version, n = _HEADER.unpack(header[: _HEADER.size])
        names = {v: k for k, v in _KINDS.items()}
        if magic != _MAGIC or length != nbytes or kind not in names:
            raise SwapFileError(f"swap file {path} has a bad header (not {tensor_id})")
        ident = header[_HEADER.size : _HEADER.size + n]
        if ident != self._identity(tensor_id, meta):
            job, tid, what = [*bytes(ident).decode(errors="replace").split("\0"), "", ""][:3]
            raise SwapFileError(
                f"swap file {path} holds {tid!r} {what} of job {job!r}, "
                f"not {tensor_id!r} {meta} of job {self.job_id!r}"
            )
        if version != self._written.get(path):
            raise SwapFileError(
                f"swap file {path} for {tensor_id} is from plan version {version}, "
                f"this process last wrote it under version {self._written.get(path)}"
            )
        if got < ALIGN + padded:
            raise SwapFileError(f"swap file {path} is truncated: {got} of {ALIGN + padded} bytes")
        if checksum(names[kind], _memview(buf), nbytes) != digest:
            raise SwapFileError(f"swap file {path} for {tensor_id} fails its checksum")
        self.bytes_read += padded

    def remove_all(self) -> None:
        """Remove the files this store wrote, its owner file and its directory
        (nothing else: another process's files under the same root stay)."""
        for path in list(self._written):
            path.unlink(missing_ok=True)
        self._written.clear()
        if self._lock_fd is not None:
            (self.dir / OWNER).unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None
            with contextlib.suppress(OSError):  # something not ours is in it: leave it
                self.dir.rmdir()
