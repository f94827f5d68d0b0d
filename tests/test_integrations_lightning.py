"""GradientFlowCallback in a real Lightning ``Trainer.fit`` of the shapes CNN (a few CPU steps): scalars in the
TensorBoard event files and the CSV log equal to the gradient norms of a plain loop, a NaN located, failures."""

from __future__ import annotations

import csv
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("lightning.pytorch")
pytest.importorskip("tensorboard")
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from hookviz import GradientFlowError, GradientFlowWarning, hook_counts  # noqa: E402
from hookviz.integrations.lightning import GradientFlowCallback  # noqa: E402
from hookviz.zoo import ShapesCNN, shapes  # noqa: E402

STEPS, BATCH, SIZE, LR = 4, 8, 32, 0.05


class ShapesModule(pl.LightningModule):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


def data() -> DataLoader:
    d = shapes(STEPS * BATCH, seed=3, size=SIZE)
    return DataLoader(TensorDataset(d.images, d.labels), batch_size=BATCH, shuffle=False)


def net(seed: int = 0) -> ShapesCNN:
    torch.manual_seed(seed)
    return ShapesCNN()


def fit(module, callback, tmp_path, loggers=None, steps=STEPS):
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=loggers if loggers is not None else False,
        callbacks=[callback],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, data())
    return trainer


def no_hooks(model: nn.Module) -> bool:
    return all(v == 0 for v in hook_counts(model).values())


def reference_norms() -> dict[str, list[float]]:
    """A plain loop on the same data and initialisation: each conv's gradient norm at each step."""
    model = net().train()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out: dict[str, list[float]] = {"conv1": [], "head": [], "total": []}
    for x, y in data():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        out["conv1"].append(model.conv1.weight.grad.norm().item())
        head = model.head.weight.grad.norm() ** 2 + model.head.bias.grad.norm() ** 2
        out["head"].append(head.sqrt().item())
        out["total"].append(math.sqrt(sum(p.grad.norm().item() ** 2 for p in model.parameters())))
        opt.step()
    return out


