"""TCAV (hookviz.concepts): scores by hand and against captum, CAVs, the statistics against scipy, token models,
bad input, the model and process restored, the result's table, dict and figure.

Tolerances: the CAVs are solved in float64 and returned in float32, the gradients are float32, so values computed
two ways agree to a few float32 ulps of their size (relative 1e-6 on O(1) quantities is ~8 ulps at 2^-23); sign
counts and fractions of inputs are exact (directional derivatives are far from 0 by construction where it matters).
"""

from __future__ import annotations

import json
import math
import random as pyrandom

import matplotlib
import pytest
import torch
from torch import Tensor, nn

import hookviz as hv
from hookviz.concepts.cav import train_cavs
from hookviz.concepts.stats import betainc, correct, t_sf_two_sided, ttest_ind
from hookviz.concepts.tcav import tcav_scores

matplotlib.use("Agg")


class Linear2(nn.Module):
    """``body`` (identity on R^4: the layer) then a linear ``head``: logit_c = w_c . a + b_c exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)
        with torch.no_grad():
            self.body.weight.copy_(torch.eye(4))
            self.body.bias.zero_()
            self.head.weight.copy_(torch.tensor([[1.0, 2.0, -1.0, 0.5], [-1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]]))
            self.head.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(6, 8, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(32, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu2(self.conv2(self.relu1(self.conv1(x))))
        return self.fc(self.pool(x).flatten(1))


class TinyViT(nn.Module):
    """Patch embedding, a class token first, a 1-layer nn.TransformerEncoder (``encoder``: (N, 1 + 4, 8)), the
    head on the class token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 4, stride=4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 8) * 0.1)
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        t = self.embed(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls_token.expand(t.shape[0], -1, -1), t], 1)
        return self.head(self.norm(self.encoder(t))[:, 0])


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------------------- scores by hand


def test_linear_head_by_hand_scores_one_and_zero() -> None:
    model = Linear2()
    w = model.head.weight.detach()
    x = torch.randn(20, 4, generator=_gen())
    grads = w[torch.zeros(20, dtype=torch.long)]  # the gradient of logit 0 w.r.t. a is w_0 for every input
    v = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.2, 0.3, 0.1, 0.0]])  # v . w_0 = 1 and 0.7, both > 0
    assert (v @ w[0] > 0).all()
    sign, mag = tcav_scores(grads, torch.cat([v, -v]), torch.zeros(20, dtype=torch.long), torch.tensor([0]))
    assert sign.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    assert mag.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    # through the whole method: a concept shifted along w_0 from random examples gives a CAV along w_0 (mean CAV:
    # exactly the shift's direction up to the noise's mean difference), the opposite concept one against it
    rand = torch.randn(40, 4, generator=_gen(1))
    up = torch.randn(20, 4, generator=_gen(2)) + 3 * w[0]
    down = torch.randn(20, 4, generator=_gen(3)) - 3 * w[0]
    for cav in ("mean", "logistic"):
        res = hv.TCAV(model, "body", cav=cav).interpret(
            x, {"up": up, "down": down}, rand, target=0, n_random=3, random_size=10
        )
        for kind in ("sign_count", "magnitude"):
            assert res.row(0, "up", "body").stats[kind].scores == [1.0] * 3
            assert res.row(0, "down", "body").stats[kind].scores == [0.0] * 3


def test_magnitude_is_positive_share_of_absolute_derivatives() -> None:
    grads = torch.tensor([[1.0, 0.0], [-3.0, 0.0], [2.0, 0.0], [0.5, 0.0]])
    targets = torch.tensor([0, 0, 1, 1])
    sign, mag = tcav_scores(grads, torch.tensor([[1.0, 0.0]]), targets, torch.tensor([0, 1]))
    assert sign[:, 0].tolist() == [0.5, 1.0]
    assert mag[:, 0].tolist() == [0.25, 1.0]  # class 0: 1 / (1 + 3)


# -------------------------------------------------------------------------------------------------- against captum


