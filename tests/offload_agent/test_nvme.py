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


# ---- whose files: identity, directories, leftovers, full disks -------------


def test_a_file_of_another_tensor_or_job_or_plan_is_refused(tmp_path: Path) -> None:
    store = NvmeStore(tmp_path / "swap", job_id="job-a")
    store.prepare()
    src = _buf(ALIGN)
    src[:1000].copy_(torch.arange(1000) % 251)
    store.write("a", src, 1000, "float32[250]")
    store.write("b", src, 1000, "float32[250]")
    os.replace(store.path("b"), store.path("a"))  # same size, another tensor's file
    with pytest.raises(SwapFileError, match=r"holds 'b' float32\[250\] of job 'job-a', not 'a'"):
        store.read("a", _buf(ALIGN), 1000, "float32[250]")
    store.write("a", src, 1000, "float32[250]")
    with pytest.raises(SwapFileError, match=r"holds 'a' float32\[250\].*not 'a' int32\[250\]"):
        store.read("a", _buf(ALIGN), 1000, "int32[250]")
    other = NvmeStore(tmp_path / "swap", job_id="job-b")
    other.prepare()
    other.write("a", src, 1000, "float32[250]")
    os.replace(other.path("a"), store.path("a"))  # another job's file of the same tensor
    with pytest.raises(SwapFileError, match=r"of job 'job-b', not 'a' float32.* of job 'job-a'"):
        store.read("a", _buf(ALIGN), 1000, "float32[250]")
    store.write("a", src, 1000, "float32[250]")
    stale = store.path("a").read_bytes()
    store.version = 2
    store.write("a", src, 1000, "float32[250]")
    store.path("a").write_bytes(stale)  # a file left from the earlier plan
    with pytest.raises(SwapFileError, match=r"from plan version 0, .* version 2"):
        store.read("a", _buf(ALIGN), 1000, "float32[250]")


def test_each_store_has_its_own_directory_and_removes_only_its_files(tmp_path: Path) -> None:
    one, two = NvmeStore(tmp_path), NvmeStore(tmp_path)  # same root, same job id
    one.prepare()
    two.prepare()
    assert one.dir != two.dir and one.dir.parent == two.dir.parent == tmp_path
    for s in (one, two):
        s.write("w", _buf(ALIGN), 100)
    stranger = one.dir / "not-ours.swap"
    stranger.write_bytes(b"x")
    one.remove_all()
    assert two.path("w").exists() and stranger.exists()  # only its own files went
    assert not one.path("w").exists()
    two.remove_all()
    assert not two.dir.exists()


def test_a_dead_process_leftovers_are_removed_at_start_a_live_one_is_not(tmp_path: Path) -> None:
    import subprocess
    import sys

    live = NvmeStore(tmp_path, job_id="live")
    live.prepare()
    live.write("w", _buf(ALIGN), 100)
    script = (
        "import os, sys\n"
        "from offload_agent.device import CpuDevice\n"
        "from offload_agent.nvme import NvmeStore\n"
        "s = NvmeStore(sys.argv[1], job_id='crashed'); s.prepare()\n"
        "s.write('w', CpuDevice().alloc_host(4096), 100)\n"
        "print(s.dir); os._exit(9)\n"  # dies without any cleanup
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=False
    )
    dead = Path(done.stdout.strip())
    assert done.returncode == 9 and (dead / "owner").exists()
    fresh = NvmeStore(tmp_path, job_id="new")
    fresh.prepare()
    assert not dead.exists()  # recognised (its owner lock is free) and removed
    assert live.path("w").exists()  # a live process's directory stays
    assert {p.name for p in tmp_path.iterdir()} == {live.dir.name, fresh.dir.name}


def test_a_full_disk_names_the_path_and_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    store = NvmeStore(tmp_path / "swap")
    store.prepare()

    def full(fd: int, buffers: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full)
    with pytest.raises(SwapPathError, match=r"writing swap file .*t-\w+\.swap for t failed"):
        store.write("t", _buf(ALIGN), 100)
    assert not list(store.dir.glob("*.swap"))


def test_two_training_processes_with_default_settings_never_share_a_file(tmp_path: Path) -> None:
    """Both use the default swap root and the default job id. A cleans up and
    exits while B still has steps to run on the files it wrote before."""
    import json
    import subprocess
    import sys

    from tests.offload_agent.test_engine import STEPS

    env = {k: v for k, v in os.environ.items() if k != "RLTUNE_SWAP_DIR"}
    env["TMPDIR"] = str(tmp_path)  # the default root: <tmp>/rltune-swap
    s = tmp_path / "sig"
    runs = {
        "a": ["2", "0", str(s / "b-ready"), str(s / "a-ready"), str(tmp_path / "a.json")],
        "b": ["2", str(STEPS - 2), str(s / "a-done"), str(s / "b-ready"), str(tmp_path / "b.json")],
    }
    s.mkdir()
    procs = {
        k: subprocess.Popen([sys.executable, "-m", "tests.offload_agent.swap_job", *a], env=env)
        for k, a in runs.items()
    }
    assert procs["a"].wait(timeout=300) == 0
    (s / "a-done").touch()  # A has cleaned up and exited; B goes on
    assert procs["b"].wait(timeout=300) == 0
    a, b = (json.loads((tmp_path / f"{k}.json").read_text()) for k in "ab")
    root = tmp_path / "rltune-swap"
    assert Path(a["dir"]).parent == Path(b["dir"]).parent == root and a["dir"] != b["dir"]
    assert a["files"] and b["files"] and not set(a["files"]) & set(b["files"])
    assert a["losses"] == b["losses"][:2]
    want = _reference_losses(STEPS)
    assert b["losses"] == want  # B's files were never touched by A's run or cleanup
    assert not list(root.iterdir())  # each removed its own directory


def _reference_losses(steps: int) -> list[float]:
    from concurrent.futures import ThreadPoolExecutor

    from offload_agent.engine import EngineConfig, OffloadEngine
    from offload_agent.gpt import GPT
    from offload_agent.optim import AdamW
    from tests.offload_agent.tiny import TINY, train

    torch.manual_seed(0)
    with ThreadPoolExecutor(1) as io:
        e = OffloadEngine(
            GPT(TINY), AdamW(lr=1e-3), EngineConfig(strategy="none"),
            device=CpuDevice(), store=None, io=io,
        )  # fmt: skip
        e.start()
        return train(e, steps)
