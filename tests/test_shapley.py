"""The coalition methods (hookviz.methods.shapley): captum's toy references, the Shapley axioms, captum and shap
where the algorithms coincide, chunk-size invariance, target forms, several inputs, groups and baselines, errors.

Tolerances: the methods sum float32 model outputs in float64, so results agree with an exact formula to float32
rounding of the outputs (rtol 1e-5 / atol 1e-4 on outputs of size ~100); captum computes in float32 (its own
rounding of sums, hence the same tolerance); shap in float64 on float64 models (1e-10).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from refs import require
from torch import nn

import hookviz as hv
from hookviz.methods.shapley.exact import all_coalitions
from hookviz.methods.shapley.kernel import kernel_coalitions

F32 = {"rtol": 1e-5, "atol": 1e-4}  # float32 model outputs summed in float64 (see the module docstring)


class MultiLayer(nn.Module):
    """captum's ``BasicModel_MultiLayer`` (captum/testing/helpers/basic_models.py), written out so these references
    do not depend on captum (its identity ``linear0`` left out): linear1 (3 -> 4, weights 1, bias [-10, 1, 1, 1]),
    ReLU, linear2 (4 -> 2, weights 1, bias [-1, 1])."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.linear1.weight = nn.Parameter(torch.ones(4, 3))
        self.linear1.bias = nn.Parameter(torch.tensor([-10.0, 1.0, 1.0, 1.0]))
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(4, 2)
        self.linear2.weight = nn.Parameter(torch.ones(2, 4))
        self.linear2.bias = nn.Parameter(torch.tensor([-1.0, 1.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.relu(self.linear1(x)))


def mlp(d: int = 6, k: int = 3, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 16), nn.Tanh(), nn.Linear(16, k)).to(dtype).eval()


def linear(w: torch.Tensor) -> nn.Module:
    lin = nn.Linear(w.numel(), 1)
    with torch.no_grad():
        lin.weight.copy_(w.view(1, -1))
        lin.bias.fill_(0.5)
    return lin.eval()


def rows(n: int, d: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


SHAPLEY_TYPE = {  # every Shapley-type estimator, with options under which it is cheap
    "exact": lambda m, **o: hv.ShapleyValues(m, **o),
    "sampling": lambda m, **o: hv.ShapleyValueSampling(m, n_samples=7, **o),
    "sampling-antithetic": lambda m, **o: hv.ShapleyValueSampling(m, n_samples=6, antithetic=True, **o),
    "kernel": lambda m, **o: hv.KernelShap(m, n_samples=20, **o),
    "partition": lambda m, **o: hv.PartitionShap(m, max_evals=None, **o),
    "partition-truncated": lambda m, **o: hv.PartitionShap(m, max_evals=12, **o),
}


# -- captum's toy references -------------------------------------------------------------------------------------------
def test_multilayer_model_is_captums() -> None:
    basic = pytest.importorskip("captum.testing.helpers.basic_models")
    ref, ours = basic.BasicModel_MultiLayer(), MultiLayer()
    x = torch.tensor([[20.0, 50.0, 30.0], [1.0, -2.0, 3.0]])
    torch.testing.assert_close(ours(x), ref(x))


@pytest.mark.parametrize(
    ("method", "mask", "baseline", "expected"),
    [
        # captum's tests (test_shapley.py, test_feature_ablation.py): f(x) - f(0) = 390 splits as below
        ("exact", None, 0.0, [76.66666, 196.66666, 116.66666]),
        ("exact", [[0, 0, 1]], 0.0, [275.0, 275.0, 115.0]),
        ("exact", [[0, 0, 1]], 4.0, [248.0, 248.0, 104.0]),
        ("ablation", None, 0.0, [80.0, 200.0, 120.0]),
        # KernelShap enumerating every coalition (2^3 - 2 = 6 <= the default budget) is exact
        ("kernel", None, 0.0, [76.66666, 196.66666, 116.66666]),
        ("kernel", [[0, 0, 1]], 4.0, [248.0, 248.0, 104.0]),
    ],
)
def test_captum_toy_references(method, mask, baseline, expected) -> None:
    cls = {"exact": hv.ShapleyValues, "ablation": hv.FeatureAblation, "kernel": hv.KernelShap}[method]
    x = torch.tensor([[20.0, 50.0, 30.0]])
    fm = None if mask is None else torch.tensor(mask)
    attr = cls(MultiLayer(), baselines=baseline).attribute(x, target=0, feature_mask=fm)
    torch.testing.assert_close(attr, torch.tensor([expected]), rtol=1e-6, atol=1e-4)


# -- the axioms --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SHAPLEY_TYPE))
def test_efficiency_sum_is_f_x_minus_f_baseline(name) -> None:
    model = mlp(8)
    x, b = rows(3, 8), rows(1, 8, seed=5)
    attr = SHAPLEY_TYPE[name](model, baselines=b).attribute(x, target=[0, 1, 2])
    with torch.no_grad():
        gap = (model(x) - model(b))[torch.arange(3), torch.tensor([0, 1, 2])]
    torch.testing.assert_close(attr.double().sum(1), gap.double(), **F32)


# a truncated PartitionShap spreads the credit of unexpanded nodes evenly over their groups: efficient, but not w(x - b)
@pytest.mark.parametrize("name", sorted(set(SHAPLEY_TYPE) - {"partition-truncated"}) + ["ablation", "lime"])
def test_linear_model_gives_w_times_x_minus_b(name) -> None:
    w = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0, -1.0])
    x, b = rows(2, 6), torch.full((6,), 0.25)
    extra = {
        "ablation": lambda m, **o: hv.FeatureAblation(m, **o),
        "lime": lambda m, **o: hv.Lime(m, n_samples=64, alpha=0.0, **o),  # least squares fits a linear model exactly
    }
    method = {**SHAPLEY_TYPE, **extra}[name](linear(w), baselines=b)
    torch.testing.assert_close(method.attribute(x, target=0), w * (x - b), **F32)


