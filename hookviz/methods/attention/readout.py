"""What the two rollouts share: one forward pass with the attention captured, and the read-out of a rollout matrix.

A rollout is a (T, T) matrix per input (and target) over the tokens the attention layers see. Its read-out is one
row, the token whose representation the model's head reads, over all tokens:

- images (inputs (N, C, H, W)): the class token's row (token 0) when the model has prefix tokens (class,
  distillation, register tokens), or the mean of all rows when it has none (a head that pools every token reads them
  alike); the prefix tokens are dropped and the patch tokens folded into their (h, w) grid by `hookviz.layouts`
  (the model's ``num_prefix_tokens`` where timm gives one, else inferred from T and the input's size): (N, 1, h, w);
- tokens (integer token ids (N, T), e.g. a BERT classifier with ``forward_kwargs={"attention_mask": mask}``): the
  first token's row (BERT's ``[CLS]``), (N, T); ``token=-1`` reads the last token (a causal language model).

Values are raw: no rescaling (that is the display's job).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...hooks import HookManager
from ...layouts import resolve_layout
from ...targets import BackwardStrategy, Targets, TargetSpec, resolve_targets
from ..base import Attribution
from ..forward import ForwardArgs
from .capture import AttentionCapture, Captured, attention_modules


class RolloutAttribution(Attribution):
    """Shared life cycle of the attention rollouts: capture the attention of one forward pass, roll it out
    (`_rollout`, (N, K, T, T)), read out the explained token's row.

    Args:
        model: a transformer with attention modules (``nn.MultiheadAttention``, or classes whose name contains
            "Attention": timm, torchvision and Hugging Face models); a model without any raises `ValueError`.
        token: the row read out: None (default) for the class token (token 0) of image models with prefix tokens and
            of token models, or the mean of the rows for image models without prefix tokens; an int for that token
            (negative ints count from the end: -1 for a causal language model's last token); for token ids, an (N, K)
            integer tensor: one row per input and target (a language model's generated tokens, each read at the
            position that predicts it, with an (N, K) target).
    """

    display_defaults: ClassVar[dict[str, Any]] = {"reduce": None, "mode": "minmax", "cmap": "jet", "overlay": True}
    token_scores: ClassVar[bool] = True  # token ids give (N, T) scores (`hookviz.text.explain_tokens` takes them)

    def __init__(
        self,
        model: nn.Module,
        *,
        token: int | Tensor | None = None,
        eval_mode: bool = True,
        backward: BackwardStrategy = "auto",
    ) -> None:
        super().__init__(model, eval_mode=eval_mode, backward=backward)
        if isinstance(token, Tensor):
            if token.dim() != 2 or token.is_floating_point() or token.is_complex() or token.dtype == torch.bool:
                raise TypeError(
                    f"token as a tensor must be an (N, K) integer tensor of rows (one per input and target), got "
                    f"{token.dtype} of shape {tuple(token.shape)}"
                )
        elif token is not None and (not isinstance(token, int) or isinstance(token, bool)):
            raise TypeError(
                f"token must be None (the class token), an int (a token's index) or an (N, K) tensor, got {token!r}"
            )
        if not attention_modules(model):
            raise ValueError(
                f"no attention found in {type(model).__name__}: {type(self).__name__} rolls out the attention "
                "probabilities of self-attention layers, and the model has no nn.MultiheadAttention and no module "
                "whose class name contains 'Attention'; use a gradient method (Saliency, GradCAM) for this model"
            )
        self.token = token
        self.layers: list[str] = []  # the attention calls rolled out on the last call: "module (source)"

    def _allows_integer_inputs(self) -> bool:
        return True  # token ids (N, T): the attention is read, nothing is differentiated w.r.t. the input

    def attribute(  # type: ignore[override]
        self,
        inputs: Tensor,
        target: TargetSpec = None,
        *,
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
    ) -> Tensor:
        """Images (N, C, H, W) give (N, 1, h, w) maps over the patch grid; token ids (N, T) give (N, T) scores; with
        an (N, K) `target` a K axis follows N. `forward_kwargs` (e.g. ``{"attention_mask": mask}``) go to
        ``forward``."""
        return super().attribute(
            inputs, target, additional_forward_args=additional_forward_args, forward_kwargs=forward_kwargs
        )  # type: ignore[return-value]

    def _rollout(self, captured: list[Captured], targets: Targets) -> Tensor:
        """(N, K, T, T) rollout matrices from the captured attention calls (in call order)."""
        raise NotImplementedError

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        fwd: ForwardArgs = kwargs.get("forward_args") or ForwardArgs((), x.shape[0])
        capture = AttentionCapture(self.model, hooks)
        capture.batch = x.shape[0]
        capture.place_hooks()
        with capture.forward_pass():
            output = fwd(self.model, (x.detach(),))
        targets = resolve_targets(target, output, x.shape[0])
        captured = self._checked(capture.captured, x.shape[0])
        self.layers = [f"{c.module} ({c.source})" for c in captured]
        return self._read_out(self._rollout(captured, targets), x), targets

    def _checked(self, captured: list[Captured], n: int) -> list[Captured]:
        if not captured:
            raise ValueError(
                f"no attention found in the forward pass of {type(self.model).__name__}: its attention modules did "
                "not run (or ran no attention call); check that the inputs reach the transformer"
            )
        t = captured[0].probs.shape[-1]
        for c in captured:
            shape = tuple(c.probs.shape)
            if shape[0] != n or shape[-2] != shape[-1] or shape[-1] != t:
                raise ValueError(
                    f"{type(self).__name__} multiplies (T, T) self-attention matrices over the layers, but the "
                    f"attention in {c.module!r} ({c.source}) has probabilities of shape {shape} while the first has "
                    f"{tuple(captured[0].probs.shape)} (expected (N={n}, H, {t}, {t}) everywhere): cross-attention, "
                    "pooling attention and token-merging models cannot be rolled out"
                )
        return captured

    def _read_out(self, rollout: Tensor, x: Tensor) -> Tensor:
        """(N, K, 1, h, w) for images, (N, K, T) for tokens, from (N, K, T, T)."""
        n, k, t, _ = rollout.shape
        if isinstance(self.token, Tensor):
            rows = self.token.to(rollout.device).long()
            if x.dim() == 4 or tuple(rows.shape) != (n, k) or bool(((rows < -t) | (rows >= t)).any()):
                raise ValueError(
                    f"token as a tensor must give, for token ids, one row in -{t}..{t - 1} per input and target, "
                    f"(N, K) = ({n}, {k}); got shape {tuple(rows.shape)} for inputs of shape {tuple(x.shape)}"
                )
            rows = rows % t
            return rollout.gather(2, rows[:, :, None, None].expand(-1, -1, 1, t)).squeeze(2).contiguous()
        if self.token is not None and not -t <= self.token < t:
            raise ValueError(f"token={self.token} is out of range for {t} tokens (valid: {-t}..{t - 1})")
        # results are contiguous copies: AttentionRollout's K targets share one matrix (an expanded view)
        if x.dim() != 4:
            return rollout[:, :, 0 if self.token is None else self.token].contiguous()
        layout = resolve_layout(
            "the attention's tokens", rollout[:, 0, :, :1], input_size=tuple(x.shape[-2:]), model=self.model
        )
        if self.token is not None:
            row = rollout[:, :, self.token]
        elif layout.prefix > 0:
            row = rollout[:, :, 0]
        else:
            row = rollout.mean(dim=2)
        return layout(row.flatten(0, 1).unsqueeze(-1)).unflatten(0, (n, k)).contiguous()


def fusion_dtype(probs: Tensor) -> torch.dtype:
    """Rollouts are computed in float32 at least (float64 attention stays float64)."""
    return torch.float64 if probs.dtype == torch.float64 else torch.float32
