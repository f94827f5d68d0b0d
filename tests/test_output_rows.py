"""The output layer's backward pass over the rows and columns its gradient reaches
(`hookviz.methods.lrp.output_rows`): equal to the plain ``g W`` for every pattern of zeros, and the LRP maps of a
language model equal to those without it.

Tolerances: one non-zero column makes each sum a single product, the same float as the full product's (compared
exactly); with several non-zero columns the sums run in another order (float64: 1e-12 of the largest value)."""

from __future__ import annotations

import pytest
import torch
from lrp_relevance_form import relevance_form_lrp
from test_attnlrp import _LAST, _family
from torch import nn

import hookviz as hv
import hookviz.methods.lrp.gradient_form as gradient_form
from hookviz.methods.lrp import composite as composite_of
from hookviz.methods.lrp.output_rows import output_layer, rows_reached


def _layer(h=6, v=40, dtype=torch.float64) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(h, v, bias=True).to(dtype)


def _grads(layer: nn.Linear, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(through rows_reached, through the plain linear) for the upstream gradient `g`."""
    h = torch.randn(*g.shape[:-1], layer.in_features, dtype=g.dtype, requires_grad=True)
    y = layer(h)
    (got,) = torch.autograd.grad(rows_reached(h, layer, y), h, g)
    (want,) = torch.autograd.grad(layer(h), h, g)
    return got, want


def _sparse(shape, cells, dtype=torch.float64) -> torch.Tensor:
    g = torch.zeros(shape, dtype=dtype)
    for i, v in enumerate(cells):
        g[v] = 0.5 + i
    return g


def test_one_row_one_column_is_exact() -> None:
    layer = _layer()
    got, want = _grads(layer, _sparse((2, 7, 40), [(1, 6, 3)]))
    assert torch.equal(got, want)
    assert got[1, 6].abs().sum() > 0 and got[0].abs().sum() == 0


@pytest.mark.parametrize(
    "cells",
    [
        [(0, 6, 3), (1, 6, 3)],  # the last position of two samples
        [(0, 6, 3), (0, 6, 9), (0, 6, 39)],  # several tokens of one position
        [(0, 0, 0), (0, 3, 20), (1, 6, 39)],
    ],
)
def test_several_rows_and_columns(cells) -> None:
    got, want = _grads(_layer(), _sparse((2, 7, 40), cells))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * float(want.abs().max()))


def test_dense_and_zero_gradients() -> None:
    layer = _layer()
    g = torch.randn(2, 7, 40, dtype=torch.float64)
    got, want = _grads(layer, g)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * float(want.abs().max()))
    got, want = _grads(layer, g.masked_fill(torch.rand(2, 7, 40) < 0.6, 0.0))  # dense columns on few rows
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * float(want.abs().max()))
    got, want = _grads(layer, torch.zeros(2, 7, 40, dtype=torch.float64))
    assert torch.equal(got, want) and not got.any()


def test_one_position_one_token() -> None:
    # one row (a batch of one position): only the columns can be skipped
    got, want = _grads(_layer(), _sparse((1, 1, 40), [(0, 0, 7)]))
    assert torch.equal(got, want)
    got, want = _grads(_layer(), _sparse((3, 1, 40), [(0, 0, 7), (1, 0, 8), (2, 0, 30)]))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * float(want.abs().max()))


def test_a_nan_in_the_gradient_is_not_skipped() -> None:
    layer = _layer()
    g = _sparse((2, 7, 40), [(0, 6, 3)])
    g[1, 2, 5] = float("nan")
    got, want = _grads(layer, g)
    assert torch.equal(got.isnan(), want.isnan()) and got[1, 2].isnan().all()
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)


def test_the_declared_output_embeddings_only() -> None:
    model, _, _ = _family("llama-sdpa")
    assert output_layer(model) is model.lm_head
    assert output_layer(nn.Sequential(nn.Linear(3, 4))) is None  # nothing declared: no layer guessed


@pytest.mark.parametrize("family", ["llama-sdpa", "gpt2-sdpa"])
@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
def test_lrp_maps_equal_those_without_it(family: str, composite: str, monkeypatch) -> None:
    model, ids, kw = _family(family)
    model = model.double()
    comp = composite_of(composite, epsilon=0.0, stabilizer=0.0)
    target = _LAST[family.split("-")[0]]
    used = []
    real = gradient_form.rows_reached
    monkeypatch.setattr(gradient_form, "rows_reached", lambda *a: used.append(1) or real(*a))
    got = hv.LRP(model, comp, **kw).attribute(ids, target=target)
    assert used, "the output layer's rule did not run"
    monkeypatch.setattr(gradient_form, "output_layer", lambda model: None)
    want = hv.LRP(model, comp, **kw).attribute(ids, target=target)
    # one non-zero column per sample (one token at the last position): each sum is one product, as in the full one
    assert torch.equal(got, want)


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
def test_the_relevance_form_takes_the_same_product(composite: str, monkeypatch) -> None:
    """Default stabilizers (the relevance form, each rule its own Function): the output layer's epsilon rule takes
    its product over the reached rows and columns; the map equals the one without."""
    import lrp_relevance_form.propagate as propagate

    import hookviz.methods.lrp.output_rows as output_rows

    model, ids, kw = _family("llama-sdpa")
    model = model.double()
    used = []
    real = output_rows.product
    monkeypatch.setattr(output_rows, "product", lambda *a: used.append(1) or real(*a))
    # the relevance form (tests/lrp_relevance_form/), each rule its own Function
    got, _ = relevance_form_lrp(model, composite, ids, _LAST["llama"], **kw)
    assert used, "the output layer's product did not run"
    monkeypatch.setattr(propagate, "output_layer", lambda model: None)
    want, _ = relevance_form_lrp(model, composite, ids, _LAST["llama"], **kw)
    assert torch.equal(got, want)