@pytest.mark.parametrize("name", ["exact", "sampling", "sampling-antithetic", "partition"])
def test_a_feature_the_model_ignores_gets_exactly_zero(name) -> None:
    class Drops(nn.Module):  # feature 2 never reaches the output
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(5, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(torch.cat([x[:, :2], x[:, 3:]], 1))

    attr = SHAPLEY_TYPE[name](Drops()).attribute(rows(3, 6), target=1)
    assert torch.equal(attr[:, 2], torch.zeros(3)) and attr.abs().sum() > 0


def test_kernel_shap_gives_an_ignored_feature_zero_when_it_enumerates() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1))
    with torch.no_grad():
        model[0].weight[:, 3] = 0  # feature 3 ignored
    attr = hv.KernelShap(model.eval(), n_samples=14).attribute(rows(2, 4), target=0)
    torch.testing.assert_close(attr[:, 3], torch.zeros(2), rtol=0, atol=1e-6)  # a float64 solve of float32 values


@pytest.mark.parametrize("name", sorted(SHAPLEY_TYPE) + ["ablation", "lime", "permutation"])
def test_result_is_the_same_for_every_chunk_size_and_memory_budget(name) -> None:
    extra = {
        "ablation": lambda m, **o: hv.FeatureAblation(m, **o),
        "lime": lambda m, **o: hv.Lime(m, n_samples=40, **o),
        "permutation": lambda m, **o: hv.FeaturePermutation(m, **o),
    }
    build = {**SHAPLEY_TYPE, **extra}[name]
    model, x = mlp(6), rows(3, 6)
    want = build(model, batch_size=None).attribute(x, target=2)
    row = 6 * 4  # bytes of one built row
    for options in ({"batch_size": 1}, {"batch_size": 7}, {"max_memory": 5 * row}, {"max_memory": row}):
        torch.testing.assert_close(build(model, **options).attribute(x, target=2), want, **F32)


@pytest.mark.parametrize("name", sorted(SHAPLEY_TYPE) + ["lime"])
def test_k_targets_equal_k_single_calls(name) -> None:
    build = {**SHAPLEY_TYPE, "lime": lambda m, **o: hv.Lime(m, n_samples=30, **o)}[name]
    model, x = mlp(6), rows(2, 6)
    targets = torch.tensor([[0, 2], [1, 1]])
    both = build(model).attribute(x, target=targets)
    assert both.shape == (2, 2, 6)
    for k in range(2):
        torch.testing.assert_close(both[:, k], build(model).attribute(x, target=targets[:, k]), **F32)


