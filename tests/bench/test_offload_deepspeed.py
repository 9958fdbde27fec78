"""DeepSpeed ZeRO-3 in `rltune bench offload`: the fast-tier budget on ZeRO-3's
limits and the config (worked by hand, no DeepSpeed needed), the command line's
checks, and, where DeepSpeed is installed (`make deepspeed-check`), the harness
end to end on DeepSpeed's CPU accelerator: its losses against `none`'s, and the
cause of their difference (DeepSpeed's CPU AdamW kernel) shown by swapping in
`torch.optim.AdamW`, which then matches a plain PyTorch loop bit for bit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.offload import loss_diff
from bench.offload_deepspeed import ZeroKnobs, zero3_config, zero3_knobs
from offload_agent.optim import AdamW
from rltune import main


def test_the_budget_is_split_over_live_prefetch_persistent_and_gradient_buckets() -> None:
    """Worked by hand: 800 fp32 elements (3,200 B). Live 400, prefetch 200, gradient
    bucket 100; E/8 = 100 keeps the two 10-element parameters (20) but not the
    100 one as well (120), so the threshold is 10. Swapped: 100, 1000, 1000; at
    least (400 + 200) / 100 + 2 = 8 buffers, capped at the 3 swapped parameters,
    raised to DeepSpeed's default 5; each as large as the largest parameter."""
    k = zero3_knobs([10, 1000, 100, 10, 1000], 2, fast_budget=3200, host_budget=64_000)
    assert k == ZeroKnobs(
        max_live=400,
        prefetch=200,
        persistence=10,
        reduce_bucket=100,
        buffer_size=1000,
        buffer_count=5,
        sub_group=4000,  # 64,000 B / (4 buffers x 4 B)
    )
    kept = sum(n for n in [10, 1000, 100, 10, 1000] if n <= k.persistence)
    assert k.max_live + k.prefetch + k.reduce_bucket + kept <= 3200 // 4


def test_many_small_parameters_get_buffers_for_the_live_and_prefetched_elements() -> None:
    # 40 parameters of 50 elements; E = 1000: a threshold of 50 would keep all 40
    # (2,000 > E/8 = 125), so none stays; they need (500 + 250) / 50 + 3 = 18 buffers
    k = zero3_knobs([50] * 40, 3, fast_budget=4000, host_budget=0)
    assert k.persistence == 0
    assert (k.buffer_count, k.buffer_size, k.sub_group) == (18, 50, 50)
    with pytest.raises(ValueError, match="fast budget"):
        zero3_knobs([50], 1, fast_budget=3, host_budget=0)


def test_the_config_offloads_both_to_nvme_or_to_host_memory(tmp_path: Path) -> None:
    k = zero3_knobs([10, 1000, 100, 10, 1000], 2, fast_budget=3200, host_budget=64_000)
    opt = AdamW(lr=3e-4)
    nvme = zero3_config(k, offload="nvme", batch=4, optim=opt, nvme_path=tmp_path,
                        io_threads=4, pin=True)  # fmt: skip
    z = nvme["zero_optimization"]
    assert z["stage"] == 3
    assert z["offload_param"] == {"device": "nvme", "pin_memory": True, "nvme_path": str(tmp_path),
                                  "buffer_count": 5, "buffer_size": 1000}  # fmt: skip
    assert z["offload_optimizer"]["device"] == "nvme"
    assert z["offload_optimizer"]["nvme_path"] == str(tmp_path)
    assert (z["stage3_max_live_parameters"], z["stage3_prefetch_bucket_size"]) == (400, 200)
    assert (z["stage3_param_persistence_threshold"], z["reduce_bucket_size"]) == (10, 100)
    assert nvme["aio"]["intra_op_parallelism"] == 4 and nvme["aio"]["block_size"] == 1 << 20
    assert nvme["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": 3e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-2},
    }
    assert "bf16" not in nvme and "fp16" not in nvme  # fp32, as the bench trains
    cpu = zero3_config(k, offload="cpu", batch=4, optim=opt, nvme_path=None, io_threads=4,
                       pin=False)["zero_optimization"]  # fmt: skip
    assert cpu["offload_param"] == {"device": "cpu", "pin_memory": False}
    with pytest.raises(ValueError, match="nvme_path"):
        zero3_config(k, offload="nvme", batch=4, optim=opt, nvme_path=None, io_threads=1, pin=True)
    with pytest.raises(ValueError, match="choose nvme or cpu"):
        zero3_config(k, offload="gpu", batch=4, optim=opt, nvme_path=None, io_threads=1, pin=True)