def test_scores_equal_captum_tcav_with_fixed_cavs(tmp_path) -> None:
    from captum.attr import LayerGradientXActivation
    from captum.concept import TCAV as CaptumTCAV
    from captum.concept import Concept
    from captum.concept._utils.classifier import Classifier

    torch.manual_seed(0)
    model = SmallCNN().eval()
    inputs = torch.randn(12, 3, 8, 8, generator=_gen(0))
    stripes = torch.randn(8, 3, 8, 8, generator=_gen(1)) + 0.5
    dots = torch.randn(8, 3, 8, 8, generator=_gen(2)) - 0.3
    pool = torch.randn(30, 3, 8, 8, generator=_gen(3))
    n_random = 3
    ours = hv.TCAV(model, ["conv1", "conv2"], cav="logistic")
    concepts = {"stripes": stripes, "dots": dots}
    result = ours.interpret(inputs, concepts, pool, target=2, n_random=n_random, random_size=8)
    cavs = ours.compute_cavs(concepts, pool, n_random=n_random, random_size=8)  # the cached ones

    # captum's concepts: ids 0, 1 for ours; 2 + j for random set j (their examples are never used for the CAV)
    def concept(cid: int, name: str, data: Tensor) -> Concept:
        return Concept(cid, name, torch.utils.data.DataLoader(data, batch_size=4))

    cap_concepts = [concept(0, "stripes", stripes), concept(1, "dots", dots)]
    cap_random = [concept(2 + j, f"random{j}", pool[:8]) for j in range(n_random)]

    class Fixed(Classifier):
        """Returns our CAV for the (concept, random set) pair its data loader holds: rows [v, -v]."""

        def __init__(self, layer: str) -> None:
            self.layer = layer

        def train_and_eval(self, dataloader, **kwargs):  # noqa: ANN001, ANN003
            labels = torch.cat([y for _, y in dataloader]).unique().tolist()
            pos, neg = sorted(labels)
            name = ["stripes", "dots"][pos]
            self.v = cavs[self.layer][name][neg - 2]
            self.ids = [pos, neg]
            return {}

        def weights(self) -> Tensor:
            return torch.stack([self.v, -self.v])

        def classes(self) -> list[int]:
            return self.ids

    for layer in ("conv1", "conv2"):
        cap = CaptumTCAV(model, [layer], classifier=Fixed(layer), save_path=str(tmp_path / layer))
        sets = [[c, r] for c in cap_concepts for r in cap_random]
        scores = cap.interpret(inputs, sets, target=2)
        layer_grads = LayerGradientXActivation(model, getattr(model, layer), multiply_by_inputs=False)
        g = layer_grads.attribute(inputs, target=2).flatten(1)
        for c in cap_concepts:
            row = result.row(2, c.name, layer)
            for j, r in enumerate(cap_random):
                got = scores[f"{c.id}-{r.id}"][layer]
                assert row.stats["sign_count"].scores[j] == pytest.approx(float(got["sign_count"][0]), abs=0)
                s = g @ cavs[layer][c.name][j]
                # captum's "magnitude" is the mean directional derivative (its code; its docstring gives the ratio)
                assert float(got["magnitude"][0]) == pytest.approx(float(s.mean()), rel=1e-5, abs=1e-7)
                ratio = float(s.clamp_min(0).sum() / s.abs().sum())
                assert row.stats["magnitude"].scores[j] == pytest.approx(ratio, rel=1e-5, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------- CAVs


def _logistic_reference(pos: Tensor, neg: Tensor, l2: float, rescale: bool = True) -> Tensor:
    """The same objective solved in the primal with L-BFGS in float64 (the documented centring and scaling; with
    rescale=False the examples are taken as already scaled: the shift is absorbed by the intercept)."""
    x = torch.cat([pos, neg]).double()
    x = x - x.mean(0)
    if rescale:
        x = x / x.square().sum(1).mean().sqrt()
    y = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))]).double()
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1, max_iter=500, tolerance_grad=1e-14, tolerance_change=1e-16)

    def closure() -> Tensor:
        opt.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(x @ w + b, y) + l2 / 2 * w.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    return (w / w.norm()).detach()


