"""Shared by training and evaluation: batches of data -> the model's inputs, a layer's output -> activation rows
(M, d), and a forward that stops once the layer has run."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from .._device import to_device
from ..interventions.intervene import first_tensor as first_tensor  # re-exported: one definition, interventions'
from ..interventions.intervene import rebuild as rebuild

Select = Callable[[Tensor], Tensor]


class _Stop(Exception):
    """Raised by the capture hook once the layer has run: the rest of the forward is not needed."""


def model_device(model: nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def model_inputs(batch: Any, device: torch.device) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) for ``model(*args, **kwargs)`` from one batch: a tensor (``model(x)``), a tuple / list whose
    first element is the input (a DataLoader's ``(images, labels)``), or a dict of keyword arguments (a tokenizer's
    ``input_ids`` / ``attention_mask``)."""
    if isinstance(batch, Tensor):
        return (to_device(batch, device),), {}
    if isinstance(batch, tuple | list) and batch and isinstance(batch[0], Tensor):
        return (to_device(batch[0], device),), {}
    if isinstance(batch, dict):
        return (), {k: to_device(v, device) if isinstance(v, Tensor) else v for k, v in batch.items()}
    raise TypeError(
        "each batch of data must be a tensor, a tuple / list whose first element is the input tensor, or a dict of "
        f"keyword arguments for the model; got {type(batch).__name__}"
    )


def rows_of(activation: Tensor, select: Select | None, mask: Tensor | None, layer: str) -> Tensor:
    """The activation rows (M, d) of one batch at `layer`: (N, d) as it is, tokens (N, T, D) -> (N*T, D) (only the
    positions where `mask`, an attention mask (N, T), is 1), channels of a CNN layer (N, C, H, W) -> (N*H*W, C). A
    `select` function replaces this rule (e.g. a ViT's patch tokens without its class token:
    ``lambda a: a[:, 1:].reshape(-1, a.shape[-1])``)."""
    if select is not None:
        rows = select(activation)
        if not isinstance(rows, Tensor) or rows.dim() != 2:
            raise ValueError(f"select must return activation rows (M, d), got {getattr(rows, 'shape', rows)!r}")
        return rows
    if activation.dim() == 2:
        return activation
    if activation.dim() == 3:
        if mask is not None and mask.shape == activation.shape[:2]:
            return activation[mask.bool()]
        return activation.reshape(-1, activation.shape[-1])
    if activation.dim() == 4:
        return activation.permute(0, 2, 3, 1).reshape(-1, activation.shape[1])
    raise ValueError(
        f"the output of {layer!r} has shape {tuple(activation.shape)}: pass select=<function of the output -> rows "
        "(M, d)> to say which axis holds the features"
    )


def batches(data: Any, batch_size: int) -> Iterator[Any]:
    """Batches of `data` for one pass: a tensor (N, ...) split along its first axis, any other iterable as it is."""
    if isinstance(data, Tensor):
        yield from data.split(batch_size)
    elif isinstance(data, Iterable):
        yield from data
    else:
        raise TypeError(f"data must be a tensor (N, ...) or an iterable of batches, got {type(data).__name__}")
