"""The rule engine (hookviz.methods.rules): dispatch of module and functional calls, in-place variants, nesting
depth, scope, restore on errors and KeyboardInterrupt, the coverage report and its single warning (issue 25)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import _get_current_function_mode_stack

from hookviz import HookManager, hook_counts
from hookviz.methods.rules import Call, Rule, RuleEngine, RuleTable, function_name, out_of_place, spellings
from hookviz.methods.scope import active_call

W1 = torch.tensor([[1.0, -2.0], [0.5, 3.0]])
W2 = torch.tensor([[2.0, -1.0]])


def _identity_backward(call: Call) -> Tensor:
    """Output unchanged, derivative the identity: x + (f(x) - x).detach()."""
    return call.input + (call.output - call.input).detach()


IDENTITY = Rule("identity", _identity_backward, needs_input=True)  # it reads the input after the operation ran


class Net(nn.Module):
    """x -> W1 x -> tanh (spelled `how`) -> W2 (bias-free, hand-set weights)."""

    def __init__(self, how: str = "module") -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(2, 2, bias=False), nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.fc1.weight.copy_(W1)
            self.fc2.weight.copy_(W2)
        self.act = nn.Tanh()
        self.how = how

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc1(x)
        h = {
            "module": lambda: self.act(h),
            "torch": lambda: torch.tanh(h),
            "method": lambda: h.tanh(),
            "torch_": lambda: torch.tanh_(h),
            "method_": lambda: h.tanh_(),
        }[self.how]()
        return self.fc2(h)


def _table(rule: Rule | None = IDENTITY, **kwargs) -> RuleTable:
    return RuleTable(**kwargs).modules(nn.Tanh, rule).functions(spellings("tanh"), rule)


def _grad(model: nn.Module, table: RuleTable, x: Tensor) -> tuple[Tensor, RuleEngine]:
    with HookManager(model) as hooks:
        engine = RuleEngine(model, hooks, table, method="Test")
        leaf = x.detach().requires_grad_(True)
        with engine.forward_pass():
            out = model(leaf)
        (g,) = torch.autograd.grad(out.sum(), leaf)
    return g, engine


@pytest.mark.parametrize("how", ["module", "torch", "method", "torch_", "method_"])
def test_rule_replaces_the_backward_of_module_and_functional_calls(how: str) -> None:
    x = torch.tensor([[0.3, -0.7], [1.0, 2.0]])
    g, engine = _grad(Net(how), _table(), x)
    # the identity rule drops tanh's derivative: d/dx W2 W1 x = W2 W1 for every row, exactly
    torch.testing.assert_close(g, (W2 @ W1).expand(2, 2), rtol=0, atol=0)
    plain = torch.autograd.functional.jacobian(lambda t: Net("module")(t).sum(), x)
    assert not torch.allclose(plain, g)  # the plain gradient carries 1 - tanh^2
    kind = "module" if how == "module" else "functional"
    name = {"module": "act", "torch": "torch.tanh", "method": "Tensor.tanh", "torch_": "torch.tanh_"}
    name["method_"] = "Tensor.tanh_"
    assert engine.coverage.covered == {"identity": {name[how]: 1}}
    assert engine.coverage.by_kind["identity"][kind] == 1


@pytest.mark.parametrize("needs_input", [True, False])
@pytest.mark.parametrize("spelling", ["torch.relu_", "F.relu(inplace=True)", "+="])
def test_in_place_calls_split_only_for_rules_that_need_the_input(needs_input: bool, spelling: str) -> None:
    seen: list[tuple[bool, Tensor, bool]] = []

    def rule(call: Call) -> Tensor:
        seen.append((call.inplace, call.input.detach().clone(), call.output is call.input))
        return call.output

    table = RuleTable().functions(spellings("relu") | {Tensor.add_: "Tensor.add_"}, Rule("r", rule, needs_input))

    class M(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            h = x * 1.0
            if spelling == "torch.relu_":
                return torch.relu_(h)
            if spelling == "+=":
                h += x
                return h
            return F.relu(h, inplace=True)

    x = torch.tensor([[-1.0, 2.0]])
    g, _ = _grad(M(), table, x)
    split, before, same = seen[0]
    assert split is needs_input and same is not needs_input
    # a rule that needs the input sees it before the operation (the result is written back into it afterwards);
    # otherwise the operation ran in place and its output is its input
    after = 2 * x if spelling == "+=" else x.relu()
    torch.testing.assert_close(before, x if needs_input else after, rtol=0, atol=0)
    expected_grad = torch.tensor([[2.0, 2.0]]) if spelling == "+=" else torch.tensor([[0.0, 1.0]])
    torch.testing.assert_close(g, expected_grad, rtol=0, atol=0)


def test_in_place_module_runs_out_of_place_while_a_rule_needs_its_input() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    flags = []

    def rule(call: Call) -> Tensor:
        flags.append((call.op.inplace, call.output is call.input))
        return call.output

    with HookManager(model) as hooks:
        engine = RuleEngine(model, hooks, RuleTable().modules(nn.ReLU, Rule("r", rule, True)), method="Test")
        with engine.forward_pass():
            model(torch.randn(3, 2, requires_grad=True))
    assert flags == [(False, False)] and model[1].inplace is True


class Block(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x) * 2


class Outer(nn.Module):
    """A tanh after a hooked block that calls tanh itself."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.block(x))