def test_logistic_cav_separates_separable_data_and_matches_primal_solution() -> None:
    g = _gen(0)
    direction = torch.randn(20, generator=g)
    pos = torch.randn(30, 20, generator=g) + 2 * direction / direction.norm()
    neg = torch.randn(25, 20, generator=g) - 2 * direction / direction.norm()
    acts = torch.cat([pos, neg])
    rows_p, rows_n = torch.arange(30)[None], torch.arange(30, 55)[None]
    v = train_cavs(acts, rows_p, rows_n, kind="logistic", l2=1e-3)[0]
    assert v.norm().item() == pytest.approx(1.0, abs=1e-6)
    assert (pos @ v).min() > (neg @ v).max()  # separates: one threshold splits the two sets
    ref = _logistic_reference(pos, neg, 1e-3)
    assert float(v.double() @ ref) == pytest.approx(1.0, abs=1e-6)
    # a stronger regularisation is solved as exactly
    v2 = train_cavs(acts, rows_p, rows_n, kind="logistic", l2=0.5)[0]
    assert float(v2.double() @ _logistic_reference(pos, neg, 0.5)) == pytest.approx(1.0, abs=1e-6)


def test_logistic_cavs_of_shared_sets_match_primal_solution_each() -> None:
    # the problems as TCAV poses them: concepts and null sets against shared random sets, of several sizes, rows
    # shared between sets; each CAV from its own Gram blocks equals the float64 primal solution of its problem,
    # scaled by the statistics of all rows of `acts` (the documented centring and scaling)
    g = _gen(2)
    acts = torch.randn(60, 12, generator=g) * 2 + torch.linspace(-1, 3, 12)
    acts[:18, :3] += 1.5  # the concepts sit a little apart
    concepts = [torch.arange(0, 6), torch.arange(6, 12), torch.arange(12, 18)]
    randoms = [
        torch.arange(20, 28),
        torch.arange(24, 32),
        torch.tensor([40, 41, 42, 43, 44, 45, 46, 5]),
        torch.arange(50, 60),
    ]
    pos = [c for c in concepts for _ in range(2)] + [randoms[2], randoms[3]]
    neg = [randoms[j] for _ in concepts for j in range(2)] + [randoms[0], randoms[1]]
    l2 = 0.05
    cavs = train_cavs(acts, pos, neg, kind="logistic", l2=l2)
    x = acts.double() - acts.double().mean(0)
    scale = float(x.square().sum(1).mean().sqrt())
    for i, (p, q) in enumerate(zip(pos, neg, strict=True)):
        ref = _logistic_reference(acts[p].double() / scale, acts[q].double() / scale, l2, rescale=False)
        assert float(cavs[i].double() @ ref) == pytest.approx(1.0, abs=1e-6)
        alone = train_cavs(acts, [p], [q], kind="logistic", l2=l2)[0]
        torch.testing.assert_close(cavs[i], alone, rtol=0, atol=1e-6)
    # acts as row blocks standing for their concatenation (a set may span two blocks: randoms[2] does)
    for kind in ("logistic", "mean"):
        whole = train_cavs(acts, pos, neg, kind=kind, l2=l2)
        blocks = train_cavs(list(acts.split([18, 23, 19])), pos, neg, kind=kind, l2=l2)
        torch.testing.assert_close(blocks, whole, rtol=0, atol=1e-6)
    with pytest.raises(IndexError, match=r"\[0, 60\)"):
        train_cavs(acts, [torch.arange(58, 61)], [torch.arange(3)])


