"""A callable target sees the user's rows (issue 27, point 2): methods that run the model on many rows per input (path
points, noisy copies, occluded windows, RISE masks, SHAP draws, DeepLift's baselines, Score-CAM's masks, the
deletion curve's steps) call it on outputs of N rows, row i belonging to input i, so a callable that indexes a
per-input tensor of shape (N,) works and gives the same map as the equivalent class target.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cheap import ON_CNNS, cheap_method
from torch import nn

import hookviz as hv
from hookviz.targets import TargetPlan, aligned_scores


class TinyCNN(nn.Module):
    """conv -> relu -> conv -> relu ("act") -> 2x2 pool -> linear (5 classes); 8 x 8 inputs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(6, 6, 3, stride=2, padding=1)
        self.act = nn.ReLU()
        self.fc = nn.Linear(6 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.act(self.conv2(self.relu1(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(a, 2).flatten(1))


class DictOut(TinyCNN):
    """The same network returning a dict (like a Hugging Face output) with a per-row extra tensor and a scalar."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        logits = super().forward(x)
        return {"logits": logits, "features": logits * 2, "aux": logits.sum()}


# methods whose class targets score the softmax probability (perturbations); their callable scores it as it is
SOFTMAX_SCORED = {"rise", "scorecam"}


def _callable_for(name: str, cls: torch.Tensor):
    """A callable that indexes the per-input tensor `cls` (N,): it only works on outputs of exactly N rows."""
    if name in SOFTMAX_SCORED:
        return lambda out: out.softmax(1)[torch.arange(cls.shape[0]), cls]
    return lambda out: out[torch.arange(cls.shape[0]), cls]


def _options(name: str, n: int) -> dict:
    # a batch size that cuts the expanded batch mid-block (3 rows, N = 2) where the method takes one
    if name in ("integrated-gradients", "smoothgrad", "vargrad", "occlusion", "rise"):
        return {"batch_size": 3} if n > 1 else {}
    if name == "scorecam":
        return {"batch_size": 4}
    return {}


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("name", ON_CNNS)
def test_callable_over_per_input_tensor_equals_class_target(name: str, n: int) -> None:
    """On today's main, IntegratedGradients fails here with "a callable target must return ... with N = 4"."""
    model = TinyCNN().eval()
    x = torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    cls = torch.tensor([3, 1])[:n]
    if name == "feature-permutation" and n == 1:  # it shuffles groups across the batch: one input is refused
        with pytest.raises(ValueError, match="N >= 2"):
            cheap_method(name, model).attribute(x, target=cls)
        return
    by_class = cheap_method(name, model, **_options(name, n)).attribute(x, target=cls)
    by_fn = cheap_method(name, model, **_options(name, n)).attribute(x, target=_callable_for(name, cls))
    assert by_class.shape == by_fn.shape
    assert by_class.abs().sum() > 0
    # the same float32 operations on the same rows: the callable's blocks are stacked and gathered back into row
    # order (index ops route the gradient, they do not round it); softmax-scored methods compute the softmax in
    # float32 here and in the accumulation dtype there, hence the float32-rounding tolerance
    torch.testing.assert_close(by_fn, by_class, rtol=1e-5, atol=1e-6)


def test_smoothgrad_over_integrated_gradients_nests_the_rows() -> None:
    """SmoothGrad's noisy copies, then IG's path points inside them: the callable still sees the N inputs."""
    model = TinyCNN().eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    cls = torch.tensor([4, 0])

    def build() -> hv.SmoothGrad:
        ig = hv.IntegratedGradients(model, steps=3, batch_size=5)
        return hv.SmoothGrad(ig, n=3, batch_size=5, generator=torch.Generator().manual_seed(0))

    with pytest.warns(UserWarning, match="IntegratedGradients"):  # 3 steps do not reach 1% completeness
        by_class = build().attribute(x, target=cls)
    with pytest.warns(UserWarning, match="IntegratedGradients"):
        by_fn = build().attribute(x, target=lambda out: out[torch.arange(2), cls])
    torch.testing.assert_close(by_fn, by_class, rtol=1e-5, atol=1e-6)  # float32 rounding, as above


def test_k_targets_from_a_callable_keep_the_k_axis() -> None:
    """An (N, K) callable over per-input indices (N, K) on IntegratedGradients equals the (N, K) index target."""
    model = TinyCNN().eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    idx = torch.tensor([[0, 2], [4, 1]])
    ig = hv.IntegratedGradients(model, steps=8, batch_size=5)
    by_class = ig.attribute(x, target=idx)
    by_fn = ig.attribute(x, target=lambda out: out.gather(1, idx))
    assert by_fn.shape == (2, 2, 3, 8, 8)
    torch.testing.assert_close(by_fn, by_class, rtol=1e-5, atol=1e-6)  # float32 rounding, as above


def test_dict_output_is_cut_field_by_field() -> None:
    """The callable gets the model's own output type, each per-row field cut to the block, other values whole."""
    model = DictOut().eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    cls = torch.tensor([2, 3])
    seen = []

    def fn(out: dict) -> torch.Tensor:
        seen.append((type(out), out["logits"].shape[0], out["features"].shape[0], out["aux"].dim()))
        return out["features"][torch.arange(2), cls] / 2

    got = hv.IntegratedGradients(model, steps=4).attribute(x, target=fn)
    want = hv.IntegratedGradients(TinyCNN().eval(), steps=4).attribute(x, target=cls)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # float32 rounding: x2 then /2 is exact, the sum not
    assert set(seen) == {(dict, 2, 2, 0)}


def test_blocks_of_an_input_major_batch_and_a_partial_chunk() -> None:
    """`aligned_scores` on rows laid out input by input (Score-CAM, SHAP draws) and on a chunk that covers a block in
    part: every call sees N rows in input order, and each row gets the score of its own input."""
    calls = []

    def fn(out: torch.Tensor) -> torch.Tensor:
        calls.append(out[:, 0].tolist())
        return out[:, 0] * 10 + out[:, 1]

    # rows: input of each row; column 0 of the output names the input, column 1 the row
    rows = torch.tensor([1, 1, 2, 0, 0, 2, 1])
    out = torch.stack([rows.float(), torch.arange(7.0)], dim=1).requires_grad_(True)
    t = aligned_scores(TargetPlan(None, fn, False, rows, 3), out, 7)
    assert t.scores[:, 0].tolist() == [10 * r + j for j, r in enumerate(rows.tolist())]
    # 3 blocks: the k-th row of each input; a slot without a row is filled with row 0 (input 1), its score dropped
    assert calls == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [1.0, 1.0, 1.0]]


def test_deletion_curve_callable_sees_the_images() -> None:
    model = TinyCNN().eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(6))
    a = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(7))
    cls = torch.tensor([1, 4])
    by_class = hv.deletion(model, x, a, cls, steps=4, batch_size=3, return_curves=True)[1]
    fn = lambda out: out.softmax(1)[torch.arange(2), cls]  # noqa: E731
    by_fn = hv.deletion(model, x, a, fn, steps=4, batch_size=3, return_curves=True)[1]
    torch.testing.assert_close(by_fn, by_class, rtol=0, atol=0)  # the same softmax on the same rows


