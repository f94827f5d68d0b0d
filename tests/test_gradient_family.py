"""InputXGradient, SmoothGrad, IntegratedGradients: hand-computed values, float64 references, captum, invariants."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from refs import reference
from torch import nn
from torchvision import models

from hookviz.methods.base import get_method
from hookviz.methods.gradient import InputXGradient, IntegratedGradients, Saliency, ig_nodes
from hookviz.methods.guided import GuidedBackprop
from hookviz.methods.noise import SmoothGrad

captum_attr = reference("captum.attr")  # only the captum comparisons depend on it

from reference import gradient as ref  # noqa: E402
from reference import same_precision as same  # noqa: E402
from test_hooks import SeedNet, no_hooks  # noqa: E402
from test_invariants import assert_same, mid_training_resnet, snapshot  # noqa: E402

IG_METHODS = ["riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre"]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12)).item()


def resnet(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return models.resnet18(weights=None, num_classes=10).eval()  # in-place ReLUs, one module used twice per block


def images(n: int = 2, size: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def signed_seed_net() -> SeedNet:
    model = SeedNet()
    with torch.no_grad():
        model.fc2.weight.copy_(torch.tensor([[1.0, -2, -3, 4]]))
    return model


def linear_net() -> nn.Linear:
    model = nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2, 3], [0.5, 0, -1]]))
        model.bias.copy_(torch.tensor([0.25, -1.0]))
    return model


def small_cnn(seed: int = 0) -> nn.Module:
    """Few ReLU units and no max pool: float rounding differences between batch sizes do not flip a ReLU."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(32, 10),
    ).eval()


def tanh_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))


@contextmanager
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# -- hand-computed values --------------------------------------------------------------------------------------------
def test_input_x_gradient_hand_computed() -> None:
    # x = [1, 2, -1]: fc1 pre-activation [3, -6, 17, -16], relu mask [1, 0, 1, 0]; head [1, -2, -3, 4]
    # gradient = W1^T [1, 0, -3, 0] = [-20, -22, -24]; times x -> [-20, -44, 24]
    attr = InputXGradient(signed_seed_net()).attribute(torch.tensor([[1.0, 2, -1]]), target=0)
    assert torch.equal(attr, torch.tensor([[-20.0, -44, 24]]))


@pytest.mark.parametrize("method", IG_METHODS)
def test_integrated_gradients_linear_is_exact(method: str) -> None:
    # for y = w^T x + b the gradient is w everywhere: IG = (x - baseline) * w, whatever the rule (weights sum to 1)
    x = torch.tensor([[1.0, 2, 3], [-1, 0, 4]])
    ig = IntegratedGradients(linear_net(), steps=7, baseline=0.5, method=method)
    with no_warnings():
        attr = ig.attribute(x, target=[0, 1])
    w = torch.tensor([[1.0, -2, 3], [0.5, 0, -1]])
    torch.testing.assert_close(attr, (x - 0.5) * w, rtol=1e-6, atol=1e-6)
    assert ig.last_delta.shape == (2, 1) and ig.last_delta.abs().max() < 1e-5


def test_integrated_gradients_trapezoid_weights_sum_to_one() -> None:
    # the trapezoid rule on linspace(0, 1, m): weights 1/(m - 1), halved at both ends
    alphas, weights = ig_nodes("riemann_trapezoid", 10)
    assert alphas[0] == 0 and alphas[-1] == 1 and abs(sum(weights) - 1) < 1e-12
    assert weights[0] == weights[-1] == 0.5 / 9 and weights[1] == 1 / 9


