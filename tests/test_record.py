"""ActivationRecorder / GradientRecorder: per-call keys, storage modes, in-place safety, data loaders, hook removal."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

# the 3-4-1 network of the hooks tutorial: fc1(ones) = [7, -13, 27, -29], output 89
from test_hooks import SeedNet, no_hooks  # noqa: E402
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookviz import hook_counts
from hookviz.record import ActivationRecorder, GradientRecorder, call_key


class Twice(nn.Module):
    """One ReLU module called twice per forward (like torchvision's BasicBlock)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(3, 4)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.fc2(self.relu(self.fc1(x))))

    def reference(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        a = self.fc1(x)
        b = F.relu(a)
        c = self.fc2(b)
        return {"fc1": a, "relu": b, "fc2": c, "relu#1": F.relu(c)}


X = torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.2, -1.0]])


# -- keys ----------------------------------------------------------------------------------------------------------
def test_call_key_convention() -> None:
    assert [call_key("layer1.0.relu", i) for i in range(3)] == ["layer1.0.relu", "layer1.0.relu#1", "layer1.0.relu#2"]


def test_module_called_twice_gets_one_key_per_call() -> None:
    model = Twice()
    with ActivationRecorder(model, lambda n, m: n != "") as rec:
        out = model(X)
    ref = model.reference(X)
    assert rec.keys() == ["fc1", "relu", "fc2", "relu#1"]  # arrival order
    for key, value in ref.items():
        assert torch.equal(rec[key], value.detach()), key
    assert torch.equal(rec["relu#1"], out.detach())
    assert no_hooks(model)


def test_call_count_restarts_at_each_forward_of_the_model() -> None:
    model = Twice()
    with ActivationRecorder(model, nn.ReLU) as rec:
        model(X)
        model(X * 2)
    assert rec.keys() == ["relu", "relu#1"]
    assert [len(v) for v in rec.history.values()] == [2, 2]
    assert torch.equal(rec.history["relu"][1], model.reference(X * 2)["relu"].detach())


def test_in_place_relu_does_not_overwrite_the_recorded_output() -> None:
    model = SeedNet(inplace=True)
    with ActivationRecorder(model, "fc1") as rec, ActivationRecorder(model, "relu1") as rec2:
        model(torch.ones(1, 3))
    assert torch.equal(rec["fc1"], torch.tensor([[7.0, -13, 27, -29]]))  # recorded before relu1 zeroed it in place
    assert torch.equal(rec2["relu1"], torch.tensor([[7.0, 0, 27, 0]]))


def test_tuple_outputs_recorded_by_first_element() -> None:
    model = nn.Sequential(nn.LSTM(3, 5, batch_first=True))
    with ActivationRecorder(model, "0") as rec:
        out, _ = model(torch.randn(2, 4, 3))
    assert torch.equal(rec["0"], out.detach())


# -- storage ---------------------------------------------------------------------------------------------------------
def test_store_cpu_copies() -> None:
    model = SeedNet()
    with ActivationRecorder(model, "fc1", store="cpu") as rec:
        model(torch.ones(1, 3))
        out = model.fc1(torch.ones(1, 3))
    value = rec.history["fc1"][0]
    assert value.device.type == "cpu" and torch.equal(value, out.detach())
    assert value.data_ptr() != out.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtype_cast(dtype: torch.dtype) -> None:
    model = SeedNet()
    with ActivationRecorder(model, "fc1", dtype=dtype) as rec:
        model(torch.ones(1, 3))
    assert rec["fc1"].dtype == dtype
    assert torch.equal(rec["fc1"], torch.tensor([[7.0, -13, 27, -29]], dtype=dtype))


def test_reduce_applied_as_it_arrives_then_cast() -> None:
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU())
    x = torch.randn(4, 2, 5, 5)
    with ActivationRecorder(model, "1", reduce=lambda t: t.mean((2, 3)), dtype=torch.float16) as rec:
        out = model(x)
    assert rec["1"].shape == (4, 3) and rec["1"].dtype == torch.float16
    torch.testing.assert_close(rec["1"].float(), out.mean((2, 3)), atol=1e-3, rtol=1e-3)


def test_accumulate_stack_and_cat() -> None:
    model = SeedNet()
    rec = ActivationRecorder(model, "fc2").start()
    for i in range(3):
        model(torch.ones(2, 3) * i)
    model(torch.ones(1, 3))
    rec.stop()
    assert len(rec.history["fc2"]) == 4
    assert rec.cat()["fc2"].shape == (7, 1)
    with pytest.raises(ValueError, match=r"cannot stack the tensors of 'fc2': their shapes differ.*use cat\(\)"):
        rec.stack()
    rec.clear()
    with ActivationRecorder(model, "fc2", reduce=lambda t: t.sum()) as rec:
        model(torch.ones(2, 3))
        model(torch.ones(1, 3))
    assert rec.stack()["fc2"].shape == (2,) and rec.cat()["fc2"].shape == (2,)  # 0-d values are stacked


