"""Which trace jobs offload, and what one of their GPUs streams per step.

Traces without model sizes (Philly): `mark_offloading` marks a seeded fraction
of jobs as training with 10Cache, with parameter bytes drawn from
`MODEL_SIZES`: well-known models by the job's GPU count (uniform among the
three of its bucket), fp32 weights as the offload engine trains them.
Jobs whose trace already gives `param_bytes` keep it and count as offloading.

`synth_profile` is the profile of one GPU of such a job: a GPT of that size
(d = hidden size, L layers, vocabulary 50,257, tied embedding), its parameters
and AdamW states sharded over the job's GPUs ZeRO-3 style (each GPU holds 1/k of
every tensor), in the access order the engine records: forward (the embedding
again for the tied head), then backward in reverse with each parameter's AdamW
step (parameter, exp_avg, exp_avg_sq) as its gradient completes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from shared.cluster import ClusterSpec
from shared.errors import UserError
from shared.messages import TensorProfile
from shared.sim.jobs_in import load_jobs
from shared.traces import SkipStats, TraceJob

__all__ = ["MODEL_SIZES", "describe_marking", "load_marked", "mark_offloading", "synth_profile"]

# (largest GPU count of the bucket, [(model, parameters), ...])
MODEL_SIZES: tuple[tuple[int, tuple[tuple[str, float], ...]], ...] = (
    (1, (("BERT-large", 0.34e9), ("GPT-2 XL", 1.56e9), ("T5-3B", 2.85e9))),
    (4, (("GPT-2 XL", 1.56e9), ("T5-3B", 2.85e9), ("GPT-J-6B", 6.05e9))),
    (8, (("T5-3B", 2.85e9), ("GPT-J-6B", 6.05e9), ("LLaMA-7B", 6.74e9))),
    (1 << 30, (("LLaMA-7B", 6.74e9), ("LLaMA-13B", 13.0e9), ("GPT-NeoX-20B", 20.6e9))),
)
VOCAB = 50_257
BYTES_PER_PARAM = 4  # fp32 weights (AdamW states: two more of the same size)


def describe_marking(fraction: float, seed: int) -> str:
    buckets = []
    lo = 1
    for hi, models in MODEL_SIZES:
        rng = "1 GPU" if hi == lo == 1 else (f"{lo}+ GPUs" if hi >= 1 << 30 else f"{lo}-{hi} GPUs")
        names = ", ".join(f"{m} {p / 1e9:g}B" for m, p in models)
        buckets.append(f"{rng}: {names}")
        lo = hi + 1
    return (
        f"offload: {fraction:.0%} of jobs without model sizes marked as offloading "
        f"(seed {seed}), parameters fp32, uniform over well-known models by GPU count: "
        + "; ".join(buckets)
    )


def mark_offloading(jobs: Sequence[TraceJob], fraction: float, seed: int) -> list[TraceJob]:
    """`jobs` with a seeded `fraction` of those lacking `param_bytes` given one."""
    if not 0.0 <= fraction <= 1.0:
        raise UserError(f"--offload-fraction must be within [0, 1], got {fraction}")
    rng = random.Random(f"offload-{seed}")
    out = []
    for j in jobs:
        # two draws per job whatever the outcome: a job's size does not depend on others
        pick, which = rng.random(), rng.randrange(3)
        if j.param_bytes is None and pick < fraction:
            models = next(m for hi, m in MODEL_SIZES if j.num_gpus <= hi)
            j = replace(j, param_bytes=int(models[which][1] * BYTES_PER_PARAM))
        out.append(j)
    return out


def load_marked(
    path: str | Path,
    fmt: str,
    cluster: ClusterSpec,
    stats: SkipStats,
    limit: int | None,
    fraction: float,
    seed: int,
) -> list[TraceJob]:
    """The trace's jobs (`load_jobs`), a seeded `fraction` of them marked as offloading.
    cluster-sim simulates these and `rltune up` replays them: the same function over
    the same arguments, so the jobs the replay declares are the ones the cluster runs."""
    jobs = load_jobs(path, fmt, cluster, stats, limit)
    return mark_offloading(jobs, fraction, seed) if fraction else jobs


def gpt_shape(params: float) -> tuple[int, int]:
    """(d, L) of a GPT with about `params` parameters, L ≈ d / 128 as in GPT-3 and LLaMA."""
    d = max(64, round((params * 128 / 12) ** (1 / 3) / 64) * 64)
    layers = max(1, round((params - VOCAB * d) / (12 * d * d)))
    return d, layers


def synth_profile(
    job_id: str, param_bytes: int, gpus: int, budgets: tuple[int, int]
) -> TensorProfile:
    """The profile of one of the job's `gpus` GPUs (its ZeRO-3 shard of the model)."""
    d, layers = gpt_shape(param_bytes / BYTES_PER_PARAM)
    shard = max(1, gpus)
    params: list[tuple[str, int]] = [("tok", VOCAB * d)]
    for i in range(layers):
        params += [
            (f"h{i}.ln1", d),
            (f"h{i}.qkv", 3 * d * d),
            (f"h{i}.proj", d * d),
            (f"h{i}.ln2", d),
            (f"h{i}.fc1", 4 * d * d),
            (f"h{i}.fc2", 4 * d * d),
        ]
    params.append(("lnf", d))
    tensors: list[tuple[str, int, str, str]] = []
    for name, numel in params:
        nbytes = max(BYTES_PER_PARAM, numel * BYTES_PER_PARAM // shard)
        tensors += [(f"{name}#{k}" if k != "param" else name, nbytes, "float32", k)
                    for k in ("param", "exp_avg", "exp_avg_sq")]  # fmt: skip
    names = [n for n, _ in params]
    order = [*names, "tok"]  # forward, then the tied head reads the embedding again
    for name in reversed(names):
        order += [name, name, f"{name}#exp_avg", f"{name}#exp_avg_sq"]
    return TensorProfile(
        job_id=job_id,
        tensors=tensors,
        order=order,
        fast_budget_bytes=budgets[0],
        host_budget_bytes=budgets[1],
    )