def test_integrated_gradients_relu_net_hand_computed() -> None:
    # seed net, baseline 0, x = 1: pre-activations along the path are alpha [6, -15, 24, -33] + [1, 2, 3, 4], so
    # units 2 and 4 are on for alpha < 2/15 and alpha < 4/33. The integral of the gradient is
    # W1^T ([1, -2, -3, 4] * [1, 2/15, 1, 4/33]); the midpoint rule with 165 = lcm(15, 33) steps is exact here.
    model = signed_seed_net()
    ig = IntegratedGradients(model, steps=165, method="riemann_middle")
    with no_warnings():
        attr = ig.attribute(torch.ones(1, 3), target=0)
    w1 = model.fc1.weight.detach().double()
    expected = w1.T @ torch.tensor([1.0, -2 * 2 / 15, -3, 4 * 4 / 33], dtype=torch.float64)
    torch.testing.assert_close(attr[0].double(), expected, rtol=1e-6, atol=1e-5)
    # completeness: f(1) - f(0) = (1*7 - 3*27 + 1) - (1*1 - 2*2 - 3*3 + 4*4 + 1) = -73 - 5 = -78
    torch.testing.assert_close(attr.sum(), torch.tensor(-78.0), rtol=1e-6, atol=1e-4)


def test_smoothgrad_of_linear_saliency_is_exact() -> None:
    # the gradient of a linear model is the same at every noisy copy
    x = torch.tensor([[1.0, 2, 3], [-1, 0, 4]])
    sg = SmoothGrad(Saliency(linear_net()), n=5, sigma=0.5, generator=gen())
    w = torch.tensor([[1.0, -2, 3], [0.5, 0, -1]])
    torch.testing.assert_close(sg.attribute(x, target=[0, 1]), w, rtol=0, atol=1e-6)
    sq = SmoothGrad(linear_net(), n=3, squared=True, generator=gen())  # a bare model means Saliency
    torch.testing.assert_close(sq.attribute(x, target=[0, 1]), w * w, rtol=0, atol=1e-6)


def test_smoothgrad_noise_is_documented_draw() -> None:
    # input x gradient of a linear model: mean over copies of (x + noise) * w, with the noise as documented
    x = torch.tensor([[1.0, 2, 3], [-1, 0, 4]])
    n, sigma = 4, 0.3
    got = SmoothGrad(InputXGradient(linear_net()), n=n, sigma=sigma, generator=gen(5)).attribute(x, target=0)
    g = gen(5)
    scale = sigma * (x.amax(1, keepdim=True) - x.amin(1, keepdim=True))  # ranges 2 and 5
    mean_copy = sum(x + scale * torch.randn(x.shape, generator=g, dtype=x.dtype) for _ in range(n)) / n
    torch.testing.assert_close(got, mean_copy * torch.tensor([1.0, -2, 3]), rtol=1e-6, atol=1e-6)


def test_smoothgrad_sigma_zero_is_the_method() -> None:
    model = resnet()
    x = images()
    for method in (Saliency(model), GuidedBackprop(model), InputXGradient(model)):
        smooth = SmoothGrad(method, n=2, sigma=0.0).attribute(x, target=[3, 4])
        torch.testing.assert_close(smooth, method.attribute(x, target=[3, 4]), rtol=1e-6, atol=1e-7)


# -- float64 references ----------------------------------------------------------------------------------------------
def test_input_x_gradient_matches_reference() -> None:
    model = resnet()
    x = images()
    targets = torch.tensor([[3, 8], [0, 0]])
    expected = ref.per_input(ref.double_copy(model), x, targets, ref.input_x_gradient)
    assert rel_l2(InputXGradient(model).attribute(x, target=targets), expected) < 1e-4
    # in float64 the agreement is to float64 rounding
    got64 = InputXGradient(ref.double_copy(model)).attribute(x.double(), target=targets)
    assert got64.dtype == torch.float64 and rel_l2(got64, expected) < 1e-10


@pytest.mark.parametrize(
    ("name", "build", "attr_fn", "copy", "squared"),
    [
        ("saliency", Saliency, ref.gradient, ref.double_copy, False),
        ("guided", GuidedBackprop, ref.gradient, ref.guided_copy, False),
        ("input-x-gradient-squared", InputXGradient, ref.input_x_gradient, ref.double_copy, True),
    ],
)
def test_smoothgrad_matches_reference(name, build, attr_fn, copy, squared) -> None:
    model = resnet()
    x = images()
    targets = torch.tensor([[3], [7]])
    got = SmoothGrad(build(model), n=3, sigma=0.2, squared=squared, batch_size=4, generator=gen(11)).attribute(
        x, target=targets[:, 0]
    )
    expected = ref.smoothgrad(copy(model), x, targets, attr_fn, n=3, sigma=0.2, seed=11, squared=squared)[:, 0]
    assert rel_l2(got, expected) < 1e-4
    plain = build(model).attribute(x, target=targets[:, 0])
    assert rel_l2(got, plain * plain if squared else plain) > 1e-2  # the noise mattered