def test_callable_shape_error_says_the_rows_are_the_inputs() -> None:
    out = torch.randn(8, 5, requires_grad=True)  # 4 rows per input for N = 2
    plan = TargetPlan(None, lambda o: o.sum(), False, torch.arange(8) % 2, 2)
    with pytest.raises(ValueError, match=r"with N = 2 \(one score per input \(the method runs the model on 4 rows per"):
        aligned_scores(plan, out, 8)


def test_deeplift_shap_pairs_each_input_with_every_baseline() -> None:
    """DeepLiftShap runs N x B (input, baseline) pairs, input by input: the callable sees one row per input."""
    model = TinyCNN().eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(8))
    baselines = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(9))
    cls = torch.tensor([0, 2])
    by_class = hv.DeepLiftShap(model, baselines=baselines).attribute(x, target=cls)
    by_fn = hv.DeepLiftShap(model, baselines=baselines).attribute(x, target=lambda out: out[torch.arange(2), cls])
    torch.testing.assert_close(by_fn, by_class, rtol=1e-5, atol=1e-6)  # float32 rounding, as above


def test_integrated_gradients_at_a_layer_sees_the_inputs_rows() -> None:
    """Layer IG replaces the layer's output by path points, row by row: the callable still sees the N inputs."""
    model = TinyCNN().eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(10))
    cls = torch.tensor([1, 3])
    by_class = hv.IntegratedGradients(model, steps=6, layer="conv2", batch_size=5).attribute(x, target=cls)
    by_fn = hv.IntegratedGradients(model, steps=6, layer="conv2", batch_size=5).attribute(
        x, target=lambda out: out[torch.arange(2), cls]
    )
    assert by_fn.shape == (2, 6, 4, 4)
    torch.testing.assert_close(by_fn, by_class, rtol=1e-5, atol=1e-6)  # float32 rounding, as above