def test_functional_calls_inside_a_hooked_module_are_not_seen_twice() -> None:
    seen: list[str] = []
    rule = Rule("spy", lambda call: seen.append(call.name))
    table = RuleTable().modules(Block, rule).functions({torch.tanh: "torch.tanh"}, rule)
    _, engine = _grad(Outer(), table, torch.randn(2, 3))
    # the tanh inside the block belongs to the block's rule; the one outside is its own call
    assert seen == ["block", "torch.tanh"]
    assert engine.coverage.covered == {"spy": {"block": 1, "torch.tanh": 1}}
    assert engine.depth == 0


def test_only_the_own_forward_pass_of_the_own_call_is_intercepted() -> None:
    seen: list[str] = []
    rule = Rule("spy", lambda call: seen.append(call.name))

    class M(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            with active_call():  # a nested hookviz call's work: not this engine's
                torch.tanh(x)
            return torch.tanh(x)

    model = M()
    with HookManager(model) as hooks:
        engine = RuleEngine(model, hooks, RuleTable().functions({torch.tanh: "torch.tanh"}, rule), method="Test")
        model(torch.randn(2, requires_grad=True))  # before the pass: nothing
        with engine.forward_pass():
            model(torch.randn(2, requires_grad=True))
        model(torch.randn(2, requires_grad=True))  # after: nothing
    assert seen == ["torch.tanh"]


@pytest.mark.parametrize("exc", [KeyError, KeyboardInterrupt])
def test_everything_is_undone_when_the_pass_raises(exc: type[BaseException]) -> None:
    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.ReLU(inplace=True)

        def forward(self, x: Tensor) -> Tensor:
            x = self.act(F.relu(x))
            raise exc("boom")

    model = Boom()
    table = RuleTable().modules(nn.ReLU, Rule("r", lambda c: None, True)).functions(spellings("relu"), None)
    with pytest.raises(exc, match="boom"):
        with HookManager(model) as hooks:
            engine = RuleEngine(model, hooks, table, method="Test")
            try:
                with engine.forward_pass():
                    assert _get_current_function_mode_stack() and model.act.inplace is False
                    model(torch.randn(2, requires_grad=True))
            finally:
                # undone by the engine itself, before its HookManager goes
                assert _get_current_function_mode_stack() == []
                assert sum(hook_counts(model).values()) == 0
                assert engine.depth == 0 and not engine.acting()
    assert model.act.inplace is True and not torch._C._is_torch_function_mode_enabled()
    # the report of the interrupted pass is there, with what ran before the error
    assert engine.coverage.covered == {"r": {"act": 1}} and engine.coverage.uncovered == {"F.relu": 1}


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.Tanh()
        self.gelu = nn.GELU()

    def forward(self, x: Tensor) -> Tensor:
        frozen = torch.ones_like(x)  # needs no gradient: its rule declines
        h = self.act(self.act(x)) + torch.tanh(frozen)
        h = self.gelu(h) + F.silu(h) + F.silu(h)
        return torch.matmul(h, h.T)


def test_coverage_report_and_one_warning_naming_the_method() -> None:
    table = _table(uncovered=lambda f, a, k: function_name(f) if f is torch.matmul else None)
    table.modules(nn.GELU, None).functions({F.silu: "F.silu"}, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, engine = _grad(Mixed(), table, torch.randn(3, 4))
    cov = engine.coverage
    assert cov.covered == {"identity": {"act": 2}} and cov.by_kind == {"identity": {"module": 2, "functional": 0}}
    assert cov.declined == {"identity": {"torch.tanh": 1}}
    assert cov.uncovered == {"gelu": 1, "F.silu": 2, "torch.matmul": 1}
    assert cov.left_alone == {"torch.tanh": 1, "gelu": 1, "F.silu": 2, "torch.matmul": 1}
    assert cov.module_calls == {"act": 2, "gelu": 1} and cov.calls("identity") == 3 and cov.rewritten() == 2
    assert cov.kind_of == {"act": "module", "torch.tanh": "functional", "gelu": "module", "F.silu": "functional",
                           "torch.matmul": "functional"}  # fmt: skip
    assert str(cov) == (
        "Test on Mixed: identity: 2 calls rewritten (2 module, 0 functional); not covered: gelu x1, F.silu x2, "
        "torch.matmul x1; declined (no gradient): torch.tanh x1"
    )
    ours = [w for w in caught if "no rule covers" in str(w.message)]
    assert len(ours) == 1  # one warning per pass, however many operations
    assert str(ours[0].message) == (
        "Test: operations that no rule covers ran in the forward pass of Mixed: gelu x1, F.silu x2, torch.matmul x1; "
        "their backward pass is the plain gradient (see .rule_coverage)"
    )
    assert ours[0].filename == __file__  # it points at the caller, not into hookviz
    quiet = _table(warn=False).modules(nn.GELU, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, engine = _grad(Mixed(), quiet, torch.randn(3, 4))
    assert engine.coverage.uncovered == {"gelu": 1}


def test_passes_skips_the_call_path_for_callables_the_predicate_names_and_asks_once() -> None:
    """``passes``: unnamed callables it is true for run as called without reaching ``uncovered`` (asked once per
    callable, cached on the table); those it is false for still reach ``uncovered`` at every call."""
    seen: list[object] = []
    asked: list[object] = []

    def uncovered(f: object, a: tuple, k: dict) -> str | None:
        seen.append(f)
        return function_name(f) if f in (torch.matmul, F.silu) else None

    def passes(f: object) -> bool:
        asked.append(f)
        return f is torch.matmul

    table = _table(uncovered=uncovered, passes=passes).modules(nn.GELU, None)
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g, engine = _grad(Mixed(), table, x)
        first = list(seen)
        g_all, engine_all = _grad(Mixed(), _table(uncovered=uncovered).modules(nn.GELU, None), x)
    assert torch.equal(g, g_all)  # the same backward pass: only the report differs
    assert torch.matmul not in first and first.count(F.silu) == 2 and torch.matmul in seen[len(first) :]
    assert engine.coverage.uncovered == {"gelu": 1, "F.silu": 2}
    assert engine_all.coverage.uncovered == {"gelu": 1, "F.silu": 2, "torch.matmul": 1}
    assert asked.count(torch.matmul) == 1 and asked.count(F.silu) == 1  # cached per callable
    _grad(Mixed(), table, x)
    assert asked.count(torch.matmul) == 1 and asked.count(F.silu) == 1
    with pytest.raises(TypeError, match="passes must be a callable"):
        RuleTable(passes=True)  # type: ignore[arg-type]


def test_table_and_ops_checks() -> None:
    with pytest.raises(TypeError, match="module key must be an nn.Module class"):
        RuleTable().modules(int, IDENTITY)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rule must be a Rule or None"):
        RuleTable().functions([torch.tanh], lambda call: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="table must be a RuleTable"):
        RuleEngine(nn.Linear(1, 1), HookManager(nn.Linear(1, 1)), {}, method="Test")  # type: ignore[arg-type]
    # first matching entry wins: a module instance before its type
    special = nn.Tanh()
    other = Rule("other", _identity_backward)
    table = RuleTable().modules(special, other).modules(nn.Tanh, IDENTITY)
    assert table.module_entry("a", special) == (True, other)
    assert table.module_entry("b", nn.Tanh()) == (True, IDENTITY)
    assert table.module_entry("c", nn.ReLU()) == (False, None)
    assert spellings("relu") == {
        torch.relu: "torch.relu", F.relu: "F.relu", Tensor.relu: "Tensor.relu",
        torch.relu_: "torch.relu_", Tensor.relu_: "Tensor.relu_",
    }  # fmt: skip
    assert out_of_place(torch.relu_) is torch.relu and out_of_place(Tensor.add_) is Tensor.add
    assert out_of_place(F.leaky_relu_) is F.leaky_relu and out_of_place(F.relu) is None
    assert function_name(F.gelu) == "F.gelu" and function_name(Tensor.__radd__) == "Tensor.__radd__"


def test_owning_rule_takes_the_whole_call() -> None:
    """`Rule.owns_call` (LRP's rules): module calls reach the rule also when no input needs a gradient; functional
    calls reach it before the operation runs, the rule computes the output, and NotImplemented leaves the call to
    the engine as an uncovered one (with the output the rule computed, not run again)."""
    seen: list[tuple[str, bool]] = []

    def layer(call: Call) -> None:
        seen.append((call.name, call.input.requires_grad))
        return None  # the output as computed

    def tanh(call: Call) -> Tensor:
        assert call.output is None  # the engine has not run it
        x = call.input
        if call.op is torch.tanh:
            return x + (torch.tanh(x) - x).detach()  # tanh with the identity as derivative
        call.output = 3 * x.tanh()  # left to the engine, which must not run it again
        return NotImplemented

    def table() -> RuleTable:
        return (
            RuleTable(uncovered=lambda f, a, k: function_name(f) if f is Tensor.tanh else None)
            .modules(nn.Linear, Rule("layer", layer, owns_call=True))
            .functions(spellings("tanh", inplace=False), Rule("tanh", tanh, owns_call=True))
        )

    x = torch.randn(3, 2)
    g, engine = _grad(Net("torch"), table(), x)
    torch.testing.assert_close(g, (W2 @ W1).expand(3, 2), rtol=0, atol=0)  # W2 I W1: no rounding to speak of
    assert seen == [("fc1", True), ("fc2", True)]
    assert engine.coverage.covered == {"tanh": {"torch.tanh": 1}}
    assert engine.coverage.declined == {"layer": {"fc1": 1, "fc2": 1}}  # None: kept, counted as declined

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g, engine = _grad(Net("method"), table(), x)
    leaf = x.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad((3 * (leaf @ W1.T).tanh() @ W2.T).sum(), leaf)
    torch.testing.assert_close(g, ref)  # the same float32 operations in the same order
    assert engine.coverage.uncovered == {"Tensor.tanh": 1} and "tanh" not in engine.coverage.covered
    assert [str(w.message).split(":")[0] for w in caught] == ["Test"]

    seen.clear()  # no input needs a gradient: an owning module rule still sees every call, others see none
    model = Net("torch")
    with HookManager(model) as hooks:
        engine = RuleEngine(model, hooks, table(), method="Test")
        with engine.forward_pass(), torch.no_grad():
            model(x)
    assert seen == [("fc1", False), ("fc2", False)]
    assert engine.coverage.declined == {"layer": {"fc1": 1, "fc2": 1}, "tanh": {"torch.tanh": 1}}


def test_bind_sdpa_binds_as_the_signature_does() -> None:
    """`ops.bind_sdpa` binds the common calls by hand: the same names, values and order as `inspect.Signature.bind`
    with defaults, and the same errors for calls that do not bind."""
    import inspect

    from hookviz.methods.rules.ops import _SDPA, bind_sdpa

    q, k, v, m = (torch.zeros(1) for _ in range(4))
    calls = [
        ((q, k, v), {}),
        ((q, k, v, m, 0.0, True), {}),
        ((q, k), {"value": v}),
        ((q, k, v), {"is_causal": True, "scale": 0.5}),
        ((), {"query": q, "key": k, "value": v, "enable_gqa": True}),
        ((q, k, v, None, 0.1, False, 2.0, True), {}),
    ]
    for args, kwargs in calls:
        ref = _SDPA.bind(*args, **kwargs)
        ref.apply_defaults()
        got = bind_sdpa(args, kwargs)
        assert list(got) == list(ref.arguments) and all(got[n] is ref.arguments[n] for n in got)
    for args, kwargs in [((q, k, v), {"query": q}), ((q, k, v), {"bogus": 1}), ((q,), {}), ((q,) * 9, {})]:
        with pytest.raises(TypeError) as err:
            bind_sdpa(args, kwargs)
        with pytest.raises(TypeError) as ref_err:
            inspect.Signature.bind(_SDPA, *args, **kwargs)
        assert str(err.value) == str(ref_err.value)


def test_reach_memo_answers_as_a_fresh_search() -> None:
    """`InputReach` memoises every node of a search (the path reaches the input, finished branches do not): asked in
    any order, each answer equals a search from scratch. Graph: parameters mixed with the input at several depths."""
    import random

    from hookviz.methods.rules.reach import InputReach

    x = torch.randn(3, requires_grad=True)
    p, q = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(3))
    a = p * 2
    b = (a + q).sin()  # parameters only
    c = x * b  # reaches x
    d = (b * q).exp() + a  # parameters only
    e = torch.cat([c, d]).sum() * d.sum()
    f = d.cos() * p
    tensors = [a, b, c, d, e, f, x, p, x.detach(), torch.ones(2)]
    want = [False, False, True, False, True, False, True, False, False, False]
    for seed in range(20):
        order = list(range(len(tensors)))
        random.Random(seed).shuffle(order)
        reach = InputReach()
        assert [reach.depends(tensors[i]) for i in order] == [want[i] for i in order]
        assert [InputReach().depends(t) for t in tensors] == want


def test_a_module_rule_with_enter_leaves_the_calls_inside_to_the_table() -> None:
    """`Rule.enter`: the module's functional calls are intercepted (the tanh inside the block is seen, after the
    block's `enter` and before its rule), and the depth ends at 0."""

    seen: list[str] = []
    spy = Rule("spy", lambda call: seen.append(call.name))
    opened = Rule("open", lambda call: seen.append(call.name), enter=lambda m: seen.append(f"enter {type(m).__name__}"))
    table = RuleTable().modules(Block, opened).functions({torch.tanh: "torch.tanh"}, spy)
    _, engine = _grad(Outer(), table, torch.randn(2, 3))
    assert seen == ["enter Block", "torch.tanh", "block", "torch.tanh"]
    assert engine.coverage.covered == {"spy": {"torch.tanh": 2}, "open": {"block": 1}}
    assert engine.depth == 0


def test_an_open_module_rule_with_inside_lets_only_those_calls_take_their_entries() -> None:
    """`Rule.inside`: while the open module runs, only the callables it names take their table entries (the tanh);
    its other calls (the product by 2) run as called and are not counted, as inside any watched module; outside it
    the same callables take their entries again (the outer product), and the stack of open modules ends empty."""

    seen: list[str] = []
    spy = Rule("spy", lambda call: seen.append(call.name))
    inside = {torch.tanh}.__contains__
    opened = Rule("open", lambda call: seen.append(call.name), enter=lambda m: seen.append("enter"), inside=inside)
    table = RuleTable().modules(Block, opened).functions({torch.tanh: "torch.tanh", Tensor.mul: "*"}, spy)

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()

        def forward(self, x: Tensor) -> Tensor:
            return self.block(x) * 3

    _, engine = _grad(Scaled(), table, torch.randn(2, 3))
    assert seen == ["enter", "torch.tanh", "block", "*"]
    assert engine.coverage.covered == {"spy": {"torch.tanh": 1, "*": 1}, "open": {"block": 1}}
    assert engine._open == [] and engine.depth == 0