def test_fit_logs_gradient_norms_to_tensorboard_and_csv(tmp_path) -> None:
    module = ShapesModule(net())
    callback = GradientFlowCallback(every=2)
    tb, csv_logger = TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv")
    fit(module, callback, tmp_path, [tb, csv_logger])
    ref = reference_norms()
    events = EventAccumulator(tb.log_dir)
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"flow/grad_norm/net.conv1", "flow/grad_norm/net.head", "flow/grad_norm/total"} <= tags
    assert "flow/act_norm/net.relu" in tags and "flow/dead_fraction/net.relu" in tags
    for name, key in (("net.conv1", "conv1"), ("net.head", "head"), ("total", "total")):
        scalars = events.Scalars(f"flow/grad_norm/{name}")
        assert [s.step for s in scalars] == [0, 2]  # every=2 of 4 optimizer steps
        for s in scalars:
            assert math.isclose(s.value, ref[key][s.step], rel_tol=1e-4), (name, s.step, s.value, ref[key])
    with open(f"{csv_logger.log_dir}/metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("flow/grad_norm/net.conv1")]
    assert [int(r["step"]) for r in rows] == [0, 2]
    assert math.isclose(float(rows[1]["flow/grad_norm/net.conv1"]), ref["conv1"][2], rel_tol=1e-4)
    # detached at fit end, statistics still readable
    assert no_hooks(module) and callback.flow is not None and not callback.flow.active
    assert callback.flow.read().steps.tolist() == [0, 2] and [s for s, _ in callback.history] == [0, 2]
    assert callback.alarms == [] and callback.failed is None


class Poison(nn.Module):
    """Parameter-free: turns one value of its input into NaN at its `at`-th training call."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        self.calls += 1
        if self.calls == self.at:
            x = x.clone()
            x[0, 0, 0, 0] = float("nan")
        return x


def test_nan_injected_mid_training_is_located(tmp_path) -> None:
    model = net()
    model.features.insert(1, Poison(at=3))  # between the first dilated conv and its BatchNorm
    module = ShapesModule(model)
    callback = GradientFlowCallback(every=1)
    with pytest.warns(GradientFlowWarning, match=r"non-finite.*'net.features.1' \(Poison\)"):
        fit(module, callback, tmp_path)
    nonfinite = [a for a in callback.alarms if a.kind == "nonfinite"]
    assert [(a.step, a.name) for a in nonfinite] == [(2, "net.features.1")]
    assert callback.history[2][1]["flow/alarms"] >= 1 and no_hooks(module)


def test_raise_on_alarm_stops_training_and_detaches(tmp_path) -> None:
    model = net()
    model.features.insert(1, Poison(at=2))
    module = ShapesModule(model)
    with pytest.raises(GradientFlowError, match=r"'net.features.1' \(Poison\)"):
        fit(module, GradientFlowCallback(every=1, raise_on_alarm=True), tmp_path)
    assert no_hooks(module)


def test_a_failing_callback_warns_detaches_and_training_goes_on(tmp_path) -> None:
    class Broken(GradientFlowCallback):
        def on_fit_start(self, trainer, pl_module) -> None:
            super().on_fit_start(trainer, pl_module)

            def boom() -> None:
                raise RuntimeError("boom")

            self._session.flow.step = boom  # the monitor breaks at its first step

    module = ShapesModule(net())
    callback = Broken(every=1)
    with pytest.warns(RuntimeWarning, match=r"Broken failed at step 0 \(RuntimeError: boom\).*training goes on"):
        trainer = fit(module, callback, tmp_path)
    assert trainer.global_step == STEPS and callback.failed == "RuntimeError: boom" and no_hooks(module)


def test_bad_input_fails_at_construction_or_fit_start(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"every must be a positive int .* got 0"):
        GradientFlowCallback(every=0)
    with pytest.raises(TypeError, match="optimizer= is taken from the trainer"):
        GradientFlowCallback(optimizer=None)
    with pytest.raises(ValueError, match="on_alarm must be"):
        GradientFlowCallback(on_alarm="shout")
    frozen = ShapesModule(net())
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="has no parameters that require gradients"):
        fit(frozen, GradientFlowCallback(), tmp_path)
    with pytest.raises(ValueError, match=r"module='backbone' is not a submodule of ShapesModule.*\['net'\]"):
        fit(ShapesModule(net()), GradientFlowCallback(module="backbone"), tmp_path)
    with pytest.raises(ValueError, match="features.99"):
        fit(ShapesModule(net()), GradientFlowCallback(select="net.features.99"), tmp_path)


def test_watch_a_submodule_called_directly(tmp_path) -> None:
    """training_step calling self.net(...) (not self(...)): module='net' watches it, names without the prefix."""

    class Direct(ShapesModule):
        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

    callback = GradientFlowCallback(every=1, module="net")
    with warnings.catch_warnings():
        warnings.simplefilter("error", GradientFlowWarning)
        fit(Direct(net()), callback, tmp_path, steps=2)
    last = callback.history[-1][1]
    assert "flow/grad_norm/conv1" in last and "flow/act_norm/relu" in last


class ConvGradReader(pl.Callback):
    """Placed after the GradientFlowCallback: the norm of ``net.conv1``'s ``.grad`` at the same hook, read by hand
    in float64, so the logged norm is compared with the gradients of the very run it watched."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.norms.append(pl_module.net.conv1.weight.grad.double().norm().item())


def fit_precision(tmp_path, precision: str, accelerator: str = "cpu") -> tuple[GradientFlowCallback, ConvGradReader]:
    callback, reader = GradientFlowCallback(every=1), ConvGradReader()
    trainer = pl.Trainer(
        max_steps=2,
        accelerator=accelerator,
        devices=1,
        precision=precision,
        logger=False,
        callbacks=[callback, reader],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(ShapesModule(net()), data())
    return callback, reader


# The logged norm is a float32 sum of the n = 432 squares of conv1's gradient: recursive summation is within
# (n - 1) u of the exact sum (u = 2**-24), the square root halves that, the squares and the cast add a few u.
# Whether bf16 training stays near float32 training is a property of bf16 (its kernels round differently per CPU
# instruction set, and the steps carry that into the weights), not of hookviz: the test compares like with like.
NORM_RTOL = (432 + 4) * 2**-24


def assert_logs_its_own_gradients(callback: GradientFlowCallback, reader: ConvGradReader) -> None:
    logged = [metrics["flow/grad_norm/net.conv1"] for _, metrics in callback.history]
    assert len(logged) == len(reader.norms) == 2
    for got, want in zip(logged, reader.norms, strict=True):
        assert math.isclose(got, want, rel_tol=NORM_RTOL), (got, want)


def test_bf16_autocast_needs_no_scaler_and_reports_the_runs_own_gradients(tmp_path) -> None:
    callback, reader = fit_precision(tmp_path, "bf16-mixed")
    assert callback.flow.scaler is None and callback.alarms == []
    assert_logs_its_own_gradients(callback, reader)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 with a GradScaler needs CUDA (none on this machine)")
def test_fp16_with_the_precision_plugins_scaler_reads_unscaled_gradients(tmp_path) -> None:
    callback, reader = fit_precision(tmp_path, "16-mixed", accelerator="gpu")
    assert callback.flow.scaler is not None and callback.alarms == []
    # Lightning unscales before on_before_optimizer_step, where both callbacks read, so the logged norms equal the
    # norms of the run's own .grad; that .grad is unscaled: a loss scale (65536 at the start) would put the first
    # norm 2**16 times above float32 training's, and fp16 rounding moves it by far less than a factor of 2
    assert_logs_its_own_gradients(callback, reader)
    assert 0.5 < callback.history[0][1]["flow/grad_norm/net.conv1"] / reference_norms()["conv1"][0] < 2
