"""The embedded language model: `RetrievalLM`, a small causal transformer trained on the key-value retrieval task
(`hookviz.zoo.retrieval`), and its shipped weights.

``retrieval_lm()`` loads them (``hookviz/zoo/retrieval_lm.safetensors``: no pickle) after checking their sha256 and
returns the model with its tokenizer; ``python -m hookviz.zoo.train --model lm --out FILE`` reproduces them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model import shipped
from .retrieval import BOS_ID, EOS_ID, PAD_ID, VOCAB, Retrieval
from .tokenizer import RetrievalTokenizer
from .vit import Attention, Mlp

LM_WEIGHTS_FILE = Path(__file__).resolve().parent / "retrieval_lm.safetensors"
LM_WEIGHTS_SHA256 = "cb47ad3e3d13bc9ecbdf90c130d7147bcb076deef8b03e9a0e7bdce905813c71"


@dataclass
class RetrievalLMConfig:
    """The few fields of a Hugging Face config that code explaining a language model reads, and the model's sizes."""

    vocab_size: int = len(VOCAB)
    max_position_embeddings: int = 32
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 256
    rope_theta: float = 10000.0
    pad_token_id: int = PAD_ID
    bos_token_id: int = BOS_ID
    eos_token_id: int = EOS_ID
    is_encoder_decoder: bool = False


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the last axis split in halves: the rotation of rotary position embeddings."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class CausalAttention(Attention):
    """Causal multi-head self-attention with rotary position embeddings and one fused
    ``F.scaled_dot_product_attention`` call.

    (N, T, D), the rotary (cos, sin) of each position, each (N, 1, T, D / heads), `previous` (N, 1, T, 1): 1 where
    the token before is a real one, and an optional (N, 1, T, T) bool mask of the allowed (query, key) pairs -> (N,
    T, D): ``qkv`` (one ``nn.Linear`` D -> 3D) split into `heads` heads, q and k rotated by their position (Su et al.
    2021, "RoFormer", in LLaMA's half-split layout), each key smeared with the one before it (``key_keep`` * k +
    ``key_smear`` * k_before), the softmax attention of Vaswani et al. 2017, ``proj``.
    """

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__(dim, heads)  # qkv and proj as the ViT's attention
        # per head, the weights of a key and of the key of the token before it in the smeared key (0.5 each at the
        # start; two free weights, not Olsson et al.'s sigmoid gate s, 1 - s: the relevance rules cover a product
        # and a sum, not the subtraction of a gate from 1)
        self.key_keep = nn.Parameter(torch.full((heads, 1, 1), 0.5))
        self.key_smear = nn.Parameter(torch.full((heads, 1, 1), 0.5))

    def forward(
        self, x: Tensor, rotary: tuple[Tensor, Tensor], previous: Tensor, allowed: Tensor | None = None
    ) -> Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        cos, sin = rotary
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        # smeared keys (Olsson et al. 2022, "In-context Learning and Induction Heads"): each key mixes in the key of
        # the token before it (none before the first token or after padding: `previous` (N, 1, T, 1) is 0 there)
        k = self.key_keep * k + self.key_smear * (F.pad(k, (0, 0, 1, 0))[:, :, :-1] * previous)
        if allowed is None:
            x = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.proj(x.transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    """A pre-norm decoder block: ``x = x + attn(norm1(x))``, then ``x = x + mlp(norm2(x))`` (as GPT-2)."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), CausalAttention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), Mlp(dim, hidden)

    def forward(
        self, x: Tensor, rotary: tuple[Tensor, Tensor], previous: Tensor, allowed: Tensor | None = None
    ) -> Tensor:
        x = x + self.attn(self.norm1(x), rotary, previous, allowed)
        x = x + self.mlp(self.norm2(x))
        return x


class RetrievalLM(nn.Module):
    """A small causal transformer language model (GPT-2's layout, Radford et al. 2019, with LLaMA's rotary positions)
    for the retrieval task.

    ``model(input_ids (N, T), attention_mask=None) -> logits (N, T, vocab_size)``: the logits at position t are the
    next-token scores after tokens 0..t. Token embeddings ``embed`` (`get_input_embeddings`), `config.num_hidden_layers`
    pre-norm ``blocks`` (``norm1``, ``attn``: rotary position embeddings on q and k, then one fused causal
    ``F.scaled_dot_product_attention`` call, ``norm2``, ``mlp``: ``fc1``, ``nn.GELU``, ``fc2``), a final ``norm`` and
    an untied linear ``head``. Positions enter through the rotations only, and each attention key is smeared with the
    key of the token before it (Olsson et al. 2022, "In-context Learning and Induction Heads": two learned weights per
    head, ``key_keep`` and ``key_smear``). Why: retrieval is an induction head (the asked key finds the value whose
    previous token is that key); with learned absolute positions and plain keys the model sat on a plateau at chance
    (any listed value) for thousands of steps, with smeared keys it learns the task in a few hundred.

    With an `attention_mask` (N, T) of 1 for real tokens and 0 for padding (left or right), no real token attends to
    padding or smears a padding key into its own, and positions count real tokens only, so padding leaves the logits
    of the real tokens unchanged (up to float rounding); a padding row attends to itself only, its logits mean
    nothing. `inputs_embeds` (N, T, D) may replace `input_ids` (as Hugging Face models take them).
    """

    def __init__(self, config: RetrievalLMConfig | None = None) -> None:
        super().__init__()
        config = RetrievalLMConfig() if config is None else config
        self.config = config
        dim = config.hidden_size
        self.embed = nn.Embedding(config.vocab_size, dim)
        head_dim = dim // config.num_attention_heads
        inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.blocks = nn.ModuleList(
            Block(dim, config.num_attention_heads, config.intermediate_size) for _ in range(config.num_hidden_layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, config.vocab_size)
        self.apply(_init)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        *,
        inputs_embeds: Tensor | None = None,
    ) -> Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids (N, T) and inputs_embeds (N, T, D)")
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        n, t = x.shape[:2]
        if t > self.config.max_position_embeddings:
            raise ValueError(
                f"input_ids has {t} tokens, more than the model's {self.config.max_position_embeddings} positions"
            )
        allowed = None
        if attention_mask is None:
            positions = torch.arange(t, device=x.device).expand(n, t)
            previous = (positions > 0).to(x.dtype)
        else:
            if attention_mask.shape != (n, t):
                raise ValueError(f"attention_mask must be (N, T) = {(n, t)}, got {tuple(attention_mask.shape)}")
            real = attention_mask.bool()
            positions = (real.long().cumsum(1) - 1).clamp(min=0)  # a left-padded row starts at position 0
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            eye = torch.eye(t, dtype=torch.bool, device=x.device)
            # a padding query may see itself only: a row with no allowed key would make the softmax NaN
            allowed = ((causal & real[:, None, :]) | eye).unsqueeze(1)
            previous = F.pad(real[:, :-1], (1, 0)).to(x.dtype)  # the token before is a real one
        angles = positions[:, None, :, None].to(x.dtype) * self.inv_freq  # (N, 1, T, head_dim / 2)
        angles = torch.cat((angles, angles), dim=-1)
        rotary = (angles.cos(), angles.sin())
        for block in self.blocks:
            x = block(x, rotary, previous[:, None, :, None], allowed)
        return self.head(self.norm(x))


def _init(module: nn.Module) -> None:
    # GPT-2's initialisation: normal weights of std 0.02, zero biases
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear):
        nn.init.zeros_(module.bias)


@torch.no_grad()
def retrieval_accuracy(model: nn.Module, data: Retrieval, batch_size: int = 500) -> float:
    """The fraction of `data` whose exact answer the model writes greedily: the value, then <eos>.

    The prompts are fed left-padded with their attention mask (as generation does); the value is the argmax after
    the prompt (which ends with the asked key) and <eos> the argmax after the value.
    """
    right = 0
    for i in range(0, len(data), batch_size):
        part = data[i : i + batch_size]
        width = int(part.lengths.max()) - 1  # the full sequence without its <eos>
        ids = torch.full((len(part), width), PAD_ID, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, (row, n) in enumerate(zip(part.ids, (part.lengths - 1).tolist(), strict=True)):
            ids[r, width - n :], mask[r, width - n :] = row[:n], 1  # left-padded: the prompt and the answer
        logits = model(ids, attention_mask=mask)
        value, eos = logits[:, -2].argmax(-1), logits[:, -1].argmax(-1)
        right += ((value == part.answers) & (eos == EOS_ID)).sum().item()
    return right / max(len(data), 1)


def retrieval_lm(weights: bool = True) -> tuple[RetrievalLM, RetrievalTokenizer]:
    """The embedded language model and its tokenizer: a `RetrievalLM` in eval mode on the CPU with the weights
    shipped in the package, and a `RetrievalTokenizer`.

    The weights (``hookviz/zoo/retrieval_lm.safetensors``, float16, made by ``python -m hookviz.zoo.train --model
    lm``) answer at least 99 % of fresh prompts of `hookviz.zoo.retrieval.retrieval` exactly. They are read as
    safetensors (plain tensors, no unpickling) after their sha256 is checked against `LM_WEIGHTS_SHA256`.
    ``weights=False`` gives an untrained model (seeded initialisation is up to the caller: ``torch.manual_seed``).
    """
    model = shipped(
        RetrievalLM,
        weights,
        LM_WEIGHTS_FILE,
        LM_WEIGHTS_SHA256,
        "retrieval LM",
        "python -m hookviz.zoo.train --model lm",
    )
    return model, RetrievalTokenizer()
