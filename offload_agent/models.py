"""Models for `rltune bench offload`: the project's own GPT and Hugging Face
architectures built from configs (random init; no weights are downloaded),
each with one loss function over deterministic batches.

* `gpt`: `offload_agent.gpt.GPT` (untied head), the model the planner's
  defaults were measured on.
* `gpt2`: GPT-2, head tied to the token embedding (module-level tying).
* `llama`: Llama with grouped-query attention and an untied embedding and
  head (two large tensors).
* `bert`: BERT masked LM (tied decoder, many LayerNorms and biases).
* `resnet`: ResNet-18 as torchvision builds it (BasicBlocks [2, 2, 2, 2],
  BatchNorm after every convolution, 1x1 projections on the shortcuts), at
  widths dim/8 .. dim (dim 512 is ResNet-18 itself), on 32x32 images: many
  distinct tensor sizes, and module buffers (BatchNorm statistics).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from offload_agent.gpt import GPT, GPTConfig, batch

__all__ = ["ALL_ARCHS", "ARCHS", "ResNet18", "Workload", "workload"]

ARCHS = ("gpt", "gpt2", "llama", "bert", "resnet")  # `rltune bench offload`'s default
# held out: built the same way, never in the default run, for checking a change
# on an architecture it was not tuned on (T5: encoder-decoder, one embedding read
# by the encoder, the decoder and the tied head; Qwen2: grouped-query attention
# with biases on q/k/v only, RMSNorm, SwiGLU, embedding tied to the head as in
# Qwen2-0.5B; ViT: a vision transformer, a 4x4-patch convolution, a class
# token, pre-LayerNorm blocks, a classifier head over `vocab` classes)
ALL_ARCHS = (*ARCHS, "t5", "qwen2", "vit")


@dataclass(frozen=True)
class Workload:
    arch: str
    model: nn.Module
    loss: Callable[[nn.Module, int], torch.Tensor]  # (model, step) -> loss
    config: dict[str, object]


def _tokens(vocab: int, size: int, seq: int, step: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, vocab, (size, seq), generator=g)


def workload(
    arch: str,
    *,
    dim: int,
    layers: int,
    vocab: int,
    seq: int,
    size: int,
    seed: int,
    device: torch.device | str = "cpu",
) -> Workload:
    """`arch` at width `dim` and depth `layers`, seeded with `seed`; the model is
    built on the CPU (the engine places it), its batches are made on the CPU from
    the seed (the same numbers on every device) and handed to the model on `device`."""
    dev = torch.device(device)
    torch.manual_seed(seed)
    if arch == "gpt":
        cfg = GPTConfig(vocab=vocab, seq=seq, layers=layers, dim=dim, heads=8)

        def gpt_loss(model: nn.Module, step: int) -> torch.Tensor:
            x, y = batch(cfg, size, step, seed)
            return model(x.to(dev), y.to(dev))

        return Workload(arch, GPT(cfg), gpt_loss, {"dim": dim, "layers": layers, "vocab": vocab})
    if arch == "resnet":
        net = ResNet18(width=dim // 8, classes=vocab)

        def resnet_loss(model: nn.Module, step: int) -> torch.Tensor:
            g = torch.Generator().manual_seed(seed * 1_000_003 + step)
            x = torch.randn(size, 3, 32, 32, generator=g)
            y = torch.randint(0, vocab, (size,), generator=g)
            return nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))

        return Workload(arch, net, resnet_loss, {"dim": dim, "layers": 18, "vocab": vocab})
    if arch == "vit":
        vit = _vit(dim=dim, layers=layers, classes=vocab)
        vit.train()

        def vit_loss(model: nn.Module, step: int) -> torch.Tensor:
            g = torch.Generator().manual_seed(seed * 1_000_003 + step)
            x = torch.randn(size, 3, 32, 32, generator=g)
            y = torch.randint(0, vocab, (size,), generator=g)
            return model(pixel_values=x.to(dev), labels=y.to(dev)).loss

        return Workload(arch, vit, vit_loss, {"dim": dim, "layers": layers, "vocab": vocab})
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model = _hf(arch, dim=dim, layers=layers, vocab=vocab, seq=seq)
    model.train()

    def hf_loss(model: nn.Module, step: int) -> torch.Tensor:
        x = _tokens(vocab, size, seq, step, seed).to(dev)
        return model(input_ids=x, labels=x).loss

    return Workload(arch, model, hf_loss, {"dim": dim, "layers": layers, "vocab": vocab})


def _hf(arch: str, *, dim: int, layers: int, vocab: int, seq: int) -> nn.Module:
    import transformers as tf

    if arch == "gpt2":
        return tf.GPT2LMHeadModel(
            tf.GPT2Config(
                n_layer=layers, n_embd=dim, n_head=8, vocab_size=vocab, n_positions=seq,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
            )
        )  # fmt: skip
    if arch == "llama":
        return tf.LlamaForCausalLM(
            tf.LlamaConfig(
                hidden_size=dim, intermediate_size=dim * 8 // 3 // 64 * 64,
                num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                vocab_size=vocab, max_position_embeddings=seq, tie_word_embeddings=False,
                bos_token_id=0, eos_token_id=0, pad_token_id=0,
            )
        )  # fmt: skip
    if arch == "bert":
        return tf.BertForMaskedLM(
            tf.BertConfig(
                hidden_size=dim, intermediate_size=4 * dim, num_hidden_layers=layers,
                num_attention_heads=8, vocab_size=vocab, max_position_embeddings=seq,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            )
        )  # fmt: skip
    if arch == "t5":
        t5 = tf.T5Config(
            d_model=dim, d_ff=4 * dim, d_kv=dim // 8, num_heads=8, vocab_size=vocab,
            num_layers=max(1, layers // 2), num_decoder_layers=max(1, layers // 2),
            dropout_rate=0.0, pad_token_id=0, eos_token_id=1,
        )  # fmt: skip
        t5.decoder_start_token_id = 0  # the labels, shifted right, start the decoder
        return tf.T5ForConditionalGeneration(t5)
    if arch == "qwen2":
        return tf.Qwen2ForCausalLM(
            tf.Qwen2Config(
                hidden_size=dim, intermediate_size=dim * 8 // 3 // 64 * 64,
                num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                vocab_size=vocab, max_position_embeddings=seq, tie_word_embeddings=True,
                bos_token_id=0, eos_token_id=0, pad_token_id=0,
            )
        )  # fmt: skip
    raise ValueError(f"architecture {arch!r}: choose from {', '.join(ALL_ARCHS)}")


def _vit(*, dim: int, layers: int, classes: int) -> nn.Module:
    import transformers as tf

    logging.getLogger("transformers").setLevel(logging.ERROR)
    config = tf.ViTConfig(
        hidden_size=dim, intermediate_size=4 * dim, num_hidden_layers=layers,
        num_attention_heads=8, image_size=32, patch_size=4, num_channels=3,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    config.num_labels = classes  # a PretrainedConfig property (sets the label maps)
    return tf.ViTForImageClassification(config)


class _Block(nn.Module):
    """torchvision's BasicBlock: two 3x3 convolutions, each with BatchNorm."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.down(x))


class ResNet18(nn.Module):
    """ResNet-18 (torchvision's layout) with stage widths w, 2w, 4w, 8w."""

    def __init__(self, width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        stages, cin = [], width
        for i in range(4):
            cout = width * 2**i
            stages += [_Block(cin, cout, 1 if i == 0 else 2), _Block(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layers(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
