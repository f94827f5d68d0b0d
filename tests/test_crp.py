"""CRP (hookviz.concepts.crp): zennit-crp's toy values by hand, the sum over a layer's channels, float64 references
written from the paper (Achtibat et al., 2023, Nature Machine Intelligence 5) for a small CNN, an MLP and a ViT
block, K conditions against K calls, concept relevance, heads, children, RelMax against brute force (resumed,
sharded), bad input, the model and process restored.

Tolerances: float64 throughout where values are compared; a map computed two ways (K conditions vs. K calls, a sum
of K maps vs. one map, the engine vs. a hand route of the same formulas) differs by the rounding of the sums in
between: each value is a sum of products of O(1) numbers over at most a few thousand terms, so 1e-12 of the
largest |value| (about 4500 float64 ulps at 2^-52) bounds it with room; the toy values are exact integers (1e-12).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import hookviz as hv
from hookviz.concepts.crp import Heads
from hookviz.methods.lrp import composite
from hookviz.methods.lrp.rules import stabilize
from hookviz.zoo.model import ShapesCNN

TOL = 1e-12


def close(a: Tensor, b: Tensor, tol: float = TOL) -> None:
    scale = max(b.abs().max().item(), 1e-30)
    err = (a - b).abs().max().item() / scale
    assert err <= tol, f"relative error {err:.3g} > {tol}"


# ---------------------------------------------------------------------------------------------- zennit-crp's toy
class Toy(nn.Module):
    """zennit-crp's test model: two parallel Linear(2, 2) on the input, concatenated into Linear(4, 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(2, 2, bias=False)
        self.linear_2 = nn.Linear(2, 2, bias=False)
        self.linear_3 = nn.Linear(4, 1, bias=False)
        with torch.no_grad():
            self.linear_1.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
            self.linear_2.weight.copy_(torch.tensor([[2.0, 3.0], [0.0, 0.0]]))
            self.linear_3.weight.copy_(torch.tensor([[1.0, 4.0, 5.0, 0.0]]))

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_3(torch.cat([self.linear_1(x), self.linear_2(x)], 1))


def test_toy_values_by_hand() -> None:
    # x = [-1, 1]: linear_1 gives z1 = [1*-1 + 2*1, 0*-1 + 1*1] = [1, 1], linear_2 gives z2 = [2*-1 + 3*1, 0] = [1, 0];
    # out = 1*1 + 4*1 + 5*1 + 0*0 = 10. Epsilon-plus on linear layers is LRP-epsilon (eps 1e-6, negligible here):
    # the layer relevances are w_j a_j / out * out = [1, 4] and [5, 0]. Below, R_i = sum_j x_i W_ji / z_j R_j:
    #   linear_1 channel 0 (z = 1, R = 1): [-1 * 1, 1 * 2] = [-1, 2]; channel 1 (z = 1, R = 4): [0, 1 * 1 * 4] = [0, 4]
    #   linear_2 channel 0 (z = 1, R = 5): [-1 * 2 * 5, 1 * 3 * 5] = [-10, 15]; channel 1: R = 0
    # total [-11, 21]. Conditioned on linear_1's channel 0, only the relevance through that neuron stays, and the
    # parallel branch linear_2 is no path through the condition: [-1, 2] (zennit-crp's exclude_parallel=True).
    m = Toy().double()
    x = torch.tensor([[-1.0, 1.0]], dtype=torch.float64)
    crp = hv.CRP(m, "epsilon-plus")
    tol = 1e-5  # eps = 1e-6 in denominators of size 1 and relevance of size 10: 1e-5 absolute
    assert torch.allclose(crp.attribute(x, 0), torch.tensor([[-11.0, 21.0]], dtype=torch.float64), atol=tol)
    assert torch.allclose(crp.concept_relevance(x, 0, "linear_1"), torch.tensor([[1.0, 4.0]]).double(), atol=tol)
    assert torch.allclose(crp.concept_relevance(x, 0, "linear_2"), torch.tensor([[5.0, 0.0]]).double(), atol=tol)
    assert torch.allclose(crp.concept_relevance(x, 0, "linear_3"), torch.tensor([[10.0]]).double(), atol=tol)
    cond = crp.attribute(x, 0, conditions={"linear_1": 0})
    assert torch.allclose(cond, torch.tensor([[-1.0, 2.0]], dtype=torch.float64), atol=tol)
    many = crp.attribute(x, 0, conditions=[{"linear_1": 0}, {"linear_1": [1]}, {"linear_2": torch.tensor([0, 1])}])
    expect = torch.tensor([[[-1.0, 2.0], [0.0, 4.0], [-10.0, 15.0]]], dtype=torch.float64)
    assert many.shape == (1, 3, 2) and torch.allclose(many, expect, atol=tol)
    kids = crp.children(x, 0, ("linear_3", 0), "linear_1", top=2)
    assert kids.channels.tolist() == [[1, 0]] and torch.allclose(kids.shares, torch.tensor([[4.0, 1.0]]).double())
    assert torch.allclose(kids.total, torch.tensor([10.0]).double(), atol=tol)