def test_kernel_shap_enumerating_everything_equals_exact_shapley() -> None:
    model, x = mlp(5), rows(2, 5)
    exact = hv.ShapleyValues(model).attribute(x, target=1)
    torch.testing.assert_close(hv.KernelShap(model, n_samples=30).attribute(x, target=1), exact, **F32)


# -- captum where the algorithms coincide ------------------------------------------------------------------------------
def _captum():
    return require("captum.attr")


def test_feature_ablation_and_shapley_values_equal_captum() -> None:
    ca = _captum()
    model, x = mlp(6, 3), rows(4, 6)
    mask = torch.tensor([[0, 0, 1, 2, 2, 3]])
    b = rows(1, 6, seed=9)
    for ours, theirs in ((hv.FeatureAblation, ca.FeatureAblation), (hv.ShapleyValues, ca.ShapleyValues)):
        got = ours(model, baselines=b).attribute(x, target=[0, 1, 2, 0], feature_mask=mask)
        want = theirs(model).attribute(x, baselines=b, target=[0, 1, 2, 0], feature_mask=mask)
        torch.testing.assert_close(got, want, **F32)  # captum sums in float32


def test_shapley_value_sampling_equals_captum_with_the_same_permutations() -> None:
    ca = _captum()
    model, x = mlp(5, 2), rows(2, 5)
    ours = hv.ShapleyValueSampling(model, n_samples=9, seed=123).attribute(x, target=1)
    torch.manual_seed(123)  # captum draws torch.randperm(M) from the global generator, as ours from seed 123
    theirs = ca.ShapleyValueSampling(model).attribute(x, target=1, n_samples=9)
    torch.testing.assert_close(ours, theirs, **F32)


def test_feature_permutation_equals_captum_with_the_same_draws() -> None:
    ca = _captum()
    model, x = mlp(4, 2), rows(5, 4)
    ours = hv.FeaturePermutation(model, seed=7).attribute(x, target=0)
    torch.manual_seed(7)
    theirs = ca.FeaturePermutation(model).attribute(x, target=0)
    torch.testing.assert_close(ours, theirs, **F32)


# -- shap --------------------------------------------------------------------------------------------------------------
def _shap_case():
    model = mlp(5, 1, seed=3, dtype=torch.float64)
    x = rows(3, 5, seed=4).double()
    background = rows(4, 5, seed=6).double()

    def f(z):
        with torch.no_grad():
            return model(torch.as_tensor(z)).numpy()[:, 0]

    return model, x, background, f


def test_shapley_values_equal_shap_exact_explainer_over_a_background() -> None:
    shap = require("shap")
    model, x, background, f = _shap_case()
    masker = shap.maskers.Independent(background.numpy(), max_samples=4)
    want = shap.explainers.Exact(f, masker)(x.numpy()).values
    got = hv.ShapleyValues(model, baselines=hv.Background(background)).attribute(x, target=0)
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-10, atol=1e-10)  # both float64


def test_kernel_shap_equals_shap_kernel_explainer_without_l1() -> None:
    shap = require("shap")
    model, x, background, f = _shap_case()
    explainer = shap.KernelExplainer(f, background.numpy())
    want = explainer.shap_values(x.numpy(), nsamples=2**5, l1_reg=False, silent=True)
    got = hv.KernelShap(model, n_samples=2**5, baselines=hv.Background(background)).attribute(x, target=0)
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-10, atol=1e-10)


def test_kernel_coalitions_enumerate_whole_sizes_as_shap() -> None:
    shap = require("shap")
    m = 8
    model = mlp(m, 1, dtype=torch.float64)

    def f(z):
        with torch.no_grad():
            return model(torch.as_tensor(z)).numpy()[:, 0]

    explainer = shap.KernelExplainer(f, torch.zeros(1, m, dtype=torch.float64).numpy())
    explainer.shap_values(rows(1, m).double().numpy(), nsamples=80, l1_reg=False, silent=True)
    z, w = kernel_coalitions(m, 80, torch.Generator().manual_seed(0))
    fixed = 2 * m  # budget 80 covers size 1 and its complements (16), not size 2 (56 at its share)
    assert torch.equal(z[:fixed], torch.from_numpy(explainer.maskMatrix[:fixed]).bool())
    torch.testing.assert_close(w[:fixed], torch.from_numpy(explainer.kernelWeights[:fixed]), rtol=1e-12, atol=0)
    assert z.shape[0] == 80 and not bool((z.all(1) | ~z.any(1)).any())
    torch.testing.assert_close(w.sum(), torch.tensor(1.0, dtype=torch.float64))