def test_loss_diff_by_hand() -> None:
    d = loss_diff([2.0, 4.5, 1.0], [2.0, 4.0, 1.25])
    assert d == {"max_abs": 0.5, "max_rel": 0.2, "last_abs": 0.25}  # 0.25 / 1.25 = 0.2
    with pytest.raises(ValueError):
        loss_diff([1.0], [1.0, 2.0])


def test_strategies_are_checked_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench.offload as bo

    assert main(["bench", "offload", "--strategies", "none,tencache,zero"]) == 2
    assert main(["bench", "offload", "--strategies", "none,lru"]) == 2
    monkeypatch.setattr(bo, "available", lambda: "DeepSpeed is not importable (ImportError: x)")
    assert main(["bench", "offload", "--strategies", "none,tencache,deepspeed"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3
    assert "unknown ['zero']" in err[0]
    assert "must include none and tencache" in err[1]
    assert "not importable" in err[2] and "pip install -e .[deepspeed]" in err[2]


def test_deepspeed_runs_under_warnings_and_the_engine_stays_strict() -> None:
    """On CUDA the bench requires deterministic kernels; DeepSpeed's steps relax that
    to warnings (`lenient`) and give the strict setting back, even on an error."""
    import torch

    from bench.offload_deepspeed import lenient

    def state() -> tuple[bool, bool]:
        return (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )

    before = state()
    try:
        torch.use_deterministic_algorithms(True)
        with lenient():
            assert state() == (True, True)
        assert state() == (True, False)
        with pytest.raises(KeyError), lenient():
            raise KeyError("a failed step")
        assert state() == (True, False)
        torch.use_deterministic_algorithms(False)
        with lenient():
            assert state() == (False, False)  # nothing to relax
        assert state() == (False, False)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


# ---- with DeepSpeed installed: its CPU accelerator --------------------------


def _deepspeed() -> None:
    pytest.importorskip(
        "deepspeed", reason="DeepSpeed is not installed: make deepspeed-check", exc_type=ImportError
    )
    pytest.importorskip("transformers")
    if shutil.which("c++") is None:
        pytest.skip("DeepSpeed JIT-compiles its CPU AdamW: no C++ compiler here")


def test_the_bench_runs_deepspeed_beside_the_engine_and_reports_its_loss_gap(
    tmp_path: Path,
) -> None:
    _deepspeed()
    out = tmp_path / "offload.json"
    argv = ["bench", "offload", "--device", "cpu", "--archs", "gpt2", "--dim", "64",
            "--layers", "2", "--vocab", "512", "--seq", "16", "--batch", "2", "--steps", "2",
            "--repeats", "2", "--warmup", "1", "--strategies", "none,tencache,deepspeed-cpu",
            "--nvme-dir", str(tmp_path), "--json", str(out)]  # fmt: skip
    assert main(argv) == 0  # DeepSpeed's inexact losses do not fail the run
    g = json.loads(out.read_text())["gpt2"]
    assert g["strategies"] == ["none", "tencache", "deepspeed-cpu"]
    ds = g["deepspeed-cpu"]
    assert ds["fast_tier_hit_rate"] is None and ds["bytes_moved_per_step"] is None
    assert ds["zero3"]["offload"] == "cpu"
    assert len(ds["step_ms_blocks"]) == 2 and all(len(b) == 2 for b in ds["step_ms_blocks"])
    want = ds["step_ms"] / g["tencache"]["step_ms"]
    assert g["ratios"]["tencache_vs_deepspeed-cpu"] == pytest.approx(want, abs=1e-3)
    ref, losses = g["none"]["losses"], ds["losses"]
    assert len(losses) == len(ref) == 1 + 2 * 3
    assert losses[0] == ref[0]  # the same model, seed and batch: no update yet
    gap = max(abs(x - r) / abs(r) for x, r in zip(losses, ref, strict=True))
    assert g["loss_diff_vs_none"]["deepspeed-cpu"]["max_rel"] == pytest.approx(gap)
    assert gap < 1e-5  # rounding of a different AdamW kernel, not another training run
    assert g["losses_identical_to_none"]["tencache"]
    assert list(tmp_path.iterdir()) == [out]  # its swap folder is gone


def test_zero_infinity_on_nvme_runs_in_the_bench_where_libaio_is_there(tmp_path: Path) -> None:
    """`deepspeed` (NVMe): its swap files in the bench's swap folder, gone after."""
    _deepspeed()
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if not AsyncIOBuilder().is_compatible():
        pytest.skip("DeepSpeed's async_io cannot build here: libaio's headers are missing")
    out = tmp_path / "offload.json"
    argv = ["bench", "offload", "--device", "cpu", "--archs", "gpt2", "--dim", "64",
            "--layers", "2", "--vocab", "512", "--seq", "16", "--batch", "2", "--steps", "1",
            "--repeats", "1", "--warmup", "1", "--strategies", "none,tencache,deepspeed",
            "--nvme-dir", str(tmp_path), "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    g = json.loads(out.read_text())["gpt2"]
    assert g["deepspeed"]["zero3"]["offload"] == "nvme"
    assert g["loss_diff_vs_none"]["deepspeed"]["max_rel"] < 1e-5
    assert list(tmp_path.iterdir()) == [out]


def test_with_torch_adamw_zero3_offload_matches_plain_pytorch_bit_for_bit() -> None:
    """The loss gap's cause: ZeRO-3 with the same config but `torch.optim.AdamW` in
    place of DeepSpeed's CPU kernel trains to a plain PyTorch loop's losses exactly."""
    _deepspeed()
    import deepspeed
    import torch

    from bench.offload_deepspeed import start_distributed
    from offload_agent.models import workload
    from offload_agent.optim import param_groups

    start_distributed("cpu")
    opt = AdamW(lr=3e-4)

    def setup() -> tuple[torch.nn.Module, object, torch.optim.Optimizer]:
        w = workload("gpt2", dim=64, layers=2, vocab=512, seq=16, size=2, seed=0)
        named = dict(w.model.named_parameters())
        groups = [
            {"params": [named[n] for n in g.params], "weight_decay": g.config.weight_decay}
            for g in param_groups(w.model, opt)
        ]
        adamw = torch.optim.AdamW(groups, lr=opt.lr, betas=opt.betas, eps=opt.eps, foreach=False)
        return w.model, w.loss, adamw

    model, loss, adamw = setup()
    ref = []
    for step in range(6):
        adamw.zero_grad()
        value = loss(model, step)  # type: ignore[operator]
        value.backward()
        adamw.step()
        ref.append(value.item())
    model, loss, adamw = setup()
    numels = [p.numel() for p in model.parameters()]
    k = zero3_knobs(numels, 4, fast_budget=sum(numels) * 4, host_budget=0)
    config = zero3_config(k, offload="cpu", batch=2, optim=opt, nvme_path=None, io_threads=1,
                          pin=False)  # fmt: skip
    del config["optimizer"]
    config["zero_force_ds_cpu_optimizer"] = False  # keep the client's torch AdamW
    engine, *_ = deepspeed.initialize(model=model, optimizer=adamw, config=config)
    got = []
    for step in range(6):
        value = loss(engine, step)  # type: ignore[operator]
        value.backward()
        engine.step()
        got.append(value.item())
    engine.destroy()
    assert got == ref