def test_accumulate_false_keeps_only_the_latest() -> None:
    model = SeedNet()
    with ActivationRecorder(model, "fc2", accumulate=False) as rec:
        model(torch.ones(1, 3))
        model(torch.zeros(1, 3))
    assert len(rec.history["fc2"]) == 1
    assert torch.equal(rec["fc2"], model(torch.zeros(1, 3)).detach())


def test_bad_arguments_fail_before_any_hook() -> None:
    model = SeedNet()
    with pytest.raises(ValueError, match="store must be 'device'.*or 'cpu', got 'gpu'"):
        ActivationRecorder(model, "fc1", store="gpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dtype must be None.*torch.bfloat16, got torch.int8"):
        ActivationRecorder(model, "fc1", dtype=torch.int8)
    with pytest.raises(TypeError, match="reduce must be a callable"):
        ActivationRecorder(model, "fc1", reduce=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'fc3' matches no module.*closest module names: 'fc2', 'fc1'"):
        GradientRecorder(model, "fc3")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        ActivationRecorder("resnet", "fc1")  # type: ignore[arg-type]
    assert no_hooks(model)


def test_reduce_must_return_a_tensor() -> None:
    model = SeedNet()
    with pytest.raises(TypeError, match="reduce must return a tensor; for 'fc1' it returned float"):
        with ActivationRecorder(model, "fc1", reduce=lambda t: float(t.sum())):
            model(torch.ones(1, 3))
    assert no_hooks(model)


def test_missing_key_names_recorded_keys() -> None:
    model = SeedNet()
    with ActivationRecorder(model, "fc1") as rec:
        model(torch.ones(1, 3))
    with pytest.raises(KeyError, match="no output recorded under 'fc2'; recorded keys: fc1"):
        rec["fc2"]


# -- hook life cycle -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [ActivationRecorder, GradientRecorder])
def test_hooks_removed_on_exit_and_on_error(cls) -> None:
    model = Twice()
    with cls(model, nn.Module) as rec:
        assert hook_counts(model)["forward"] == 4 and hook_counts(model)["forward_pre"] == 1
        assert rec.active
        model(X.clone().requires_grad_()).sum().backward()
    assert no_hooks(model) and not rec.active
    with pytest.raises(KeyError, match="boom"):
        with cls(model, nn.ReLU):
            model(X)
            raise KeyError("boom")
    assert no_hooks(model)
    rec = cls(model, "fc1").start()
    with pytest.raises(RuntimeError, match="already recording; call stop"):
        rec.start()
    rec.stop()
    rec.stop()  # idempotent
    assert no_hooks(model)


def test_exception_in_forward_removes_hooks() -> None:
    model = SeedNet()
    with pytest.raises(RuntimeError):
        with GradientRecorder(model, "fc1"):
            model(torch.ones(1, 5))  # wrong width
    assert no_hooks(model)


# -- gradients -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inplace", [False, True])
def test_gradients_of_the_seed_network(inplace: bool) -> None:
    model = SeedNet(inplace=inplace)
    x = torch.ones(1, 3, requires_grad=True)
    with GradientRecorder(model, lambda n, m: n != "") as rec:
        model(x).backward()
    assert torch.equal(rec["fc2"], torch.tensor([[1.0]]))
    assert torch.equal(rec["relu1"], torch.tensor([[1.0, 2, 3, 4]]))
    assert torch.equal(rec["fc1"], torch.tensor([[1.0, 0, 3, 0]]))  # before the (in-place) ReLU: masked
    assert rec.keys() == ["fc2", "relu1", "fc1"]  # backward order
    assert model.relu1.inplace is inplace


def test_gradients_keyed_by_the_call_that_produced_the_output() -> None:
    model = Twice()
    x = X.clone().requires_grad_()
    with GradientRecorder(model, nn.ReLU) as rec:
        model(x).pow(2).sum().backward()
    ref = model.reference(x)
    grads = torch.autograd.grad(ref["relu#1"].pow(2).sum(), [ref["relu"], ref["relu#1"]])
    assert torch.allclose(rec["relu"], grads[0]) and torch.allclose(rec["relu#1"], grads[1])
    assert rec.keys() == ["relu#1", "relu"]


def test_nothing_recorded_without_grad_and_tensor_hooks_released() -> None:
    model = Twice()
    with GradientRecorder(model, nn.ReLU) as rec:
        with torch.no_grad():
            model(X)
        assert len(rec) == 0 and len(rec._tensor_hooks) == 0
        for _ in range(5):
            model(X).sum().backward()
            assert len(rec._tensor_hooks) == 2  # the previous forward's fired hooks were released
        pending = model(X).sum()
    pending.backward()  # after stop: the hook of this graph is gone
    assert [len(v) for v in rec.history.values()] == [5, 5]
    assert no_hooks(model)


def test_gradient_recorder_storage_options() -> None:
    model = SeedNet()
    x = torch.ones(2, 3, requires_grad=True)
    with GradientRecorder(model, "fc1", store="cpu", dtype=torch.bfloat16, reduce=lambda g: g.abs().amax(0)) as rec:
        model(x).sum().backward()
    assert rec["fc1"].dtype == torch.bfloat16 and rec["fc1"].shape == (4,)
    assert torch.equal(rec["fc1"], torch.tensor([1.0, 0, 3, 0], dtype=torch.bfloat16))


# -- data loaders ----------------------------------------------------------------------------------------------------
class Counting:
    """An iterable over batches that counts how many were fetched."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self.fetched = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            self.fetched += 1
            yield batch


def make_loader(n: int = 10, batch_size: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g)), batch_size)


@pytest.mark.parametrize("progress", [True, False])
def test_activation_record_over_a_loader_stops_at_max_batches(progress: bool, capsys) -> None:
    model = Twice().train()
    loader = Counting(make_loader())
    out = ActivationRecorder(model, nn.ReLU, reduce=lambda t: t.mean(1)).record(
        loader, max_batches=2, progress=progress
    )
    assert loader.fetched == 2
    assert out["relu"].shape == (8,) and out["relu#1"].shape == (8,)
    xs = torch.cat([b[0] for b in list(make_loader())[:2]])
    torch.testing.assert_close(out["relu#1"], model.reference(xs)["relu#1"].mean(1))
    assert model.training and no_hooks(model)


def test_record_progress_bar_draws_only_when_asked(capsys) -> None:
    # tqdm is a runtime dependency: progress=True always draws a bar (on stderr outside notebooks), False never does
    out = ActivationRecorder(Twice(), "fc2").record(make_loader(), progress=True)
    assert out["fc2"].shape == (10, 4)
    assert "ActivationRecorder" in capsys.readouterr().err
    ActivationRecorder(Twice(), "fc2").record(make_loader(), progress=False)
    assert capsys.readouterr().err == ""


def test_record_with_dict_batches_and_forward() -> None:
    model = Twice()
    batches = [{"x": torch.randn(2, 3)} for _ in range(3)]
    out = ActivationRecorder(model, "fc1").record(batches, forward=lambda m, b: m(b["x"]), progress=False)
    assert out["fc1"].shape == (6, 4)
    with pytest.raises(TypeError, match="cannot feed a batch of type str"):
        ActivationRecorder(model, "fc1").record(["abc"], progress=False)
    with pytest.raises(ValueError, match="max_batches must be a positive int"):
        ActivationRecorder(model, "fc1").record(batches, max_batches=0)
    assert no_hooks(model)


def test_gradient_record_leaves_parameter_grads_alone() -> None:
    model = Twice()
    loader = make_loader()
    out = GradientRecorder(model, "fc2").record(
        loader, loss=lambda o, b: F.cross_entropy(o, b[1]), max_batches=2, progress=False
    )
    assert out["fc2"].shape == (8, 4)
    assert all(p.grad is None for p in model.parameters())
    x, y = next(iter(loader))
    c = model.reference(x)["fc2"]
    expected = torch.autograd.grad(F.cross_entropy(F.relu(c), y), c)[0]
    torch.testing.assert_close(out["fc2"][:4], expected)
    assert no_hooks(model)


def test_gradient_record_through_in_place_relu() -> None:
    model = SeedNet(inplace=True)
    batches = [torch.ones(1, 3)]
    out = GradientRecorder(model, "fc1").record(batches, loss=lambda o, b: o.sum(), progress=False)
    assert torch.equal(out["fc1"], torch.tensor([[1.0, 0, 3, 0]]))


def test_gradient_record_needs_a_loss_and_cleans_up_on_error() -> None:
    model = Twice()
    with pytest.raises(ValueError, match="GradientRecorder.record needs loss="):
        GradientRecorder(model, "fc1").record(make_loader())
    with pytest.raises(ValueError, match=r"loss must return a scalar tensor, got a tensor of shape \(4, 4\)"):
        GradientRecorder(model, "fc1").record(make_loader(), loss=lambda o, b: o, progress=False)
    assert no_hooks(model)
