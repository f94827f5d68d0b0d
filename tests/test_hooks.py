"""HookManager: the seed's hand-checkable 3-4-1 network, every selector form, removal on exit and on error."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hookviz import HookError, HookManager, hook_counts, select_modules


class SeedNet(nn.Module):
    """The 3-4-1 network of the hooks tutorial in shared/seeds (002), with its hand-set weights."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 4)
        self.relu1 = nn.ReLU(inplace=inplace)
        self.fc2 = nn.Linear(4, 1)
        with torch.no_grad():
            self.fc1.weight.copy_(torch.tensor([[1.0, 2, 3], [-4, -5, -6], [7, 8, 9], [-10, -11, -12]]))
            self.fc1.bias.copy_(torch.tensor([1.0, 2, 3, 4]))
            self.fc2.weight.copy_(torch.tensor([[1.0, 2, 3, 4]]))
            self.fc2.bias.copy_(torch.tensor([1.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu1(self.fc1(x)))


def no_hooks(model: nn.Module) -> bool:
    return all(v == 0 for v in hook_counts(model).values())


@pytest.mark.parametrize("inplace", [False, True])
def test_seed_network_forward_values(inplace: bool) -> None:
    model = SeedNet(inplace=inplace)
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def record(name, module, args, output):
        # clone: with an in-place ReLU, fc1's output tensor is overwritten by relu1 afterwards
        seen[name] = (args[0].detach().clone(), output.detach().clone())

    with HookManager(model) as hooks:
        hooks.forward(lambda n, m: n != "", record, with_name=True)
        out = model(torch.ones(1, 3))
    assert torch.equal(seen["fc1"][0], torch.ones(1, 3))
    assert torch.equal(seen["fc1"][1], torch.tensor([[7.0, -13, 27, -29]]))
    assert torch.equal(seen["relu1"][1], torch.tensor([[7.0, 0, 27, 0]]))
    assert torch.equal(seen["fc2"][1], torch.tensor([[89.0]]))
    assert torch.equal(out, torch.tensor([[89.0]]))
    assert no_hooks(model)


@pytest.mark.parametrize("inplace", [False, True])
def test_seed_network_full_backward_hook_gradients(inplace: bool) -> None:
    model = SeedNet(inplace=inplace)
    grads: dict[str, tuple] = {}

    def record(name, module, grad_input, grad_output):
        grads[name] = (grad_input[0].clone(), grad_output[0].clone())

    x = torch.ones(1, 3, requires_grad=True)
    with HookManager(model) as hooks:
        hooks.backward((nn.Linear, nn.ReLU), record, with_name=True)
        assert model.relu1.inplace is False  # switched off while the full backward hook lives (pytorch#61519)
        model(x).backward()
    assert model.relu1.inplace is inplace  # restored on removal
    # full backward hooks give the gradient w.r.t. the module's *input tensor* (not the seed's (bias, x, W) tuple)
    assert torch.equal(grads["fc2"][1], torch.tensor([[1.0]]))
    assert torch.equal(grads["fc2"][0], torch.tensor([[1.0, 2, 3, 4]]))
    assert torch.equal(grads["relu1"][1], torch.tensor([[1.0, 2, 3, 4]]))
    assert torch.equal(grads["relu1"][0], torch.tensor([[1.0, 0, 3, 0]]))
    assert torch.equal(grads["fc1"][1], torch.tensor([[1.0, 0, 3, 0]]))
    assert torch.equal(grads["fc1"][0], torch.tensor([[22.0, 26, 30]]))  # W1^T [1, 0, 3, 0]
    assert torch.equal(x.grad, torch.tensor([[22.0, 26, 30]]))
    assert torch.equal(model.fc2.weight.grad, torch.tensor([[7.0, 0, 27, 0]]))
    assert torch.equal(model.fc1.weight.grad, torch.tensor([[1.0], [0], [3], [0]]).expand(4, 3))
    assert no_hooks(model)


def test_backward_hook_can_rewrite_grad_input() -> None:
    model = SeedNet()
    x = torch.ones(1, 3, requires_grad=True)
    with HookManager(model) as hooks:
        hooks.backward("relu1", lambda m, gi, go: (gi[0] * 2,))
        model(x).backward()
    assert torch.equal(x.grad, torch.tensor([[44.0, 52, 60]]))


def test_tensor_hook_doubles_gradient_like_the_seed() -> None:
    x = torch.tensor([0.0, 1, 2, 3], requires_grad=True)
    y = torch.tensor([4.0, 5, 6, 7], requires_grad=True)
    w = torch.tensor([1.0, 2, 3, 4], requires_grad=True)
    z = x + y
    seen = []
    with HookManager(nn.Identity()) as hooks:
        hooks.tensor(z, lambda g: 2 * g)
        hooks.tensor(z, lambda g: seen.append(g.clone()))  # runs after the first: sees the doubled gradient
        w.matmul(z).backward()
        assert len(hooks) == 2
    assert torch.equal(seen[0], torch.tensor([2.0, 4, 6, 8]))
    assert torch.equal(x.grad, torch.tensor([2.0, 4, 6, 8]))
    assert torch.equal(w.grad, torch.tensor([4.0, 6, 8, 10]))


def test_tensor_hook_removed_on_exit() -> None:
    x = torch.ones(3, requires_grad=True)
    z = x * 1
    with HookManager(nn.Identity()) as hooks:
        hooks.tensor(z, lambda g: g * 0)
    z.sum().backward()
    assert torch.equal(x.grad, torch.ones(3))


def test_tensor_hook_errors() -> None:
    hooks = HookManager(nn.Identity())
    with pytest.raises(ValueError, match="does not require grad"):
        hooks.tensor(torch.ones(2), lambda g: g)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        hooks.tensor([1.0], lambda g: g)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be callable"):
        hooks.tensor(torch.ones(2, requires_grad=True), 3)  # type: ignore[arg-type]
    assert len(hooks) == 0


# -- selectors ----------------------------------------------------------------------------------------------------
class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU())
        self.layer1 = nn.Sequential(nn.Conv2d(4, 4, 1))
        self.layer2 = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = self.layer2(self.layer1(self.features(x)))
        return self.head(x.mean((2, 3)))


def names(model, selector):
    return [n for n, _ in select_modules(model, selector)]


def test_selector_forms() -> None:
    m = Tiny()
    assert names(m, "features.1") == ["features.1"]
    assert names(m, "") == [""]
    assert names(m, "features.*") == ["features.0", "features.1", "features.2", "features.3"]
    assert names(m, "layer*") == ["layer1", "layer1.0", "layer2", "layer2.0", "layer2.1"]
    assert names(m, "layer?") == ["layer1", "layer2"]
    assert names(m, nn.ReLU) == ["features.1", "features.3"]
    assert names(m, (nn.BatchNorm2d, nn.Linear)) == ["layer2.1", "head"]
    assert names(m, m.layer2[0]) == ["layer2.0"]
    assert names(m, lambda n, mod: isinstance(mod, nn.Conv2d) and n.startswith("layer")) == ["layer1.0", "layer2.0"]


def test_selector_no_match_lists_closest_names() -> None:
    m = Tiny()
    with pytest.raises(
        ValueError,
        match=r"selector 'featurs\.1' matches no module of Tiny; closest module names: "
        r"'features\.1'",
    ):
        select_modules(m, "featurs.1")
    with pytest.raises(ValueError, match="'layer3.*' matches no module.*closest module names: .*'layer1'"):
        select_modules(m, "layer3.*")
    with pytest.raises(ValueError, match="selector GELU matches no module of Tiny; module types present: .*Conv2d"):
        select_modules(m, nn.GELU)
    with pytest.raises(ValueError, match="not a submodule of this model"):
        select_modules(m, nn.ReLU())
    with pytest.raises(ValueError, match="matches no module"):
        select_modules(m, lambda n, mod: False)


def test_selector_bad_types() -> None:
    m = Tiny()
    with pytest.raises(TypeError, match="not an nn.Module subclass"):
        select_modules(m, int)
    with pytest.raises(TypeError, match="selector must be"):
        select_modules(m, 3)  # type: ignore[arg-type]


def test_bad_selector_registers_nothing() -> None:
    m = Tiny()
    hooks = HookManager(m)
    with pytest.raises(ValueError):
        hooks.forward("nope", lambda *a: None)
    with pytest.raises(TypeError, match="hook fn must be callable"):
        hooks.forward(nn.ReLU, None)  # type: ignore[arg-type]
    assert len(hooks) == 0 and no_hooks(m)


def test_model_type_checked() -> None:
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        HookManager("resnet")  # type: ignore[arg-type]


# -- removal --------------------------------------------------------------------------------------------------------
def place_all(hooks: HookManager) -> None:
    hooks.forward(nn.Conv2d, lambda m, a, o: None)
    hooks.forward_pre("features.*", lambda m, a: None)
    hooks.backward(nn.ReLU, lambda m, gi, go: None)
    hooks.backward_pre("layer2.1", lambda m, go: None)


def test_removal_on_exit_and_counts() -> None:
    m = Tiny()
    with HookManager(m) as hooks:
        place_all(hooks)
        counts = hook_counts(m)
        assert counts == {"forward": 4, "forward_pre": 4, "backward": 2, "backward_pre": 1}
        assert len(hooks) == 11
        m(torch.randn(1, 3, 8, 8)).sum().backward()
    assert no_hooks(m) and len(hooks) == 0
    hooks.remove()  # idempotent


def test_removal_on_exception() -> None:
    m = Tiny()
    with pytest.raises(KeyError, match="boom"):
        with HookManager(m) as hooks:
            place_all(hooks)
            raise KeyError("boom")
    assert no_hooks(m)


def test_exception_inside_hook_propagates_and_hooks_removed() -> None:
    m = Tiny()

    def boom(module, args, out):
        raise ZeroDivisionError("in hook")

    with pytest.raises(ZeroDivisionError, match="in hook"):
        with HookManager(m) as hooks:
            hooks.forward("layer1", boom)
            m(torch.randn(1, 3, 8, 8))
    assert no_hooks(m)


def test_nested_managers_remove_only_their_own() -> None:
    m = Tiny()
    calls = []
    with HookManager(m) as outer:
        outer.forward("head", lambda mod, a, o: calls.append("outer"))
        with HookManager(m) as inner:
            inner.forward("head", lambda mod, a, o: calls.append("inner"))
            m(torch.randn(1, 3, 8, 8))
        assert hook_counts(m)["forward"] == 1
        m(torch.randn(1, 3, 8, 8))
    assert calls == ["outer", "inner", "outer"]
    assert no_hooks(m)


def test_plain_object_usage() -> None:
    m = SeedNet(inplace=True)
    hooks = HookManager(m)
    hooks.backward(nn.ReLU, lambda mod, gi, go: None)
    assert m.relu1.inplace is False
    hooks.remove()
    assert m.relu1.inplace is True and no_hooks(m)


def test_nested_inplace_flags_unwind() -> None:
    m = SeedNet(inplace=True)
    with HookManager(m) as a:
        a.backward(nn.ReLU, lambda *args: None)
        with HookManager(m) as b:
            b.backward(nn.ReLU, lambda *args: None)
        assert m.relu1.inplace is False  # still hooked by `a`
    assert m.relu1.inplace is True


def test_forward_hook_can_replace_output() -> None:
    m = SeedNet()
    with HookManager(m) as hooks:
        hooks.forward("relu1", lambda mod, a, o: o * 0)
        assert torch.equal(m(torch.ones(1, 3)), torch.tensor([[1.0]]))  # only fc2's bias remains
    assert torch.equal(m(torch.ones(1, 3)), torch.tensor([[89.0]]))


def test_forward_pre_hook_can_replace_input() -> None:
    m = SeedNet()
    with HookManager(m) as hooks:
        hooks.forward_pre("fc1", lambda mod, args: (args[0] * 0,))
        # zero input: fc1 gives its bias [1, 2, 3, 4], fc2 gives 1*1 + 2*2 + 3*3 + 4*4 + 1
        assert torch.equal(m(torch.ones(1, 3)), torch.tensor([[31.0]]))


class InplaceAfterHook(nn.Module):
    """DenseNet's pattern: a submodule's output is modified in place by the parent's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        out = F.relu(self.features(x), inplace=True)
        return self.head(out.mean((2, 3)))


def test_output_modified_in_place_later_raises_a_clear_error() -> None:
    m = InplaceAfterHook()
    with pytest.raises(HookError, match=r"modified in place afterwards.*pytorch#61519.*'features'"):
        with HookManager(m) as hooks:
            hooks.backward("features", lambda *a: None)
            m(torch.randn(1, 3, 8, 8))
    assert no_hooks(m)


def test_a_selection_is_handed_back_as_resolved() -> None:
    """`Selection`: pairs resolved in one walk of the model (the rule engine's, at every call), registered without
    walking it again; an empty one names no module, like any selector that matches nothing."""
    from hookviz.hooks import Selection

    model = SeedNet()
    pairs = [("fc1", model.fc1), ("fc2", model.fc2)]
    assert select_modules(model, Selection(pairs)) == pairs
    seen = []
    with HookManager(model) as hooks:
        hooks.forward(Selection(pairs), lambda name, m, args, out: seen.append(name), with_name=True)
        model(torch.ones(1, 3))
    assert seen == ["fc1", "fc2"] and hook_counts(model)["forward"] == 0
    with pytest.raises(ValueError, match="empty"):
        select_modules(model, Selection())