def test_smoothgrad_top_class_is_clean_input_top_class() -> None:
    model = resnet()
    x = images()
    got = SmoothGrad(model, n=2, sigma=0.5, generator=gen(2)).attribute(x)
    top = ref.top_class(ref.double_copy(model), x)
    expected = ref.smoothgrad(ref.double_copy(model), x, top, ref.gradient, n=2, sigma=0.5, seed=2)[:, 0]
    assert rel_l2(got, expected) < 1e-4


@pytest.mark.parametrize("method", IG_METHODS)
def test_integrated_gradients_matches_reference(method: str) -> None:
    model = resnet()
    x = images()
    baseline = 0.1 * images(n=1, seed=3)
    targets = torch.tensor([[2, 5], [9, 1]])
    ig = IntegratedGradients(model, steps=6, baseline=baseline, method=method, batch_size=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 6 steps are too few for completeness, on purpose: the rule is compared
        got = ig.attribute(x, target=targets)
    expected = ref.integrated_gradients(ref.double_copy(model), x, targets, baseline, steps=6, method=method)
    assert got.shape == (2, 2, 3, 32, 32)
    assert rel_l2(got, expected) < 1e-4


def test_gauss_legendre_nodes_match_golub_welsch() -> None:
    for m in (1, 2, 7, 50):
        alphas, weights = ig_nodes("gausslegendre", m)
        ref_alphas, ref_weights = ref.gauss_legendre(m)
        torch.testing.assert_close(torch.tensor(alphas), torch.tensor(ref_alphas), rtol=0, atol=1e-12)
        torch.testing.assert_close(torch.tensor(weights), torch.tensor(ref_weights), rtol=0, atol=1e-12)


# -- captum ------------------------------------------------------------------------------------------------------------
def test_input_x_gradient_matches_captum() -> None:
    model = resnet()
    x = images()
    ours = InputXGradient(model).attribute(x, target=[4, 6])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # captum warns that it set requires_grad on the input
        theirs = captum_attr.InputXGradient(model).attribute(x.clone(), target=[4, 6])
    assert ours.shape == x.shape and rel_l2(ours, theirs) < 1e-4


@pytest.mark.parametrize("method", IG_METHODS)
def test_integrated_gradients_matches_captum(method: str) -> None:
    model = resnet()
    x = images()
    baseline = torch.full_like(x, -0.5)
    ig = IntegratedGradients(model, steps=12, baseline=baseline, method=method)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = ig.attribute(x, target=[1, 7])
        theirs, delta = captum_attr.IntegratedGradients(model).attribute(
            x.clone(), baselines=baseline, target=[1, 7], n_steps=12, method=method, return_convergence_delta=True
        )
    if method == "riemann_trapezoid":
        # captum's trapezoid weights are 1/m halved at the ends (they sum to (m - 1) / m): the same nodes, every
        # weight (m - 1) / m of ours. Ours integrate exactly on a linear path; captum's do not.
        assert rel_l2(ours * 11 / 12, theirs) < 1e-4
        return
    assert rel_l2(ours, theirs) < 1e-4
    torch.testing.assert_close(ig.last_delta[:, 0], delta.float(), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("squared", [False, True])
def test_smoothgrad_agrees_with_captum_noise_tunnel_in_the_mean(squared: bool) -> None:
    # random noise on both sides: our estimate should be as close to captum's as to another of ours
    model = resnet()
    x = images(n=1)
    sigma, n = 0.15, 64
    stdev = sigma * float(x.max() - x.min())  # one input: one absolute noise level for captum
    a = SmoothGrad(Saliency(model), n=n, sigma=sigma, squared=squared, generator=gen(0)).attribute(x, target=3)
    b = SmoothGrad(Saliency(model), n=n, sigma=sigma, squared=squared, generator=gen(1)).attribute(x, target=3)
    torch.manual_seed(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tunnel = captum_attr.NoiseTunnel(captum_attr.Saliency(model))
        theirs = tunnel.attribute(
            x.clone(),
            nt_type="smoothgrad_sq" if squared else "smoothgrad",
            nt_samples=n,
            stdevs=stdev,
            target=3,
            abs=False,
        )
    # two independent estimates of the same mean are as far from each other as from captum's (ratio ~1.0); with
    # captum's noise twice or half as large the ratio is 1.5 to 2 (1.1 to 1.5 squared)
    spread = rel_l2(a, b)
    assert 0 < spread < 1
    assert rel_l2(a, theirs) < 1.25 * spread


# -- completeness ------------------------------------------------------------------------------------------------------
def test_integrated_gradients_completeness_on_resnet() -> None:
    model = resnet()
    x = images(n=3)
    ig = IntegratedGradients(model, steps=64, batch_size=64)
    with no_warnings():
        attr = ig.attribute(x, target=[0, 4, 9])
    with torch.no_grad():
        out_x, out_0 = model(x), model(torch.zeros_like(x))
    expected = (out_x - out_0)[torch.arange(3), [0, 4, 9]]
    sums = attr.flatten(1).sum(1)
    assert ((sums - expected).abs() <= 0.01 * expected.abs()).all()
    torch.testing.assert_close(ig.last_delta[:, 0], sums - expected, rtol=1e-3, atol=1e-5)


def test_integrated_gradients_warns_with_too_few_steps() -> None:
    model = tanh_net()
    x = 3 * torch.randn(4, 4, generator=gen(0))
    ig = IntegratedGradients(model, steps=2, method="gausslegendre")
    with pytest.warns(UserWarning, match=r"attributions of input \d, target column \d sum .* steps \(now 2") as record:
        attr = ig.attribute(x, target=torch.tensor([[0, 2]] * 4))
    with torch.no_grad():
        expected = (model(x) - model(torch.zeros_like(x)))[:, [0, 2]]
    delta = attr.sum(-1) - expected
    torch.testing.assert_close(ig.last_delta, delta, rtol=1e-4, atol=1e-6)
    rel = delta.abs() / expected.abs()
    worst_i, worst_k = divmod(int(rel.argmax()), 2)
    assert f"input {worst_i}, target column {worst_k} sum" in str(record[0].message)
    # and enough steps make it quiet
    with no_warnings():
        IntegratedGradients(model, steps=32).attribute(x, target=torch.tensor([[0, 2]] * 4))


# -- targets, chunking, autocast, no_grad ------------------------------------------------------------------------------
def builders() -> list:
    return [
        ("input-x-gradient", lambda m, bs=None: InputXGradient(m)),
        ("smoothgrad-guided", lambda m, bs=None: SmoothGrad(GuidedBackprop(m), n=3, batch_size=bs, generator=gen())),
        ("integrated-gradients", lambda m, bs=None: IntegratedGradients(m, steps=5, batch_size=bs)),
    ]


def quiet(method, x, target):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # IG completeness with few steps
        return method.attribute(x, target=target)


@pytest.mark.parametrize(("name", "build"), builders())
@pytest.mark.parametrize("strategy", ["vmap", "loop"])
def test_nk_targets_equal_k_separate_calls(name, build, strategy) -> None:
    model = resnet()
    x = images()
    targets = torch.tensor([[1, 5, 9], [2, 2, 0]])

    def make():
        method = build(model)
        (method.method if isinstance(method, SmoothGrad) else method).backward = strategy
        return method

    multi = quiet(make(), x, targets)
    assert multi.shape == (2, 3, 3, 32, 32)
    for k in range(3):
        single = quiet(make(), x, targets[:, k])
        torch.testing.assert_close(multi[:, k], single, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("name", "build"), builders())
def test_callable_targets(name, build) -> None:
    model = resnet()
    x = images()
    by_int = quiet(build(model), x, 7)
    by_fn = quiet(build(model), x, lambda out: out[:, 7])
    torch.testing.assert_close(by_fn, by_int, rtol=0, atol=0)
    multi = quiet(build(model), x, lambda out: out[:, [7, 2]])
    assert multi.shape == (2, 2, 3, 32, 32)
    torch.testing.assert_close(multi[:, 0], by_int, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("name", "build"), builders()[1:])
@pytest.mark.parametrize("batch_size", [1, 4, 5])
def test_batch_size_chunks_give_the_same_result(name, build, batch_size) -> None:
    # not resnet18: its ~10^5 ReLU units and max pool near-ties make a batch-size-dependent rounding flip a mask
    model = small_cnn()
    x = images(n=3, size=8)
    whole = quiet(build(model), x, [1, 2, 3])
    chunked = quiet(build(model, batch_size), x, [1, 2, 3])
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)
    top = quiet(build(model, batch_size), x, None)  # top class of the clean input, resolved once
    torch.testing.assert_close(top, quiet(build(model), x, model(x).argmax(1)), rtol=1e-5, atol=1e-6)


def test_chunks_run_at_most_batch_size_rows() -> None:
    model = resnet()
    rows: list[int] = []
    handle = model.conv1.register_forward_pre_hook(lambda m, args: rows.append(args[0].shape[0]))
    try:
        quiet(IntegratedGradients(model, steps=5, batch_size=4), images(n=3), 0)
        assert max(rows) <= 4 and sum(rows) == 3 * 5 + 2 * 3  # path points, then y(x) and y(baseline)
        rows.clear()
        SmoothGrad(model, n=5, batch_size=4).attribute(images(n=3))
        assert max(rows) <= 4 and sum(rows) == 3 + 3 * 5  # the clean input for the top class, then the copies
    finally:
        handle.remove()


def by_hand(name: str, model: nn.Module, x: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What `builders()`' method `name` computes, done by hand in the caller's precision with hookviz's batch
    arrangement (one batch of all rows), and a bound on how far hookviz's float32 result may be from it: only the
    float32 sums and products hookviz does after the backward pass may round in another order."""
    n = x.shape[0]
    if name == "input-x-gradient":
        product = x * same.batch_gradient(model, x, targets)
        return product, same.U32 * product.abs()  # one float32 product: at most one rounding apart
    if name == "smoothgrad-guided":  # n=3, sigma=0.15, generator gen() as in builders()
        copies, g = 3, gen()
        # hookviz's documented draws (tests/reference/noise.py): per copy one randn(x.shape) in x's dtype, scaled by
        # sigma * (max - min) of each sample; the copies laid out copy-major in one batch
        scale = 0.15 * (x.amax(dim=(1, 2, 3), keepdim=True) - x.amin(dim=(1, 2, 3), keepdim=True))
        noisy = torch.cat([x + scale * torch.randn(x.shape, generator=g, dtype=x.dtype) for _ in range(copies)])
        grads = same.batch_gradient(same.same_dtype_rule_copy(model, "guided"), noisy, targets.repeat(copies))
        per_copy = grads.view(copies, n, *x.shape[1:])
        total = torch.zeros_like(x)
        for s in range(copies):
            total += per_copy[s]
        # a float32 sum of 3 terms and a division: (3 + 1) u of the sum of magnitudes
        return total / copies, (copies + 1) * same.U32 * per_copy.abs().sum(0) / copies
    if name == "integrated-gradients":  # steps=5, the default rule, baseline 0
        method = IntegratedGradients(model, steps=5).method
        alphas, weights = ref.quadrature(method, 5)
        b = torch.zeros_like(x)
        points = torch.cat([b + a * (x - b) for a in alphas])  # point-major, all points in one batch
        grads = same.batch_gradient(model, points, targets.repeat(len(alphas))).view(len(alphas), n, *x.shape[1:])
        total = torch.zeros_like(x)
        terms = torch.zeros_like(x, dtype=torch.float64)
        for w, grad in zip(weights, grads, strict=True):
            total += w * grad
            terms += (w * grad.double()).abs()
        # 5 float32 products and sums, the weights rounded to float32 (numpy's Gauss-Legendre weights against
        # these), then the product with x - b: (2 * 5 + 2) u of the sum of magnitudes
        return (x - b) * total, (2 * len(alphas) + 2) * same.U32 * (x - b).abs().double() * terms
    raise ValueError(name)


@pytest.mark.parametrize(("name", "build"), builders())
def test_autocast_bfloat16_equals_the_same_computation_by_hand(name, build) -> None:
    # Whether bf16 stays near float32 is a property of bf16 (its kernels round differently per CPU instruction set),
    # not of hookviz: compare with the same bf16 computation done by hand, which may differ only by the float32
    # rounding of what hookviz accumulates in float32 after the backward pass.
    model = resnet()
    x = images()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = quiet(build(model), x, [1, 2])
        want, bound = by_hand(name, model, x, torch.tensor([1, 2]))
    assert got.dtype == torch.float32 and torch.isfinite(got).all() and got.abs().amax() > 0
    assert got.shape == want.shape and want.dtype == torch.float32
    same.assert_within(got, want, bound)


@pytest.mark.parametrize(("name", "build"), builders())
def test_works_under_no_grad(name, build) -> None:
    model = resnet()
    x = images()
    expected = quiet(build(model), x, [1, 2])
    with torch.no_grad():
        got = quiet(build(model), x, [1, 2])
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


# -- the model is left as it was ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "build"), builders())
def test_model_restored(name, build) -> None:
    model = mid_training_resnet()
    before = snapshot(model)
    x = torch.randn(2, 3, 32, 32)
    out = quiet(build(model, 3), x, torch.tensor([[1, 2], [3, 4]]))
    assert out.shape == (2, 2, 3, 32, 32) and torch.isfinite(out).all()
    assert model.training and no_hooks(model)
    assert_same(before, model)


FAILING_CALL = {"smoothgrad-guided": 3, "integrated-gradients": 4}


@pytest.mark.parametrize(("name", "build"), builders()[1:])
def test_model_restored_after_error_in_a_later_chunk(name, build) -> None:
    # smoothgrad: chunks 1 and 2 ran with their rule hooks, chunk 3 fails; IG: y(x), y(baseline), path chunk 1 ran
    model = mid_training_resnet()
    before = snapshot(model)
    calls = []

    def target(out):
        calls.append(out.shape[0])
        if len(calls) == FAILING_CALL[name]:
            raise KeyError("boom")
        return out[:, 1]

    with pytest.raises(RuntimeError, match="the target callable") as info:
        build(model, 2).attribute(torch.randn(2, 3, 32, 32), target=target)
    assert isinstance(info.value.__cause__, KeyError)
    assert_same(before, model)


def test_caller_tensors_untouched() -> None:
    model = resnet()
    x, baseline = images(), images(n=1, seed=5)
    x0, b0 = x.clone(), baseline.clone()
    quiet(IntegratedGradients(model, steps=3, baseline=baseline), x, 1)
    SmoothGrad(InputXGradient(model), n=2).attribute(x, target=1)
    for t, t0 in ((x, x0), (baseline, b0)):
        assert not t.requires_grad and t.grad is None and torch.equal(t, t0)


# -- errors -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"n": 0}, ValueError, r"n must be >= 1 \(noisy copies per input\), got 0"),
        ({"n": 2.5}, TypeError, r"n must be an int \(noisy copies per input\), got float 2.5"),
        ({"sigma": -0.1}, ValueError, r"sigma must be a finite number >= 0 .*got -0.1"),
        ({"sigma": float("nan")}, ValueError, "sigma must be a finite number"),
        ({"batch_size": 0}, ValueError, r"batch_size must be None \(all rows in one pass\) or an int >= 1.*got 0"),
        ({"batch_size": True}, ValueError, "batch_size must be None"),
        ({"squared": "yes"}, TypeError, "squared must be a bool, got str"),
        ({"generator": 0}, TypeError, "generator must be a torch.Generator or None, got int"),
    ],
)
def test_smoothgrad_argument_errors(kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        SmoothGrad(Saliency(SeedNet()), **kwargs)


def test_smoothgrad_method_errors() -> None:
    with pytest.raises(TypeError, match=r"the class GuidedBackprop; pass e.g. SmoothGrad\(GuidedBackprop\(model\)\)"):
        SmoothGrad(GuidedBackprop)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="method must be an attribution method instance .* got str"):
        SmoothGrad("saliency")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"method": "simpson"}, ValueError, r"method must be one of 'riemann_left', .*'gausslegendre'; got 'simpson'"),
        ({"steps": 1, "method": "riemann_left"}, ValueError, r"steps must be >= 2 .*method='riemann_left'\), got 1"),
        ({"steps": 0}, ValueError, r"steps must be >= 1 .*got 0"),
        ({"steps": 2.0}, TypeError, "steps must be an int"),
        ({"baseline": "zeros"}, TypeError, r"baseline must be None \(zeros\), a number .*; got str"),
        ({"baseline": torch.zeros(3, dtype=torch.bool)}, TypeError, "baseline tensor must hold real numbers"),
        ({"batch_size": -1}, ValueError, "batch_size must be None"),
    ],
)
def test_integrated_gradients_argument_errors(kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        IntegratedGradients(SeedNet(), **kwargs)


def test_errors_before_any_work() -> None:
    model = SeedNet()
    calls: list[int] = []
    handle = model.fc1.register_forward_pre_hook(lambda m, args: calls.append(1))
    try:
        ig = IntegratedGradients(model, baseline=torch.zeros(5))
        with pytest.raises(ValueError, match=r"baseline of shape \(5,\) does not broadcast to the inputs' shape \(2,"):
            ig.attribute(torch.ones(2, 3))
        for method in (InputXGradient(model), SmoothGrad(model), IntegratedGradients(model)):
            with pytest.raises(ValueError, match="target has 3 entries but the batch has 2 inputs"):
                method.attribute(torch.ones(2, 3), target=[0, 0, 0])
            with pytest.raises(ValueError, match="target class 4 is out of range"):
                method.attribute(torch.ones(2, 3), target=4)
        assert len(calls) == 3  # the out-of-range checks need the output: one forward each, nothing more
    finally:
        handle.remove()
    assert no_hooks(model)


def test_registry_and_repr() -> None:
    assert get_method("input-x-gradient") is InputXGradient
    assert get_method("smoothgrad") is SmoothGrad
    assert get_method("integrated-gradients") is IntegratedGradients
    model = SeedNet()
    assert repr(SmoothGrad(GuidedBackprop(model), n=4, batch_size=8)) == (
        "SmoothGrad(GuidedBackprop(SeedNet), n=4, sigma=0.15, batch_size=8)"
    )
    assert repr(IntegratedGradients(model, steps=8)) == "IntegratedGradients(SeedNet, steps=8, method='gausslegendre')"
    # every registered class builds from a bare model (the CLI and the invariant tests rely on it)
    for cls in (InputXGradient, SmoothGrad, IntegratedGradients):
        assert quiet(cls(model), torch.ones(1, 3), None).shape == (1, 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_smoothgrad_generator_on_the_inputs_device() -> None:
    model = small_cnn().cuda()
    x = images(size=8).cuda()
    with pytest.raises(ValueError, match=r"generator is on cpu but the inputs are on cuda:0; create it with"):
        SmoothGrad(model, n=2, generator=gen()).attribute(x, target=1)
    make = lambda: SmoothGrad(model, n=4, batch_size=3, generator=torch.Generator("cuda").manual_seed(0))  # noqa: E731
    first = make().attribute(x, target=1)
    assert first.is_cuda
    torch.testing.assert_close(first, make().attribute(x, target=1))  # same noise; index_add_ on cuda may round
