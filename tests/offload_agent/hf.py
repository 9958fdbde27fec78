"""Tiny Hugging Face models built from configs (random init, nothing downloaded),
and one plain-PyTorch training loop to compare the engine against."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from offload_agent.device import CpuDevice, CudaDevice, Device

logging.getLogger("transformers").setLevel(logging.ERROR)

# Where the engine's fast tier and the reference compute: `cpu` (CI), or `cuda`
# on a GPU host (RLTUNE_TEST_DEVICE=cuda: the same tests against the real link,
# pinned buffers and side stream; deterministic kernels, see conftest.py).
DEVICE = torch.device(os.environ.get("RLTUNE_TEST_DEVICE", "cpu"))


def engine_device() -> Device:
    """The engine's device layer for DEVICE."""
    return CudaDevice(DEVICE.index or 0) if DEVICE.type == "cuda" else CpuDevice()


def exact(got: torch.Tensor, want: torch.Tensor, msg: str = "") -> None:
    """Bit-for-bit equal, wherever each tensor lives."""
    torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=0, msg=msg or None)


VOCAB = 128
SEQ = 12
NO_DROPOUT = 0.0


def gpt2() -> nn.Module:
    """GPT-2: `lm_head.weight` is `transformer.wte.weight` (module-level tying)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
        resid_pdrop=NO_DROPOUT, embd_pdrop=NO_DROPOUT, attn_pdrop=NO_DROPOUT,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(cfg)


def llama() -> nn.Module:
    """Llama with grouped-query attention (4 heads, 2 key/value heads), untied head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return LlamaForCausalLM(cfg)


def bert() -> nn.Module:
    """BERT masked LM: decoder tied to the word embeddings, LayerNorms and biases."""
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=VOCAB, max_position_embeddings=SEQ, hidden_dropout_prob=NO_DROPOUT,
        attention_probs_dropout_prob=NO_DROPOUT,
    )  # fmt: skip
    return BertForMaskedLM(cfg)


def t5() -> nn.Module:
    """T5: one embedding read by the encoder, the decoder and the tied head."""
    from transformers import T5Config, T5ForConditionalGeneration

    # decoder_start_token_id is taken as an extra attribute: not in T5Config's typed signature
    cfg = T5Config(  # type: ignore[call-arg]
        d_model=64, d_ff=128, d_kv=16, num_layers=1, num_decoder_layers=1, num_heads=4,
        vocab_size=VOCAB, dropout_rate=NO_DROPOUT, decoder_start_token_id=0, pad_token_id=0,
        eos_token_id=1,
    )  # fmt: skip
    return T5ForConditionalGeneration(cfg)