def test_mean_cav_is_normalised_mean_difference_and_batches_agree() -> None:
    g = _gen(1)
    acts = torch.randn(50, 7, generator=g) * 3 + 1
    pos = torch.stack([torch.arange(0, 10), torch.arange(10, 20)])
    neg = torch.stack([torch.arange(20, 35), torch.arange(35, 50)])
    v = train_cavs(acts, pos, neg, kind="mean")
    for i in range(2):
        d = acts[pos[i]].double().mean(0) - acts[neg[i]].double().mean(0)
        torch.testing.assert_close(v[i].double(), d / d.norm(), rtol=0, atol=1e-6)
    # CAVs trained in one batch equal those trained alone
    for kind in ("mean", "logistic"):
        both = train_cavs(acts, pos, neg, kind=kind)
        alone = train_cavs(acts, pos[1:], neg[1:], kind=kind)
        torch.testing.assert_close(both[1], alone[0], rtol=0, atol=1e-6)


def test_null_cavs_fixed_and_independent() -> None:
    from hookviz.concepts.tcav import TCAV

    model = Linear2()
    concept = torch.randn(6, 4, generator=_gen(4)) + 1
    pool = torch.randn(40, 4, generator=_gen(5))
    for null, n_sets in (("fixed", 4), ("independent", 6)):
        cavs = hv.TCAV(model, "body", cav="mean").compute_cavs(
            {"c": concept}, pool, n_random=3, random_size=5, null=null, seed=7
        )["body"]
        draw = TCAV._random_sets(40, n_sets, 5, 7)  # disjoint: 6 x 5 <= 40
        assert len(set(draw.flatten().tolist())) == n_sets * 5
        for j in range(3):
            q = draw[3] if null == "fixed" else draw[3 + j]
            d = pool[q].double().mean(0) - pool[draw[j]].double().mean(0)
            torch.testing.assert_close(cavs["random"][j].double(), d / d.norm(), rtol=0, atol=1e-6)
            d = concept.double().mean(0) - pool[draw[j]].double().mean(0)
            torch.testing.assert_close(cavs["c"][j].double(), d / d.norm(), rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------------- statistics


def test_betainc_and_t_distribution_match_scipy() -> None:
    special = pytest.importorskip("scipy.special")
    stats = pytest.importorskip("scipy.stats")
    r = pyrandom.Random(0)
    for _ in range(300):
        a, b, x = r.uniform(0.05, 40), r.uniform(0.05, 40), r.random()
        assert betainc(a, b, x) == pytest.approx(float(special.betainc(a, b, x)), rel=1e-10, abs=1e-14)
    for t, df in [(0.0, 3), (1.3, 2.5), (-2.2, 17), (8.0, 40), (40.0, 5.5), (1e-3, 1)]:
        assert t_sf_two_sided(t, df) == pytest.approx(float(2 * stats.t.sf(abs(t), df)), rel=1e-10, abs=1e-300)


@pytest.mark.parametrize("test", ["student", "welch"])
def test_ttest_matches_scipy(test: str) -> None:
    stats = pytest.importorskip("scipy.stats")
    r = pyrandom.Random(1)
    for _ in range(100):
        a = [r.gauss(0.5, 0.1) for _ in range(r.randint(2, 25))]
        b = [r.gauss(0.55, r.uniform(0.01, 0.3)) for _ in range(r.randint(2, 25))]
        mine = ttest_ind(a, b, test)  # type: ignore[arg-type]
        ref = stats.ttest_ind(a, b, equal_var=test == "student")
        assert mine.t == pytest.approx(float(ref.statistic), rel=1e-10)
        assert mine.p == pytest.approx(float(ref.pvalue), rel=1e-9, abs=1e-300)
        if test == "welch":
            assert mine.df == pytest.approx(float(ref.df), rel=1e-10)
    # constant samples (scipy: NaN): equal means p = 1, different means p = 0
    assert ttest_ind([1.0, 1.0, 1.0], [1.0, 1.0], test).p == 1.0  # type: ignore[arg-type]
    assert ttest_ind([1.0, 1.0, 1.0], [0.5, 0.5], test).p == 0.0  # type: ignore[arg-type]


def test_corrections_by_hand() -> None:
    p = [0.01, 0.04, 0.03, 0.005, math.nan]
    assert correct(p, "bonferroni")[:4] == pytest.approx([0.04, 0.16, 0.12, 0.02])
    assert math.isnan(correct(p, "bonferroni")[4])
    # Holm: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06, 0.06 (monotone)
    assert correct(p, "holm")[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH: p * 4 / rank: 0.005 * 4 = 0.02, 0.01 * 2 = 0.02, 0.03 * 4/3 = 0.04, 0.04 -> min from the top
    assert correct(p, "bh")[:4] == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert correct([0.9, 0.8], "bonferroni") == [1.0, 1.0]
    with pytest.raises(ValueError, match="correction must be one of"):
        correct(p, "sidak")  # type: ignore[arg-type]


def test_result_p_values_are_the_t_test_of_scores_and_corrected() -> None:
    stats = pytest.importorskip("scipy.stats")
    torch.manual_seed(0)
    model = SmallCNN().eval()
    data = torch.randn(40, 3, 8, 8, generator=_gen(5))
    concepts = {"a": data[:10] + 1, "b": data[10:20] * 2}
    for correction in ("bonferroni", "holm", "bh"):
        res = hv.TCAV(model, ["conv1", "conv2"], cav="mean").interpret(
            data[:12], concepts, data[20:], target=1, n_random=4, random_size=5, correction=correction, test="welch"
        )
        ps = []
        for r in res.rows:
            s = r.stats["sign_count"]
            if min(s.std, s.null_std) > 0:
                assert s.p == pytest.approx(float(stats.ttest_ind(s.scores, s.null, equal_var=False).pvalue))
            ps.append(s.p)
        assert [r.stats["sign_count"].p_corrected for r in res.rows] == pytest.approx(correct(ps, correction))
        assert all(r.stats["sign_count"].significant == (r.stats["sign_count"].p_corrected < 0.05) for r in res.rows)


# ---------------------------------------------------------------------------------------------------- token models


def _directional(model: nn.Module, layer: nn.Module, x: Tensor, cls: int, v: Tensor, where: str) -> Tensor:
    """d/de logit_cls(a + e v) at e = 0, v added to every token (mean) or the class token (cls): by autograd on e."""
    e = torch.zeros(x.shape[0], requires_grad=True)

    def hook(module: nn.Module, args: object, out: Tensor) -> Tensor:
        shift = e[:, None, None] * v
        if where == "cls":
            return torch.cat([out[:, :1] + shift, out[:, 1:]], 1)
        return out + shift

    with hv.HookManager(model) as hooks:
        hooks.forward(layer, hook)
        logit = model(x)[:, cls].sum()
    return torch.autograd.grad(logit, e)[0]


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_token_model_pools_and_differentiates_along_the_cav(pool: str) -> None:
    torch.manual_seed(0)
    model = TinyViT().eval()
    x = torch.randn(10, 3, 8, 8, generator=_gen(0))
    concept = torch.randn(6, 3, 8, 8, generator=_gen(1)) + 1
    pool_examples = torch.randn(20, 3, 8, 8, generator=_gen(2))
    tcav = hv.TCAV(model, "encoder", pool=pool)  # type: ignore[arg-type]
    res = tcav.interpret(x, {"bright": concept}, pool_examples, target=1, n_random=3, random_size=6)
    cavs = tcav.compute_cavs({"bright": concept}, pool_examples, n_random=3, random_size=6)["encoder"]["bright"]
    assert cavs.shape == (3, 8)
    # the cached activations are the pooled token outputs
    with torch.no_grad():
        tokens = hv.ActivationRecorder(model, "encoder").record([concept])["encoder"]
    pooled = tokens[:, 0] if pool == "cls" else tokens.mean(1)
    torch.testing.assert_close(tcav._acts["bright"].acts["encoder"], pooled, rtol=1e-5, atol=1e-6)
    # the sign count is the fraction of inputs whose logit rises when the layer moves along the CAV
    for j in range(3):
        d = _directional(model, model.encoder, x, 1, cavs[j], pool)
        assert res.row(1, "bright", "encoder").stats["sign_count"].scores[j] == pytest.approx(
            float((d > 0).mean(dtype=torch.float32))
        )
        ratio = float(d.clamp_min(0).sum() / d.abs().sum())
        assert res.row(1, "bright", "encoder").stats["magnitude"].scores[j] == pytest.approx(ratio, rel=1e-5, abs=1e-6)


def test_zoo_vit_class_token_and_cls_pool_refuses_maps() -> None:
    from hookviz.zoo import ShapesViT

    torch.manual_seed(0)
    model = ShapesViT(4, dim=16, depth=2, heads=2, size=32).eval()
    x = torch.rand(6, 3, 32, 32, generator=_gen(0))
    res = hv.TCAV(model, "blocks.?", pool="cls").interpret(
        x, {"c": torch.rand(5, 3, 32, 32, generator=_gen(1))}, torch.rand(12, 3, 32, 32, generator=_gen(2)), n_random=2
    )
    assert res.layers == ["blocks.0", "blocks.1"] and len(res.rows) == len(res.classes) * 2
    with pytest.raises(ValueError, match=r"pool='cls' takes the class token .* layer 'conv1' outputs shape"):
        hv.TCAV(SmallCNN(), "conv1", pool="cls").interpret(
            torch.randn(3, 3, 8, 8), {"c": torch.randn(3, 3, 8, 8)}, torch.randn(6, 3, 8, 8), n_random=2
        )


# ----------------------------------------------------------------------------------------------- forms and caching


class Counting(SmallCNN):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return super().forward(x)


def test_example_forms_and_activation_cache(tmp_path) -> None:
    from PIL import Image

    torch.manual_seed(0)
    model = Counting().eval()
    model.hookviz_preset = hv.Preset("tiny", 8, 8, None, None)  # the model's own preprocessing ("auto")
    folder = tmp_path / "round"
    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    for i in range(4):
        pixels = (torch.rand(8, 8, 3, generator=g) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(folder / f"{i}.png")
    (folder / "notes.txt").write_text("not an image")
    files = sorted(str(p) for p in folder.glob("*.png"))
    data = torch.randn(30, 3, 8, 8, generator=g)
    dataset = torch.utils.data.TensorDataset(data[:5], torch.zeros(5))
    concepts = {
        "folder": str(folder),
        "files": files,
        "dataset": dataset,
        "loader": torch.utils.data.DataLoader(data[5:9], batch_size=3),
        "list": [t for t in data[9:12]],
    }
    tcav = hv.TCAV(model, ["conv1", "conv2"], batch_size=4)
    res = tcav.interpret(data[12:16], concepts, data[16:], target=0, n_random=2, random_size=4)
    assert [r.concept for r in res.rows[::2]] == list(concepts)
    # the folder and the file list are the same images through the same preprocessing
    torch.testing.assert_close(tcav._acts["folder"].acts["conv1"], tcav._acts["files"].acts["conv1"])
    assert tcav._acts["folder"].acts["conv1"].shape == (4, 6 * 8 * 8)  # flattened (N, C*H*W), as in the paper
    calls = model.calls
    again = tcav.interpret(data[12:16], concepts, data[16:], target=1, n_random=2, random_size=4)
    assert model.calls == calls + 1  # the concepts and the random pool come from the cache: one pass for the inputs
    assert again.classes == [1]
    before = len(tcav._cavs)
    tcav.interpret(data[12:16], concepts, data[16:], target=1, n_random=2, random_size=4)
    assert len(tcav._cavs) == before  # no CAV trained again either
    data[16:].mul_(2.0)  # changed in place: the random pool's version moves, so its activations are computed again
    calls = model.calls
    tcav.interpret(data[12:16], concepts, data[16:], target=1, n_random=2, random_size=4)
    assert model.calls == calls + 1 + 4  # the inputs, and the pool's 14 examples in batches of 4


# ----------------------------------------------------------------------------------------------------- bad input


def test_errors_before_any_work() -> None:
    model = Counting().eval()
    x = torch.randn(4, 3, 8, 8)
    rand = torch.randn(10, 3, 8, 8)
    with pytest.raises(ValueError, match=r"layers\[1\]: selector 'conv9' matches no module of Counting; closest"):
        hv.TCAV(model, ["conv1", "conv9"])
    tcav = hv.TCAV(model, "conv*")
    assert list(tcav.layers) == ["conv1", "conv2"]
    with pytest.raises(ValueError, match=r"concepts\['one'\] has 1 example\(s\); .* at least 2"):
        tcav.interpret(x, {"fine": torch.randn(3, 3, 8, 8), "one": torch.randn(1, 3, 8, 8)}, rand)
    with pytest.raises(ValueError, match=r"random has 1 example"):
        tcav.interpret(x, {"fine": torch.randn(3, 3, 8, 8)}, rand[:1])
    with pytest.raises(ValueError, match=r"n_random must be an int >= 2"):
        tcav.interpret(x, {"fine": torch.randn(3, 3, 8, 8)}, rand, n_random=1)
    with pytest.raises(ValueError, match=r"concepts\['gray'\] has 1 channels .* expects 3"):
        tcav.interpret(x, {"gray": torch.randn(3, 1, 8, 8)}, rand)
    assert model.calls == 0 and not tcav._acts
    with pytest.raises(ValueError, match="cav must be one of 'logistic', 'mean', got 'svm'"):
        hv.TCAV(model, "conv1", cav="svm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pool must be one of"):
        hv.TCAV(model, "conv1", pool="max")  # type: ignore[arg-type]


def test_model_refusing_a_concept_is_named() -> None:
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))
    tcav = hv.TCAV(model, "0")
    with pytest.raises(ValueError, match=r"concepts\['wide'\]: the model refused these examples of shape \(3, 7\)"):
        tcav.interpret(torch.randn(4, 5), {"ok": torch.randn(3, 5), "wide": torch.randn(3, 7)}, torch.randn(8, 5))
    with pytest.raises(ValueError, match="target class 5 is out of range: the model outputs 2 classes"):
        tcav.interpret(torch.randn(4, 5), {"ok": torch.randn(3, 5)}, torch.randn(8, 5), target=5)


# ------------------------------------------------------------------------------------------------ model restored


class Boom(Exception):
    pass


@pytest.mark.parametrize("eval_mode", [True, False])
@pytest.mark.parametrize("ending", ["normal", "error", "interrupt"])
def test_model_and_process_restored(ending: str, eval_mode: bool) -> None:
    from test_invariant_suite import Snapshot, build, check_untouched

    model = build("shapes_vit")  # mid training step: mixed modes, frozen block, some .grad set, some None
    x = torch.randn(2, 3, 32, 32)
    snap = Snapshot(model, x)
    tcav = hv.TCAV(model, ["blocks.0", "blocks.1.norm1"], pool="mean", eval_mode=eval_mode)
    concepts = {"c": torch.randn(3, 3, 32, 32)}
    handle = None
    if ending != "normal":
        exc = Boom("boom") if ending == "error" else KeyboardInterrupt()

        def raise_(module: nn.Module, args: object, out: object) -> None:
            raise exc

        handle = model.blocks[1].register_forward_hook(raise_)
    try:
        with torch.no_grad():  # TCAV switches grad on for itself and back off
            res = tcav.interpret(torch.randn(3, 3, 32, 32), concepts, torch.randn(8, 3, 32, 32), n_random=2)
        assert ending == "normal" and len(res.rows) == len(res.classes) * 2
    except (Boom, KeyboardInterrupt):
        assert ending != "normal"
    finally:
        if handle is not None:
            handle.remove()
    check_untouched(model, x, snap, grad_enabled=True)


def test_train_mode_forwards_leave_batchnorm_statistics() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    model.train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hv.TCAV(model, "1", eval_mode=False).interpret(
        torch.randn(4, 3, 8, 8), {"c": torch.randn(4, 3, 8, 8)}, torch.randn(8, 3, 8, 8), target=0, n_random=2
    )
    assert model.training and all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


# --------------------------------------------------------------------------------------------------- the result


def test_table_dict_and_figure() -> None:
    model = Linear2()
    w = model.head.weight.detach()
    rand = torch.randn(40, 4, generator=_gen(1))
    concepts = {"up": torch.randn(20, 4, generator=_gen(2)) + 3 * w[0], "noise": torch.randn(20, 4, generator=_gen(3))}
    res = hv.TCAV(model, "body").interpret(
        torch.randn(8, 4, generator=_gen(0)), concepts, rand, target=[0, 0, 0, 0, 2, 2, 2, 2], n_random=5
    )
    table = res.table()
    assert table.splitlines()[0].startswith("| class | concept | layer | sign_count (mean ± std)")
    assert len(table.splitlines()) == 2 + 4 + 2
    assert "bonferroni correction over 4 tests" in table
    assert "n.s." in str(res) or "yes" in str(res)
    d = res.to_dict()
    json.dumps(d)  # plain data
    assert d["classes"] == [0, 2] and d["rows"][0]["sign_count"]["scores"] == [1.0] * 5
    assert set(d["rows"][0]["magnitude"]) >= {"mean", "std", "p", "p_corrected", "significant", "null"}
    fig = res.figure()
    assert len(fig.axes) == 2
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == 2 and all(t in ("n.s.", "*", "**", "***") for t in texts)
    ax = res.plot("magnitude", cls=2)
    assert ax.get_ylabel() == "TCAV magnitude"
    with pytest.raises(ValueError, match="score must be one of"):
        res.table("mean")  # type: ignore[arg-type]


def test_shapes_concepts_are_deterministic_images_of_what_they_say() -> None:
    from hookviz.zoo import CONCEPT_NAMES, shapes, shapes_concepts

    sets = shapes_concepts(4, seed=3)
    assert tuple(sets) == CONCEPT_NAMES
    for name, x in sets.items():
        assert x.shape == (4, 3, 64, 64) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1, name
        assert torch.equal(x, shapes_concepts(4, seed=3)[name])
    other = shapes(80, seed=3)
    torch.testing.assert_close(sets["circle shape"], other.images[other.labels == 0][:4], rtol=0, atol=0)
    torch.testing.assert_close(sets["random images"], shapes(4, seed=7).images, rtol=0, atol=0)
    with pytest.raises(ValueError, match="n"):
        shapes_concepts(1)


def test_activations_are_the_layer_outputs_before_an_in_place_operation_after_it() -> None:
    # a ReLU(inplace=True) after the layer (as after the shapes CNN's features.1) must not reach the recorded
    # activations: the CAVs live where the gradients are taken, at the layer's own output
    class InPlaceAfter(Linear2):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.ReLU(inplace=True)

        def forward(self, x: Tensor) -> Tensor:
            return self.head(self.act(self.body(x)))

    model = InPlaceAfter()
    concept = torch.randn(6, 4, generator=_gen(8)) - 1  # mostly negative: a ReLU would change them
    pool = torch.randn(40, 4, generator=_gen(9))
    tcav = hv.TCAV(model, "body", cav="mean", batch_size=4)  # several chunks per set
    cavs = tcav.compute_cavs({"c": concept}, pool, n_random=2, random_size=5, seed=1)["body"]
    torch.testing.assert_close(tcav._acts["c"].acts["body"], concept, rtol=0, atol=1e-6)
    draw = type(tcav)._random_sets(40, 4, 5, 1)
    d = concept.double().mean(0) - pool[draw[0]].double().mean(0)
    torch.testing.assert_close(cavs["c"][0].double(), d / d.norm(), rtol=0, atol=1e-6)