# shap's varying groups: the features where an input equals the baseline (with several background rows: equals every
# row), per input. Background columns 0..6 are the same in every row (only there can an input not vary); row 4 takes
# background row 0's values everywhere: with one background row nothing varies, with three its last feature does.
SAME = [[1, 4, 5], [0, 2, 6], [0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6], list(range(8))]


def _varying_case(b: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, list[list[int]]]:
    model = mlp(8, 1, seed=3, dtype=torch.float64)
    background = rows(b, 8, seed=6).double()
    background[:, :7] = background[:1, :7]
    x = rows(len(SAME), 8, seed=4).double()
    for r, same in enumerate(SAME):
        x[r, same] = background[0, same]
    not_varying = [same if b == 1 or 7 not in same else same[:-1] for same in SAME]
    return model, x, background, not_varying


@pytest.mark.parametrize("b", [1, 3])
def test_kernel_shap_skips_the_groups_that_do_not_vary_as_shap(b) -> None:
    shap = require("shap")
    model, x, background, not_varying = _varying_case(b)

    def f(z):
        with torch.no_grad():
            return model(torch.as_tensor(z)).numpy()[:, 0]

    # 30 coalitions enumerate every coalition of the rows' 5, 4, 1 or 0 varying groups, not of all 8: deterministic in
    # shap and here, and only with the skip (the draws over 8 groups would differ from shap's)
    want = shap.KernelExplainer(f, background.numpy()).shap_values(x.numpy(), nsamples=30, l1_reg=False, silent=True)
    baselines = background if b == 1 else hv.Background(background)  # one baseline, or a distribution
    method = hv.KernelShap(model, n_samples=30, baselines=baselines)
    got = method.attribute(x, target=0)
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-10, atol=1e-10)  # both float64
    with torch.no_grad():
        gap = model(x)[:, 0] - model(background)[:, 0].mean()
    torch.testing.assert_close(got.sum(1), gap, rtol=1e-12, atol=1e-12)  # efficiency over the varying groups
    for r, same in enumerate(not_varying):  # exactly 0, not a regression's near-zero
        assert torch.equal(got[r, same], torch.zeros(len(same), dtype=torch.float64))
    # switched off: a regression over all 8 groups, not shap's, with the budget for every input
    off = hv.KernelShap(model, n_samples=30, baselines=baselines, varying_only=False)
    regressed = off.attribute(x, target=0)
    assert not torch.allclose(regressed, got, atol=1e-6)
    assert bool((regressed[0, not_varying[0]] != 0).any())
    # the cost per input: the empty coalition and 2^M' - 2 coalitions of each row's M' = 5, 5, 4, 1 (or 0) groups
    assert off.last_coalitions == 1 + 30 and method.last_coalitions == 1 + (30 + 30 + 14) / 5


def test_kernel_shap_varying_groups_batched_equal_single_calls() -> None:
    # 40 coalitions of 8, 7 or 6 varying groups: drawn, not enumerated; rows 1 and 3 share their varying set (one
    # coalition set, one solve), the others have their own
    model, b = mlp(8, 2, seed=3, dtype=torch.float64), rows(1, 8, seed=6).double()
    x = rows(4, 8, seed=4).double()
    for r, same in enumerate([[], [2], [0, 5], [2]]):
        x[r, same] = b[0, same]
    method = hv.KernelShap(model, n_samples=40, baselines=b)
    batch = method.attribute(x, target=[0, 1, 1, 0])
    for r in range(4):
        alone = method.attribute(x[r : r + 1], target=[[0, 1, 1, 0][r]])
        # float64 throughout; the same coalitions and weights: what differs is the rounding of the forward passes
        # and of the solve over batches of other sizes, a few ulps of values of size ~1
        torch.testing.assert_close(batch[r : r + 1], alone, rtol=0, atol=1e-13)
    assert torch.equal(batch[1, 2], torch.tensor(0.0, dtype=torch.float64)) and batch[2, [0, 5]].eq(0).all()
    with torch.no_grad():
        gap = (model(x) - model(b))[torch.arange(4), torch.tensor([0, 1, 1, 0])]
    torch.testing.assert_close(batch.sum(1), gap, rtol=1e-12, atol=1e-12)
    # the varying set is each input's: with every group varying everywhere, the skip changes nothing
    x[1, 2], x[2, 0], x[2, 5], x[3, 2] = 1.5, 1.5, 1.5, 1.5
    full = hv.KernelShap(model, n_samples=40, baselines=b, varying_only=False).attribute(x, target=0)
    assert torch.equal(method.attribute(x, target=0), full)