def qwen2() -> nn.Module:
    """Qwen2: grouped-query attention with biases on q/k/v only, head tied to the
    embedding (as Qwen2-0.5B)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


class ViTLM(nn.Module):
    """A ViT image classifier (`offload_agent.models`' `vit` at width 64) behind the
    language models' call, the images made as `ResNetLM` makes them."""

    def __init__(self) -> None:
        super().__init__()
        from offload_agent.models import _vit

        self.net = _vit(dim=64, layers=2, classes=10)
        self.net.train()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        img = (input_ids.float() / VOCAB - 0.5).view(-1, 3, 2, 2)
        img = img.repeat_interleave(16, -1).repeat_interleave(16, -2)
        return SimpleNamespace(loss=self.net(pixel_values=img, labels=labels[:, 0] % 10).loss)


def albert() -> nn.Module:
    """ALBERT: one transformer layer applied three times in every forward."""
    from transformers import AlbertConfig, AlbertForMaskedLM

    cfg = AlbertConfig(
        embedding_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=SEQ,
        hidden_dropout_prob=NO_DROPOUT, attention_probs_dropout_prob=NO_DROPOUT,
        classifier_dropout_prob=NO_DROPOUT,
    )  # fmt: skip
    return AlbertForMaskedLM(cfg)


class SharedBlockLM(nn.Module):
    """ALBERT's shape in plain PyTorch (ALBERT in `transformers` refuses activation
    checkpointing): one block applied three times, each use optionally through
    `torch.utils.checkpoint`."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.block = nn.Sequential(
            nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB)
        self.reentrant: bool | None = None  # None: no checkpointing

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict[str, bool]) -> None:
        self.reentrant = gradient_checkpointing_kwargs["use_reentrant"]

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        x = self.tok(input_ids)
        for _ in range(3):
            if self.reentrant is None:
                x = x + self.block(x)
            else:
                x = x + checkpoint(self.block, x, use_reentrant=self.reentrant)
        logits = self.head(self.norm(x))
        loss = F.cross_entropy(logits.view(-1, VOCAB), labels.reshape(-1))
        return SimpleNamespace(loss=loss)


class ResNetLM(nn.Module):
    """ResNet-18's layout at widths 8..64 (BatchNorm everywhere) behind the same
    call as the language models: a batch of tokens becomes 16x16 images, its
    first token the class."""

    def __init__(self) -> None:
        super().__init__()
        from offload_agent.models import ResNet18

        self.net = ResNet18(width=8, classes=10)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        img = (input_ids.float() / VOCAB - 0.5).view(-1, 3, 2, 2)
        img = img.repeat_interleave(8, -1).repeat_interleave(8, -2)
        return SimpleNamespace(loss=F.cross_entropy(self.net(img), labels[:, 0] % 10))


ARCHS: dict[str, Callable[[], nn.Module]] = {
    "gpt2": gpt2,
    "llama": llama,
    "bert": bert,
    "t5": t5,
    "albert": albert,
    "shared": SharedBlockLM,
    "resnet": ResNetLM,
    "qwen2": qwen2,
    "vit": ViTLM,
}


def build(arch: str, *, checkpointing: str = "") -> nn.Module:
    """The model, seeded so every caller gets the same initial weights."""
    torch.manual_seed(0)
    model = ARCHS[arch]()
    if checkpointing:
        model.gradient_checkpointing_enable(  # type: ignore[operator]  # every ARCHS model has it
            gradient_checkpointing_kwargs={"use_reentrant": checkpointing == "reentrant"}
        )
    model.train()
    return model


def data(step: int, micro: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randint(2, VOCAB, (2, SEQ), generator=g).to(DEVICE)


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, labels=x).loss


@dataclass
class Loop:
    """What a training loop does besides forward and backward."""

    steps: int = 3
    lr: Callable[[int], float] = lambda step: 1e-3
    decay_groups: bool = False  # no weight decay for norms and biases
    max_grad_norm: float | None = None
    micro: int = 1  # micro-batches per step (gradient accumulation)
    frozen: tuple[str, ...] = ()  # parameter names that do not train
    grad_norms: list[float] = field(default_factory=list)


def freeze(model: nn.Module, names: tuple[str, ...]) -> None:
    for n, p in model.named_parameters():
        if n in names:
            p.requires_grad_(False)


def torch_reference(
    arch: str, loop: Loop, *, checkpointing: str = ""
) -> tuple[list[float], nn.Module, torch.optim.AdamW]:
    """Losses, trained model and optimizer of plain PyTorch training (on DEVICE)."""
    model = build(arch, checkpointing=checkpointing).to(DEVICE)
    freeze(model, loop.frozen)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if loop.decay_groups:
        groups: list[dict[str, object]] = [
            {"params": [p for _n, p in trainable if p.ndim >= 2], "weight_decay": 1e-2},
            {"params": [p for _n, p in trainable if p.ndim < 2], "weight_decay": 0.0},
        ]
    else:
        groups = [{"params": [p for _n, p in trainable]}]
    opt = torch.optim.AdamW(groups, lr=loop.lr(0), weight_decay=1e-2, foreach=False)
    losses = []
    for step in range(loop.steps):
        for g in opt.param_groups:
            g["lr"] = loop.lr(step)
        opt.zero_grad()
        for i in range(loop.micro):
            loss = loss_of(model, data(step, i)) / loop.micro
            loss.backward()
            losses.append(float(loss.detach()))
        if loop.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(
                model.parameters(), loop.max_grad_norm, foreach=False
            )
            loop.grad_norms.append(float(norm))
        opt.step()
    return losses, model, opt


@dataclass
class Amp:
    """Mixed precision in the reference: fp32 masters in `torch.optim.AdamW`, the
    model's parameters as bf16/fp16 working copies, forward under
    `torch.autocast`, fp16 with `torch.amp.GradScaler`."""

    dtype: torch.dtype = torch.float16
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    scales: list[float] = field(default_factory=list)  # the loss scale after each step

    @property
    def name(self) -> str:
        return "fp16" if self.dtype == torch.float16 else "bf16"


def amp_reference(
    arch: str, loop: Loop, amp: Amp, *, checkpointing: str = ""
) -> tuple[list[float], nn.Module, dict[str, nn.Parameter], torch.optim.AdamW]:
    """Losses, the model (working copies), the fp32 masters and their optimizer."""
    model = build(arch, checkpointing=checkpointing).to(DEVICE)
    freeze(model, loop.frozen)
    masters = {
        n: nn.Parameter(p.detach().clone()) for n, p in model.named_parameters() if p.requires_grad
    }
    for p in model.parameters():
        p.data = p.data.to(amp.dtype)
    opt = torch.optim.AdamW(list(masters.values()), lr=loop.lr(0), weight_decay=1e-2, foreach=False)
    scaler = torch.amp.GradScaler(
        DEVICE.type,
        init_scale=amp.init_scale,
        growth_interval=amp.growth_interval,
        enabled=amp.dtype == torch.float16,
    )
    named = dict(model.named_parameters())
    losses = []
    for step in range(loop.steps):
        for g in opt.param_groups:
            g["lr"] = loop.lr(step)
        opt.zero_grad()
        model.zero_grad(set_to_none=True)
        for i in range(loop.micro):
            with torch.autocast(DEVICE.type, dtype=amp.dtype):
                loss = loss_of(model, data(step, i)) / loop.micro
            scaler.scale(loss).backward()
            losses.append(float(loss.detach()))
        for n, m in masters.items():
            grad = named[n].grad
            m.grad = None if grad is None else grad.float()
        if loop.max_grad_norm is not None:
            scaler.unscale_(opt)
            norm = torch.nn.utils.clip_grad_norm_(
                list(masters.values()), loop.max_grad_norm, foreach=False
            )
            loop.grad_norms.append(float(norm))
        scaler.step(opt)
        scaler.update()
        amp.scales.append(float(scaler.get_scale()) if scaler.is_enabled() else 1.0)
        with torch.no_grad():
            for n, m in masters.items():
                named[n].copy_(m)
    return losses, model, masters, opt