# ------------------------------------------------------------------------------ the sum over a layer's channels
def shapes_cnn() -> nn.Module:
    torch.manual_seed(0)
    m = ShapesCNN().double().eval()
    with torch.no_grad():  # BatchNorm statistics away from the identity, so that folding matters
        for b in m.modules():
            if isinstance(b, nn.BatchNorm2d):
                b.running_mean.uniform_(-0.2, 0.2)
                b.running_var.uniform_(0.5, 2.0)
                b.weight.uniform_(0.5, 1.5)
                b.bias.uniform_(-0.1, 0.1)
    return m


@pytest.mark.filterwarnings("ignore:LRP. operations that no rule covers")  # LRP(layer=)'s own tap, not CRP's
@pytest.mark.parametrize("comp", ["epsilon-plus-flat", "epsilon", "epsilon-alpha2-beta1", "epsilon-gamma-box"])
def test_sum_over_channels_is_the_unconditional_map_cnn(comp: str) -> None:
    # every path passes through features.3 (conv -> BN -> ReLU -> pool -> head): the maps of its 96 channels add up
    m = shapes_cnn()
    x = torch.rand(2, 3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    kw = {"low": -2.0, "high": 2.0} if comp == "epsilon-gamma-box" else {}
    crp = hv.CRP(m, comp, **kw)
    full = crp.attribute(x, 1)
    maps = crp.attribute(x, 1, conditions=[{"features.3": c} for c in range(96)])
    assert maps.shape == (2, 96, 3, 64, 64)
    close(maps.sum(1), full)
    shares = crp.concept_relevance(x, 1, "features.3")
    # the folded conv+BN's relevance is at the BatchNorm's output: the same numbers named either way
    close(shares, crp.concept_relevance(x, 1, "features.4"))
    at_layer = hv.LRP(m, comp, layer="features.4", **kw).attribute(x, 1)
    close(shares.sum(1), at_layer.flatten(1).sum(1))
    # each channel's map holds what its share says where the rules conserve below it: not asserted (flat / biases)


class Block(nn.Module):
    """A small pre-norm ViT block on tokens (N, T, D) with explicit attention ops (q kᵀ, softmax, p v): the attention
    with a residual, then an MLP whose output is the block's (no residual, so that every path passes through its
    hidden neurons), mean-pooled into a linear head."""

    def __init__(self, d: int = 8, heads: int = 2, hidden: int = 12, classes: int = 3) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.attn.heads = heads
        self.fc1, self.act, self.fc2 = nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d)
        self.head = nn.Linear(d, classes)

    def ops(self, x: Tensor, hand: bool) -> tuple[Tensor, dict[str, Tensor]]:
        """The forward pass; ``hand=True``: AttnLRP's rules with zero stabilizers written as modified functions
        (Achtibat et al., 2024, Sec. 3.4): LayerNorm with its std held, products split half/half (a b.detach() +
        a.detach() b) / 2, GELU's identity rule x (gelu(x) / x).detach(); linear maps and softmax as they are."""
        taps: dict[str, Tensor] = {}

        def norm(t: Tensor, ln: nn.LayerNorm) -> Tensor:
            if not hand:
                return ln(t)
            mu = t.mean(-1, keepdim=True)
            std = (t.var(-1, unbiased=False, keepdim=True) + ln.eps).sqrt().detach()
            return (t - mu) / std * ln.weight + ln.bias

        def mul(a: Tensor, b: Tensor) -> Tensor:
            return a @ b if not hand else (a @ b.detach() + a.detach() @ b) / 2

        n, t, d = x.shape
        q, k, v = self.attn.qkv(norm(x, self.norm1)).reshape(n, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        p = torch.softmax(mul(q, k.transpose(-1, -2)) * (d // self.heads) ** -0.5, -1)
        o = mul(p, v).transpose(1, 2).reshape(n, t, d)
        taps["heads"] = o
        x = x + self.attn.proj(o)
        h = self.fc1(norm(x, self.norm2))
        a = self.act(h) if not hand else h * (F.gelu(h) / h).detach()
        taps["act"] = a
        y = self.fc2(a)
        return self.head(y.mean(1)), taps

    def forward(self, x: Tensor) -> Tensor:
        return self.ops(x, hand=False)[0]


def block() -> Block:
    torch.manual_seed(2)
    return Block().double().eval()


def test_sum_over_channels_is_the_unconditional_map_vit_mlp() -> None:
    m = block()
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    for comp in ("attn-lrp", "cp-lrp"):
        crp = hv.CRP(m, comp)
        full = crp.attribute(x, 2)
        maps = crp.attribute(x, 2, conditions=[{"act": c} for c in range(12)])
        close(maps.sum(1), full)
        # the heads of the attention: one of its paths (the residual) passes by them, so their sum is the relevance
        # through the attention alone: the map conditioned on all heads at once
        heads = crp.attribute(x, 2, conditions=[{"attn": Heads(h)} for h in range(2)])
        close(heads.sum(1), crp.attribute(x, 2, conditions={"attn": Heads([0, 1])}))


# --------------------------------------------------------------------------------- float64 references by hand
def lrp_dense(layers: list[tuple[Tensor, str]], x: Tensor, target: int, masks: dict[int, Tensor]) -> Tensor:
    """LRP written from the formulas (Bach et al. 2015; zennit's stabilizer) for a chain of bias-free linear maps
    W (out, in) with ReLU between them: rule "epsilon": R_j = Σ_k a_j W_kj / stab(z_k) R_k; "zplus":
    R_j = Σ_k (a_j^+ W_kj^+ + a_j^- W_kj^-) / stab(z_k^+) R_k. CRP: R at the output of layer i times masks[i]."""
    acts = [x]
    for i, (w, _) in enumerate(layers):
        z = acts[-1] @ w.T
        acts.append(z.clamp(min=0) if i < len(layers) - 1 else z)
    r = torch.zeros_like(acts[-1])
    r[:, target] = acts[-1][:, target]
    for i in range(len(layers) - 1, -1, -1):
        if i in masks:
            r = r * masks[i]
        w, rule = layers[i]
        a = acts[i]
        if rule == "epsilon":
            r = a * ((r / stabilize(a @ w.T)) @ w)
        else:
            wp, wn = w.clamp(min=0), w.clamp(max=0)
            ap, an = a.clamp(min=0), a.clamp(max=0)
            s = r / stabilize(ap @ wp.T + an @ wn.T)
            r = ap * (s @ wp) + an * (s @ wn)
    return r


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 3, 3, bias=False)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(3, 4, 3, bias=False)
        self.relu2 = nn.ReLU()
        self.flat = nn.Flatten()
        self.fc = nn.Linear(4 * 2 * 2, 3, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.flat(self.relu2(self.conv2(self.relu1(self.conv1(x))))))


def dense(conv: nn.Conv2d, shape: tuple[int, int, int]) -> Tensor:
    """The convolution as a matrix (out, in) over flattened (C, H, W): its outputs for the unit vectors."""
    eye = torch.eye(int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(-1, *shape)
    return conv(eye).flatten(1).T.detach()


def test_cnn_reference_from_the_formulas() -> None:
    torch.manual_seed(4)
    m = SmallCNN().double()
    x = torch.randn(3, 2, 6, 6, dtype=torch.float64)
    w1, w2 = dense(m.conv1, (2, 6, 6)), dense(m.conv2, (3, 4, 4))
    layers = [(w1, "zplus"), (w2, "zplus"), (m.fc.weight.detach(), "epsilon")]
    crp = hv.CRP(m, "epsilon-plus")
    # the relevance the engine and the formulas give, then conditioned on conv2's channels 1 and 3 (conv2's output
    # flattened: channel c is entries c*4 ... c*4+3), on conv1's channel 0, and on both layers at once
    c2 = torch.zeros(4, 2, 2, dtype=torch.float64)
    c2[[1, 3]] = 1
    c1 = torch.zeros(3, 4, 4, dtype=torch.float64)
    c1[0] = 1
    cases = [({}, {}), ({"conv2": [1, 3]}, {1: c2.flatten()}), ({"conv1": 0}, {0: c1.flatten()}),
             ({"conv2": [1, 3], "conv1": 0}, {1: c2.flatten(), 0: c1.flatten()})]  # fmt: skip
    got = crp.attribute(x, 2, conditions=[c for c, _ in cases])
    for k, (_, masks) in enumerate(cases):
        ref = lrp_dense(layers, x.flatten(1), 2, masks).reshape(x.shape)
        close(got[:, k], ref)
    # per-channel relevance at conv2: the reference's relevance at conv2's output summed per channel
    shares = crp.concept_relevance(x, 2, "conv2")
    acts = m.relu2(m.conv2(m.relu1(m.conv1(x)))).flatten(1)
    r_top = torch.zeros(3, 3, dtype=torch.float64)
    r_top[:, 2] = m(x)[:, 2]
    r2 = acts * ((r_top / stabilize(acts @ m.fc.weight.T)) @ m.fc.weight)
    close(shares, r2.detach().reshape(3, 4, 4).sum(-1))


def test_vit_block_reference_by_modified_autograd() -> None:
    m = block()
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    crp = hv.CRP(m, composite("attn-lrp", epsilon=0, stabilizer=0))

    def reference(mask_act: Tensor | None, mask_heads: Tensor | None) -> Tensor:
        # the paper's recipe by hand: relevance at the layer (a ⊙ g of the modified functions), the other channels
        # set to zero, then propagated from the layer with the same modified functions
        leaf = x.clone().requires_grad_(True)
        out, taps = m.ops(leaf, hand=True)
        score = out[:, 1].sum()
        if mask_act is None and mask_heads is None:
            return leaf * torch.autograd.grad(score, leaf)[0]
        if mask_act is not None:
            (g,) = torch.autograd.grad(score, taps["act"], retain_graph=True)
            return leaf * torch.autograd.grad(taps["act"], leaf, g * mask_act)[0]
        (g,) = torch.autograd.grad(score, taps["heads"], retain_graph=True)
        return leaf * torch.autograd.grad(taps["heads"], leaf, g * mask_heads)[0]

    full = crp.attribute(x, 1)
    close(full, reference(None, None))
    neurons = torch.zeros(12, dtype=torch.float64)
    neurons[[0, 5, 7]] = 1
    close(crp.attribute(x, 1, conditions={"act": [0, 5, 7]}), reference(neurons, None))
    head1 = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1], dtype=torch.float64)  # head 1 = features 4..7
    close(crp.attribute(x, 1, conditions={"attn": Heads(1)}), reference(None, head1))
    close(crp.attribute(x, 1, conditions={"attn.proj": Heads([1], num_heads=2)}), reference(None, head1))
    # per-neuron relevance at the MLP: a ⊙ g of the modified functions
    leaf = x.clone().requires_grad_(True)
    out, taps = m.ops(leaf, hand=True)
    g_act, g_heads = torch.autograd.grad(out[:, 1].sum(), [taps["act"], taps["heads"]])
    close(crp.concept_relevance(x, 1, "act"), (taps["act"] * g_act).detach().sum(1))
    per_head = (taps["heads"] * g_heads).detach().unflatten(-1, (2, 4)).sum((1, 3))
    close(crp.concept_relevance(x, 1, "attn", heads=2), per_head)


# ------------------------------------------------------------------------------------ batching and measurement
def test_k_conditions_equal_k_calls_and_shares_sum() -> None:
    m = shapes_cnn()
    x = torch.rand(2, 3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    crp = hv.CRP(m, "epsilon-plus-flat")
    conds = [{"features.3": [c, c + 1]} for c in range(0, 8, 2)] + [{"conv3": 5, "features.0": [1, 2]}]
    many = crp.attribute(x, [0, 3], conditions=conds)
    for k, cond in enumerate(conds):
        close(many[:, k], crp.attribute(x, [0, 3], conditions=cond))
    # the shares at a layer under a condition set at a later one: the later layer's channels, split further
    shares = crp.concept_relevance(x, 2, "conv3", conditions=[{"features.3": c} for c in range(4)])
    assert shares.shape == (2, 4, 64)
    at = crp.concept_relevance(x, 2, "features.3")
    for c in range(4):
        kids = crp.children(x, 2, ("features.3", c), "conv3", top=3)
        close(kids.relevance, shares[:, c])
        close(kids.total, at[:, c])
        assert torch.equal(kids.channels, shares[:, c].topk(3, dim=1).indices)


# ------------------------------------------------------------------------------------------------- bad input
def test_errors_before_any_work() -> None:
    m = shapes_cnn()
    x = torch.rand(1, 3, 64, 64, dtype=torch.float64)
    crp = hv.CRP(m, "epsilon-plus-flat")
    calls = []
    handle = m.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(ValueError, match=r"conditions\['features.3'\]: channels \[96, 200\] out of range.*96 channels"):
        crp.attribute(x, 0, conditions={"features.3": [3, 96, 200]})
    with pytest.raises(ValueError, match=r"conditions\[1\]\['conv1'\]: channels \[16\]"):
        crp.attribute(x, 0, conditions=[{"conv1": 0}, {"conv1": 16}])
    assert len(calls) == 2  # one forward pass each, no backward work
    handle.remove()
    with pytest.raises(ValueError, match=r"conditions: layer: selector 'features.9' matches no module"):
        crp.attribute(x, 0, conditions={"features.9": 0})
    with pytest.raises(ValueError, match="ran 2 times"):
        crp.attribute(x, 0, conditions={"relu": 0})  # the shared ReLU
    with pytest.raises(ValueError, match=">= 0"):
        crp.attribute(x, 0, conditions={"conv1": -1})
    with pytest.raises(TypeError, match="channels must be"):
        crp.attribute(x, 0, conditions={"conv1": 1.5})
    with pytest.raises(TypeError, match="conditions must be a dict"):
        crp.attribute(x, 0, conditions="conv1")
    with pytest.raises(ValueError, match="no layer="):
        hv.CRP(m, layer="conv1")
    with pytest.raises(ValueError, match="runs after"):
        crp.concept_relevance(x, 0, "features.3", conditions={"conv3": 0})
    with pytest.raises(ValueError, match="nn.MultiheadAttention"):
        mha = nn.Sequential(nn.Linear(4, 4))
        mha.attn = nn.MultiheadAttention(4, 2)
        hv.CRP(mha, "attn-lrp").attribute(torch.randn(1, 4), 0, conditions={"attn": Heads(0)})
    with pytest.raises(ValueError, match="heads"):
        hv.CRP(block(), "attn-lrp").attribute(torch.randn(1, 5, 8).double(), 0, conditions={"attn": Heads(2)})
    with pytest.raises(ValueError, match="one target per input"):
        crp.attribute(x, torch.tensor([[0, 1]]), conditions={"conv1": 0})


# ------------------------------------------------------------------------------------------- model restored
class Boom(Exception):
    pass


@pytest.mark.parametrize("ending", ["normal", "error", "bad-channel"])
def test_model_and_process_restored(ending: str) -> None:
    from test_invariant_suite import Snapshot, build, check_untouched

    model = build("resnet18")  # mid training step: mixed modes, frozen block, some .grad set, some None
    x = torch.randn(2, 3, 32, 32)
    snap = Snapshot(model, x)
    crp = hv.CRP(model, "epsilon-plus-flat")
    handle = None
    if ending == "error":

        def raise_(module: nn.Module, args: object, out: object) -> None:
            raise Boom("boom")

        handle = model.layer4.register_forward_hook(raise_)
    with torch.no_grad():  # CRP switches grad on for itself and back off
        try:
            channels = 64 if ending == "bad-channel" else 3
            crp.attribute(x, 1, conditions=[{"layer1.0.conv1": channels}, {"layer3": [0, 1], "layer2.1": 4}])
            crp.concept_relevance(x, 1, "layer2")
            assert ending == "normal"
        except (Boom, ValueError):
            assert ending != "normal"
        finally:
            if handle is not None:
                handle.remove()
        check_untouched(model, x, snap, grad_enabled=False)


# ------------------------------------------------------------------------------------------ transformers at large
@pytest.mark.filterwarnings("ignore:LRP. operations that no rule covers")  # LRP(layer=)'s own, before the layer
def test_torchvision_vit_and_zoo_vit_neurons_and_heads() -> None:
    from torchvision.models import VisionTransformer

    from hookviz.zoo.vit import ShapesViT

    torch.manual_seed(7)
    tv = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                           num_classes=4).double().eval()  # fmt: skip
    x = torch.rand(2, 3, 32, 32, dtype=torch.float64)
    for comp in ("attn-lrp", "cp-lrp"):
        crp = hv.CRP(tv, comp)
        layer = "encoder.layers.encoder_layer_1.mlp.1"  # the GELU: 32 neurons per token
        maps = crp.attribute(x, 1, conditions=[{layer: c} for c in range(32)])
        close(maps.sum(1), crp.attribute(x, 1, conditions={layer: list(range(32))}))
        shares = crp.concept_relevance(x, 1, layer)
        assert shares.shape == (2, 32)
        # the neurons' shares: the relevance through the MLP at its hidden layer, as LRP measures it there
        at = hv.LRP(tv, comp, layer=layer).attribute(x, 1)
        close(shares.sum(1), at.flatten(1).sum(1))
    vit = ShapesViT(4, dim=16, depth=1, heads=2, size=32).double().eval()
    crp = hv.CRP(vit, "attn-lrp")
    heads = crp.attribute(x, 0, conditions=[{"blocks.0.attn": Heads(h)} for h in range(2)])
    close(heads.sum(1), crp.attribute(x, 0, conditions={"blocks.0.attn": Heads([0, 1])}))
    assert crp.concept_relevance(x, 0, "blocks.0.attn", heads=2).shape == (2, 2)


# ----------------------------------------------------------------------------------------------------- RelMax
class Items(torch.utils.data.Dataset):
    """(image, label) items; ``fail_at``: the item whose read raises once (a run killed in the middle)."""

    def __init__(self, images: Tensor, labels: Tensor, fail_at: int | None = None) -> None:
        self.images, self.labels, self.fail_at = images, labels, fail_at

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        if i == self.fail_at:
            self.fail_at = None
            raise KeyboardInterrupt("killed")
        return self.images[i], self.labels[i]


def brute_top(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top k per column of (N, C) scores over all N at once, ties by the lower index: (C, k) indices and scores."""
    order = torch.argsort(scores.T.double(), dim=1, descending=True, stable=True)[:, :k]
    return order, scores.T.double().gather(1, order)


@pytest.mark.parametrize("target", [None, "label"])
def test_relmax_equals_brute_force_resumed_and_sharded(tmp_path, target) -> None:
    torch.manual_seed(8)
    m = SmallCNN().eval()
    images = torch.randn(37, 2, 6, 6)
    labels = torch.randint(0, 3, (37,))
    crp = hv.CRP(m, "epsilon-plus")
    k, chans = 5, [0, 2, 3]
    # brute force: every item's channel relevance and largest activation at once
    t = labels if target == "label" else m(images).argmax(1)
    rel = crp.concept_relevance(images, t, "conv2")[:, chans]
    act = m.conv2(m.relu1(m.conv1(images))).detach().amax((2, 3))[:, chans]
    run = dict(k=k, channels=chans, target=target, batch_size=4, shard_size=10)
    one = crp.relmax(Items(images, labels), "conv2", tmp_path / "one", **run)
    for top, scores in ((one.relevance, rel), (one.activation, act)):
        idx, sc = brute_top(scores, k)
        assert torch.equal(top.indices, idx)
        # per-item passes vs one batch of 37: float32 sums in another order, 1e-6 of the scores' size
        assert torch.allclose(top.scores, sc, rtol=1e-5, atol=1e-6 * sc.abs().max().item())
    assert torch.equal(one.relevance.targets, t[one.relevance.indices])
    assert one.relevance_crops.shape == (3, k, 2, 48, 48) and one.complete
    # killed while reading item 25 (shards 0 and 1 saved), started again: the same lists
    with pytest.raises(KeyboardInterrupt):
        crp.relmax(Items(images, labels, fail_at=25), "conv2", tmp_path / "again", **run)
    again = crp.relmax(Items(images, labels), "conv2", tmp_path / "again", **run)
    for a, b in ((again.relevance, one.relevance), (again.activation, one.activation)):
        assert torch.equal(a.indices, b.indices) and torch.equal(a.scores, b.scores)
    # two ranks into one folder: rank 0 alone is incomplete; once rank 1 is in, the merged lists are one run's
    part = crp.relmax(Items(images, labels), "conv2", tmp_path / "shards", rank=0, world_size=2, **run)
    assert not part.complete and part.relevance_crops is None
    both = crp.relmax(Items(images, labels), "conv2", tmp_path / "shards", rank=1, world_size=2, **run)
    assert both.complete
    for a, b in ((both.relevance, one.relevance), (both.activation, one.activation)):
        assert torch.equal(a.indices, b.indices) and torch.equal(a.scores, b.scores)
    # another setting on the same folder is refused, the difference named
    with pytest.raises(ValueError, match="other settings.*'k': \\(5, 4\\)"):
        crp.relmax(Items(images, labels), "conv2", tmp_path / "one", **{**run, "k": 4})
    with pytest.raises(ValueError, match="channels: \\[0, 9\\] out of range"):
        crp.relmax(Items(images, labels), "conv2", tmp_path / "bad", **{**run, "channels": [0, 9]})


def test_relmax_crops_and_figure(tmp_path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    torch.manual_seed(9)
    m = SmallCNN().eval()
    images = torch.zeros(6, 2, 6, 6)
    images[:, :, 1:3, 2:4] = torch.rand(6, 2, 2, 2) + 0.5  # the content in one corner: the crops find it
    crp = hv.CRP(m, "epsilon")
    res = crp.relmax(images, "conv2", tmp_path, k=3, crop_size=8, fraction=0.5)
    box = res.activation_boxes
    # the receptive field of one conv2 unit is 5x5 input pixels (two 3x3 convolutions); its gradient reaches at most
    # that (less where a ReLU between is off)
    sizes = torch.stack([box[..., 2] - box[..., 0], box[..., 3] - box[..., 1]])
    assert bool((sizes <= 5).all()) and bool((sizes >= 1).all())
    # relevance is input x gradient: none on the zero background, so where a concept has positive relevance (its
    # score > 0) the heat map's box is inside the content; a concept with none there gets the whole image
    rb = res.relevance_boxes
    inside = (rb[..., 0] >= 1) & (rb[..., 2] <= 3) & (rb[..., 1] >= 2) & (rb[..., 3] <= 4)
    whole = (rb == torch.tensor([0, 0, 6, 6])).all(-1)
    positive = res.relevance.scores > 0
    assert bool(inside[positive].all()) and bool((inside | whole).all()) and bool(positive.any())
    fig = res.figure("relevance")
    assert len(fig.axes) == 4 * 3
    fig.savefig(tmp_path / "relmax.png")