def test_kernel_shap_varying_groups_keep_the_axioms() -> None:
    # float32, features equal to the baseline in some rows, and a group of two features of which one varies: efficient,
    # the linear model's w (x - b), the same for every chunk size, (N, K) targets equal K single calls
    model, b = mlp(6, 3), rows(1, 6, seed=5)
    x = rows(3, 6)
    x[0, [1, 3]], x[2, [0, 1, 2]], x[1, 4] = b[0, [1, 3]], b[0, [0, 1, 2]], b[0, 4]
    mask = torch.tensor([[0, 1, 2, 3, 4, 4]])  # group 4: feature 4 equals the baseline in row 1, feature 5 does not
    build = lambda m, **o: hv.KernelShap(m, n_samples=20, baselines=b, feature_mask=mask, **o)  # noqa: E731
    attr = build(model).attribute(x, target=[0, 1, 2])
    with torch.no_grad():
        gap = (model(x) - model(b))[torch.arange(3), torch.tensor([0, 1, 2])]
    torch.testing.assert_close(attr.double()[:, :5].sum(1), gap.double(), **F32)  # the 5 groups (4 spans 4 and 5)
    assert attr[0, [1, 3]].eq(0).all() and attr[2, :3].eq(0).all() and attr[1, 4] != 0
    want = build(model).attribute(x, target=2)
    for options in ({"batch_size": 1}, {"batch_size": 7}, {"max_memory": 5 * 24}):
        torch.testing.assert_close(build(model, **options).attribute(x, target=2), want, **F32)
    targets = torch.tensor([[0, 2], [1, 1], [2, 0]])
    both = build(model).attribute(x, target=targets)
    for k in range(2):
        torch.testing.assert_close(both[:, k], build(model).attribute(x, target=targets[:, k]), **F32)
    w = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0, -1.0])
    lin = hv.KernelShap(linear(w), n_samples=20, baselines=b).attribute(x, target=0)
    torch.testing.assert_close(lin, w * (x - b), **F32)
    assert lin[0, [1, 3]].eq(0).all() and lin[2, :3].eq(0).all()


# -- PartitionShap: Owen values ----------------------------------------------------------------------------------------
def brute_owen(v, tree) -> list[float]:
    """Owen values by definition over two levels: unions U_1..U_u, Shapley among the unions, then within each."""
    unions = [list(u) if isinstance(u, tuple) else [u] for u in tree]
    m = sum(len(u) for u in unions)
    phi = [0.0] * m
    uu = len(unions)
    for a, union in enumerate(unions):
        others = [b for b in range(uu) if b != a]
        for r in range(len(others) + 1):
            for outer in itertools.combinations(others, r):
                wu = math.factorial(r) * math.factorial(uu - r - 1) / math.factorial(uu)
                base = {g for b in outer for g in unions[b]}
                for i in union:
                    rest = [g for g in union if g != i]
                    for s in range(len(rest) + 1):
                        for inner in itertools.combinations(rest, s):
                            wi = math.factorial(s) * math.factorial(len(union) - s - 1) / math.factorial(len(union))
                            c = base | set(inner)
                            phi[i] += wu * wi * (v(c | {i}) - v(c))
    return phi


def test_partition_shap_equals_owen_values_by_definition() -> None:
    model = mlp(4, 1, dtype=torch.float64)
    x = rows(1, 4).double()
    tree = ((0, 1), (2, 3))

    def v(coalition):
        z = torch.tensor([[x[0, g] if g in coalition else 0.0 for g in range(4)]], dtype=torch.float64)
        with torch.no_grad():
            return float(model(z)[0, 0])

    got = hv.PartitionShap(model, max_evals=None, hierarchy=tree).attribute(x, target=0)
    torch.testing.assert_close(got[0], torch.tensor(brute_owen(v, tree), dtype=torch.float64), rtol=1e-10, atol=1e-12)
    # not the Shapley values for this model (the hierarchy matters) ...
    assert not torch.allclose(got, hv.ShapleyValues(model).attribute(x, target=0), atol=1e-6)


