"""`rltune bench offload` end to end on a small GPT-2: a baseline that cannot start
at the fast-tier budget is reported as such and the others are still compared;
the ratios come back from the per-strategy step times; every strategy that ran
trained to `none`'s losses exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rltune import main

pytest.importorskip("transformers")


def test_a_baseline_that_cannot_start_is_reported_and_the_rest_compared(tmp_path: Path) -> None:
    out = tmp_path / "offload.json"
    # GPT-2 with a 4096-token tied embedding (1 MiB): at 80% of 4.4 MB the fast
    # tier holds lru's 3 buffers of it but not fixed's 4
    argv = ["bench", "offload", "--device", "cpu", "--archs", "gpt2", "--dim", "64",
            "--layers", "2", "--vocab", "4096", "--seq", "16", "--batch", "2", "--steps", "1",
            "--warmup", "1", "--fast-frac", "0.8", "--nvme-dir", str(tmp_path),
            "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    r = json.loads(out.read_text())
    g = r["gpt2"]
    assert "fixed: fast budget" in g["fixed"]["cannot_start"]
    assert g["ratios"]["tencache_vs_fixed"] is None
    assert set(g["losses_identical_to_none"]) == {"none", "lru", "tencache"}
    assert all(g["losses_identical_to_none"].values())
    want = g["lru"]["step_ms"] / g["tencache"]["step_ms"]
    assert g["ratios"]["tencache_vs_lru"] == pytest.approx(want, abs=1e-3)
    assert r["settings"]["device"] == "cpu"
    assert list(tmp_path.iterdir()) == [out]  # its swap files are gone


def test_cuda_asked_for_without_a_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["bench", "offload", "--device", "cuda"]) == 2
    assert main(["bench", "offload_link"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("torch.cuda.is_available() is False" in e for e in err)


class _Clock:
    """A fake `time.perf_counter`: a step takes 1 s of it, a drain 100 s."""

    now = 0.0

    def __call__(self) -> float:
        return self.now


class _Cache:
    def __init__(self, clock: _Clock, events: list[str]) -> None:
        self.clock, self.events = clock, events

    def drain(self) -> None:
        self.events.append("drain")
        self.clock.now += 100.0


class _Engine:
    """What `interleaved` calls of an engine, with a prefetch for the next step
    left in flight at every step's end (what the drain would wait for)."""

    def __init__(self, name: str, clock: _Clock, events: list[str]) -> None:
        from offload_agent.device import CpuDevice
        from offload_agent.link import LinkEmulation
        from offload_agent.stats import CacheStats

        self.name, self.clock, self.events = name, clock, events
        self.link = LinkEmulation(pcie_gbps=1.0, nvme_gbps=1.0)
        self.device = CpuDevice(link=self.link)
        self.cache = _Cache(clock, events)
        self.stats = CacheStats()
        self.model = None

    def step(self) -> object:
        from contextlib import contextmanager

        @contextmanager
        def ctx():  # type: ignore[no-untyped-def]
            self.events.append(f"{self.name} step")
            self.stats.access("hit")
            self.link.nvme.occupy(1_000_000, 0.0)  # 1 ms of the NVMe link
            yield
            self.clock.now += 1.0

        return ctx()


def test_a_timed_step_runs_from_the_end_of_the_one_before_and_no_drain_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    import bench.offload as bo
    from bench.offload import BenchArgs, Workload, interleaved

    clock, events = _Clock(), list[str]()
    monkeypatch.setattr(bo.time, "perf_counter", clock)
    engines = {n: _Engine(n, clock, events) for n in ("a", "b")}
    w = Workload("x", torch.nn.Identity(), lambda m, s: torch.ones(1, requires_grad=True), {})
    planned: list[str] = []
    a = BenchArgs(warmup=1, repeats=3, steps=2)
    out = interleaved(engines, w, a, lambda n, e: planned.append(n))  # type: ignore[type-var]
    for m in out.values():
        # each timed step is its own 1 s: neither the drain after the step before
        # (the old accounting added 100 s to every step) nor the lead-in is in it
        assert m.blocks == [[1000.0, 1000.0]] * 3
        assert sorted(m.losses) == list(range(1 + 3 * 3))  # the same step indices
        assert m.hits == 3 * 2  # counted over the timed steps only
        assert m.link_busy_ms == pytest.approx({"nvme": 6.0, "pcie_h2d": 0.0, "pcie_d2h": 0.0})
    # warm-up: every step drained; then per repeat one block per engine (lead-in
    # + 2 timed steps), drained once at its end, the first engine rotating
    block = lambda n: [f"{n} step"] * 3 + ["drain"]  # noqa: E731
    want = ["a step", "drain", "b step", "drain"]
    want += block("a") + block("b") + block("b") + block("a") + block("a") + block("b")
    assert events == want
    assert len(planned) == 2 + 2 * 3 * 3  # after every step


def test_runs_plot_reads_ratios_and_their_ranges(tmp_path: Path) -> None:
    from bench.offload_runs import main as runs_main
    from bench.offload_runs import ratios

    run = {
        "gpt2": {
            "ratios": {"tencache_vs_lru": 1.6, "tencache_vs_fixed": None},
            "ratio_spread": {"tencache_vs_lru": {"min": 1.2, "median": 1.5, "max": 2.0}},
            "load_average": [3.0, 4.0],
        },
        "old": {"ratios": {"tencache_vs_lru": 1.4, "tencache_vs_fixed": 2.0}},  # no spread
        "settings": {"steps": 2},
    }
    assert ratios(run) == {
        "gpt2": {"lru": (1.6, 1.2, 2.0), "fixed": None},
        "old": {"lru": (1.4, 1.4, 1.4), "fixed": (2.0, 2.0, 2.0)},
    }
    src, png = tmp_path / "run.json", tmp_path / "r.png"
    src.write_text(json.dumps(run))
    assert runs_main([str(png), str(src)]) == 0 and png.stat().st_size > 0
    assert runs_main([str(png)]) == 2


def test_link_floor_from_busy_time_and_compute() -> None:
    """Worked by hand: an NVMe link busy 400 ms a step against 120 ms of compute is
    link-bound and can hide at most 30% of its time; 90 ms against 120 ms is not."""
    from bench.offload import link_floor

    busy = {"nvme": 400.0, "pcie_h2d": 57.0, "pcie_d2h": 46.0}
    assert link_floor({"link_busy_ms_per_step": busy}, 120.0) == {
        "link": "nvme",
        "busy_ms": 400.0,
        "compute_ms": 120.0,
        "link_bound": True,
        "hideable_share": 0.3,
    }
    fast = link_floor({"link_busy_ms_per_step": {"nvme": 90.0, "pcie_h2d": 30.0}}, 120.0)
    assert fast is not None and not fast["link_bound"] and fast["hideable_share"] == 1.0
    assert link_floor({"link_busy_ms_per_step": {"nvme": 0.0}}, 120.0) is None  # no emulation
    assert link_floor({}, 120.0) is None