def test_partition_shap_default_hierarchy_splits_image_patches_spatially() -> None:
    from hookviz.methods.shapley.groups import hierarchy

    mask = hv.grid_mask((8, 8), 4).view(1, 1, 8, 8)  # 2 x 2 patches: 0 1 / 2 3
    assert hierarchy((mask,), 4) in (((0, 2), (1, 3)), ((0, 1), (2, 3)))
    assert hierarchy((torch.arange(6).view(1, 6),), 6) == ((0, (1, 2)), (3, (4, 5)))


def _two_layouts() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Two images with masks of their own: image 0 a 2 x 2 grid numbered 0 1 / 2 3 (4 groups: id 4 absent), image 1
    the same grid numbered 0 2 / 1 3 with its bottom-right cell cut into a top and a bottom half (ids 3 / 4). The
    default hierarchy halves both images into top and bottom: in ids, ((0, 1), (2, 3)) and ((0, 2), (1, (3, 4)))."""
    grid = hv.grid_mask((8, 8), 4)
    other = grid.T.clone()
    other[6:, 4:] = 4
    model = cnn().double()
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    return model, x, torch.stack([grid, other]).unsqueeze(1)


@pytest.mark.parametrize("max_evals", [None, 8])
def test_partition_shap_one_hierarchy_per_input_layout(max_evals) -> None:
    from hookviz.methods.shapley.groups import hierarchy

    model, x, masks = _two_layouts()
    trees = [hierarchy((masks[i : i + 1],), 5) for i in range(2)]
    assert trees == [((0, 1), (2, 3)), ((0, 2), (1, (3, 4)))]  # each from its own layout
    targets = [0, 2]
    batch = hv.PartitionShap(model, max_evals=max_evals).attribute(x, target=targets, feature_mask=masks)

    def alone(i: int, tree=None) -> torch.Tensor:
        method = hv.PartitionShap(model, max_evals=max_evals, hierarchy=tree)
        return method.attribute(x[i : i + 1], target=targets[i], feature_mask=masks[i : i + 1])

    # float64 and the same coalitions: what differs is the rounding of forward passes and sums over other batch sizes
    for i in range(2):
        torch.testing.assert_close(batch[i : i + 1], alone(i), rtol=0, atol=1e-13)
    # image 1 walks its own tree, not image 0's (which halves image 1 into left and right)
    torch.testing.assert_close(batch[1:], alone(1, trees[1]), rtol=0, atol=1e-13)
    assert not torch.allclose(batch[1:], alone(1, (*trees[0], 4)), atol=1e-6)
    with torch.no_grad():
        gap = model(x)[[0, 1], targets] - model(torch.zeros_like(x))[[0, 1], targets]
    per_group = torch.stack([torch.stack([batch[i][masks[i].expand(3, 8, 8) == g][0] for g in masks[i].unique()]).sum()
                             for i in range(2)])  # fmt: skip
    torch.testing.assert_close(per_group, gap, rtol=1e-12, atol=1e-12)  # efficiency, exact for each input


def test_inputs_with_the_same_layout_share_one_hierarchy() -> None:
    from hookviz.methods.shapley.groups import layouts

    _, _, masks = _two_layouts()
    three = torch.cat([masks, masks[:1]])
    assert [r.tolist() for r in layouts((three,), 3)] == [[0, 2], [1]]
    assert [r.tolist() for r in layouts((torch.zeros(1, 1, 8, 8, dtype=torch.long),), 3)] == [[0, 1, 2]]
    # a second tensor whose per-input masks differ splits inputs that the first tensor's would group
    tabular = torch.tensor([[5, 6], [5, 6], [6, 5]])
    assert [r.tolist() for r in layouts((three, tabular), 3)] == [[0], [1], [2]]


# -- groups, baselines, inputs -----------------------------------------------------------------------------------------
def test_grid_mask_and_superpixels() -> None:
    g = hv.grid_mask((5, 6), (2, 4))
    assert g.shape == (5, 6) and g.unique().tolist() == list(range(6)) and g[4, 5] == 5
    img = torch.zeros(3, 16, 16)
    img[:, :, 8:] = 1.0  # two halves of different colour
    sp = hv.superpixels(img, n_segments=4, compactness=1.0)
    assert sp.shape == (16, 16) and sp.unique().tolist() == list(range(sp.max() + 1))
    assert not bool((sp[:, :8].unsqueeze(-1) == sp[:, 8:].flatten()).any())  # no segment crosses the edge
    batch = hv.superpixels(torch.rand(2, 3, 12, 12), n_segments=9)
    assert batch.shape == (2, 1, 12, 12)


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 8 * 8, 3)).eval()


def test_images_with_superpixels_blur_and_per_input_masks() -> None:
    model, x = cnn(), torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    masks = hv.superpixels(x, n_segments=6)  # (2, 1, 8, 8): groups per input
    ks = hv.KernelShap(model, n_samples=400, baselines="blur")
    attr = ks.attribute(x, target=1, feature_mask=masks)
    assert attr.shape == x.shape
    for i in range(2):  # piecewise constant over each input's own segments
        for g in masks[i].unique():
            values = attr[i][masks[i].expand(3, 8, 8) == g]
            assert torch.equal(values, values[:1].expand_as(values))
    from hookviz.methods.shapley.coalitions import _gaussian_blur

    with torch.no_grad():
        gap = model(x)[:, 1] - model(_gaussian_blur(x, 0.5))[:, 1]
    per_group = torch.stack([torch.stack([attr[i][masks[i].expand(3, 8, 8) == g][0] for g in masks[i].unique()]).sum()
                             for i in range(2)])  # fmt: skip
    torch.testing.assert_close(per_group, gap, **F32)


def test_visualize_gives_an_explanation() -> None:
    exp = hv.FeatureAblation(cnn()).visualize(torch.rand(1, 3, 8, 8), target=0)
    assert isinstance(exp, hv.Explanation) and exp.attribution.shape[-2:] == (8, 8)


def test_token_ids_one_group_per_token_with_a_pad_baseline() -> None:
    torch.manual_seed(0)

    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.out = nn.Linear(4, 2)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.out(torch.tanh(self.emb(ids)).mean(1))

    model, ids = Bag().eval(), torch.tensor([[3, 5, 7, 1], [2, 2, 9, 4]])
    attr = hv.ShapleyValues(model, baselines=0).attribute(ids, target=0)
    assert attr.shape == (2, 4) and attr.dtype == torch.float32
    with torch.no_grad():
        gap = model(ids)[:, 0] - model(torch.zeros_like(ids))[:, 0]
    torch.testing.assert_close(attr.sum(1), gap, **F32)


def test_several_inputs_additional_forward_args_and_forward_kwargs() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = mlp(4, 2, seed=1), mlp(3, 2, seed=2)

        def forward(self, x, meta, gain, *, shift=None):
            return self.a(x) * gain[:, None] + self.b(meta) + (0 if shift is None else shift[:, None])

    model = Two()
    x, meta, gain, shift = rows(2, 4), rows(2, 3, seed=3), torch.tensor([1.0, -2.0]), torch.tensor([0.5, 1.5])
    attr = hv.ShapleyValues(model).attribute(
        (x, meta), target=1, additional_forward_args=gain, forward_kwargs={"shift": shift}
    )
    assert isinstance(attr, tuple) and attr[0].shape == x.shape and attr[1].shape == meta.shape
    with torch.no_grad():
        gap = model(x, meta, gain, shift=shift)[:, 1] - model(0 * x, 0 * meta, gain, shift=shift)[:, 1]
    torch.testing.assert_close(attr[0].sum(1) + attr[1].sum(1), gap, **F32)
    # groups shared across the two tensors: one group per tensor gives a two-player game
    both = hv.ShapleyValues(model).attribute(
        (x, meta),
        target=1,
        feature_mask=(torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 3, dtype=torch.long)),
        additional_forward_args=gain,
        forward_kwargs={"shift": shift},
    )
    torch.testing.assert_close(both[0][:, 0] + both[1][:, 0], gap, **F32)


def test_background_distribution_draws_with_the_generator() -> None:
    model, x, bg = mlp(5), rows(2, 5), rows(30, 5, seed=8)
    a = hv.KernelShap(model, n_samples=30, seed=1, baselines=hv.Background(bg, draws=6)).attribute(x, target=0)
    b = hv.KernelShap(model, n_samples=30, seed=1, baselines=hv.Background(bg, draws=6)).attribute(x, target=0)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    full = hv.ShapleyValues(model, baselines=hv.Background(bg)).attribute(x, target=0)
    with torch.no_grad():
        gap = model(x)[:, 0] - model(bg)[:, 0].mean()
    torch.testing.assert_close(full.sum(1), gap, **F32)


def test_lime_matches_weighted_ridge_of_scikit_learn() -> None:
    lm = require("sklearn.linear_model")
    model, x = mlp(5, 1), rows(1, 5)
    lime = hv.Lime(model, n_samples=60, alpha=0.5, seed=3)
    got = lime.attribute(x, target=0)
    z = lime.coalitions(5, torch.Generator().manual_seed(3))
    with torch.no_grad():
        y = model(torch.where(z, x, torch.zeros(()))).double()[:, 0]
    fit = lm.Ridge(alpha=0.5).fit(z.double().numpy(), y.numpy(), sample_weight=lime.kernel(z.double()).numpy())
    torch.testing.assert_close(got[0].double(), torch.from_numpy(fit.coef_), rtol=1e-5, atol=1e-6)


def test_all_coalitions_are_the_bits() -> None:
    c = all_coalitions(3)
    assert c.shape == (8, 3) and c[5].tolist() == [True, False, True]


# -- errors: before any forward pass, the model as it was --------------------------------------------------------------
class Counted(nn.Module):
    def __init__(self, d: int = 4) -> None:
        super().__init__()
        self.net = mlp(d, 2)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.net(x)


@pytest.mark.parametrize(
    ("build", "kwargs", "error", "match"),
    [
        (lambda m: hv.ShapleyValues(m, max_groups=3), {}, ValueError,
         r"M = 4 groups would take 2\^4 = 16 forward rows per input, above max_groups=3"),
        (lambda m: hv.FeatureAblation(m), {"feature_mask": torch.tensor([0, 1, 2])}, ValueError,
         r"feature_mask of shape \(3,\) does not broadcast to the inputs' shape \(2, 4\)"),
        (lambda m: hv.FeatureAblation(m), {"feature_mask": torch.tensor([0, 1, 3, 3])}, ValueError,
         r"group ids must be consecutive from 0"),
        (lambda m: hv.FeatureAblation(m), {"feature_mask": torch.tensor([0.0, 1, 2, 3])}, TypeError,
         r"feature_mask must hold integer group ids"),
        (lambda m: hv.KernelShap(m, max_memory=10), {}, ValueError,
         r"max_memory=10 bytes does not hold one coalition's input row \(16 bytes"),
        (lambda m: hv.KernelShap(m, n_samples=3), {}, ValueError, r"KernelShap needs more coalitions than groups"),
        (lambda m: hv.Lime(m), {"baselines": torch.zeros(3)}, ValueError,
         r"baselines of shape \(3,\) does not broadcast to the inputs' shape \(2, 4\)"),
        (lambda m: hv.Lime(m), {"baselines": "blurry"}, ValueError, r"'blur' or \('blur', sigma > 0\)"),
        (lambda m: hv.Lime(m), {"baselines": "blur"}, ValueError, r"'blur' blurs images"),
        (lambda m: hv.Lime(m), {"baselines": [0.0]}, TypeError, r"baselines must be a finite number"),
        (lambda m: hv.Lime(m), {"baselines": hv.Background(torch.zeros(5, 3))}, ValueError,
         r"Background samples of shape \(5, 3\) do not match"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_before_any_forward_pass(build, kwargs, error, match) -> None:
    model = Counted().train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=match):
        build(model).attribute(rows(2, 4), target=0, **kwargs)
    assert model.calls == 0 and model.training
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_feature_permutation_needs_two_inputs_and_restores_the_model() -> None:
    model = Counted().train()
    with pytest.raises(ValueError, match="N >= 2"):
        hv.FeaturePermutation(model).attribute(rows(1, 4), target=0)
    assert model.training


def test_registered_for_the_cli_and_the_data_set_runner() -> None:
    for name in ("feature-ablation", "feature-permutation", "shapley-values", "shapley-sampling", "kernel-shap",
                 "lime", "partition-shap"):  # fmt: skip
        assert issubclass(hv.METHODS[name], hv.methods.CoalitionAttribution)
