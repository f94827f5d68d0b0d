"""ExplanationTracker driven by a real Lightning ``Trainer.fit`` of the shapes CNN (CPU, a few steps), and by the
Hugging Face callback's events: snapshots equal to independent Grad-CAM calls, stored in the data-set store format,
logged as TensorBoard images, the pointing game over time, the per-epoch figure, bad input at fit start."""

from __future__ import annotations

import copy

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
pytest.importorskip("tensorboard")
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from test_integrations_lightning import ShapesModule, data, fit, net, no_hooks  # noqa: E402

import hookviz as hv  # noqa: E402
from hookviz.integrations.lightning import ExplanationTrackerCallback  # noqa: E402
from hookviz.zoo import shapes  # noqa: E402

PROBE = shapes(4, seed=11, size=32)


def tracker(**kw) -> hv.ExplanationTracker:
    kw.setdefault("target", PROBE.labels)
    return hv.ExplanationTracker("gradcam", PROBE.images, masks=PROBE.masks, **kw)


def test_epoch_snapshots_stored_logged_and_scored(tmp_path) -> None:
    module = ShapesModule(net())
    initial = copy.deepcopy(module.net)
    t = tracker(store=tmp_path / "maps")
    tb = TensorBoardLogger(tmp_path, name="tb")
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", logger=tb, callbacks=[ExplanationTrackerCallback(t)],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(module, data())
    assert [(s, e) for s, e, _ in t.snapshots] == [(0, 0), (4, 1), (8, 2)]  # 4 optimizer steps per epoch
    # the first snapshot is the untrained model's Grad-CAM, the last the trained one's
    expected0 = hv.GradCAM(initial).attribute(PROBE.images, PROBE.labels)
    expected2 = hv.GradCAM(module.net).attribute(PROBE.images, PROBE.labels)
    torch.testing.assert_close(t.snapshots[0][2].float(), expected0, rtol=2e-3, atol=2e-3 * expected0.abs().max())
    torch.testing.assert_close(t.snapshots[2][2].float(), expected2, rtol=2e-3, atol=2e-3 * expected2.abs().max())
    assert not torch.equal(t.snapshots[0][2], t.snapshots[2][2])  # the maps changed while the model learnt
    # stored in the data-set store format, one run per snapshot
    stores = [hv.ExplanationStore(tmp_path / "maps" / f"step-{s:08d}") for s in (0, 4, 8)]
    for st, (_, epoch, maps) in zip(stores, t.snapshots, strict=True):
        assert len(st) == 4 and st.manifest["tracker"]["epoch"] == epoch
        torch.testing.assert_close(st[:], maps.float())
        assert st.targets.tolist() == PROBE.labels.tolist()
    # the pointing game over time, against hookviz.pointing_game on the stored maps
    scores = t.metric("pointing game")
    assert [s for s, _ in scores] == [0, 4, 8]
    for (_, value), st in zip(scores, stores, strict=True):
        assert value == pytest.approx(hv.pointing_game(st[:], PROBE.masks).mean().item())
    # TensorBoard image grids, one per snapshot
    events = EventAccumulator(tb.log_dir, size_guidance={"images": 0})
    events.Reload()
    images = events.Images("tracker/gradcam")
    assert [i.step for i in images] == [0, 4, 8] and images[0].width > 4 * 32
    assert no_hooks(module) and module.training is True
    fig = t.figure(0, metric="pointing game")
    assert len(fig.axes) == 4
    fig.savefig(tmp_path / "tracker.png")


def test_step_schedule_and_a_failing_tracker_never_stop_training(tmp_path) -> None:
    t = tracker(every=2)
    fit(ShapesModule(net()), ExplanationTrackerCallback(t), tmp_path)
    assert [s for s, _, _ in t.snapshots] == [0, 2, 4]

    calls = []

    def flaky(model):
        calls.append(1)
        if len(calls) > 2:  # the check and the first snapshot pass, then it breaks
            raise RuntimeError("probe broke")
        return hv.GradCAM(model)

    t = hv.ExplanationTracker(flaky, PROBE.images, every=1)
    with pytest.warns(RuntimeWarning, match=r"ExplanationTrackerCallback failed at step 1 \(RuntimeError: probe"):
        trainer = fit(ShapesModule(net()), ExplanationTrackerCallback(t), tmp_path)
    assert trainer.global_step == 4 and len(t.snapshots) == 1 and t.failed == "RuntimeError: probe broke"


def test_bad_input_fails_at_construction_or_fit_start(tmp_path) -> None:
    with pytest.raises(ValueError, match="every must be 'epoch' or a positive int"):
        tracker(every=0)
    with pytest.raises(ValueError, match="unknown method 'gradcan'"):
        hv.ExplanationTracker("gradcan", PROBE.images)
    with pytest.raises(ValueError, match=r"images must be an \(N, C, H, W\) float tensor"):
        hv.ExplanationTracker("gradcam", PROBE.images[0])
    with pytest.raises(ValueError, match=r"masks must be an \(N, H, W\) bool tensor with N = 4"):
        hv.ExplanationTracker("gradcam", PROBE.images, masks=PROBE.masks[:2])
    with pytest.raises(ValueError, match=r"probe set \(4, 1, 32, 32\) cannot be explained.*channel"):
        fit(
            ShapesModule(net()),
            ExplanationTrackerCallback(hv.ExplanationTracker("gradcam", PROBE.images[:, :1])),
            tmp_path,
        )
    with pytest.raises(ValueError, match=r"target=99 .*out of range|target=99.*99"):
        fit(ShapesModule(net()), ExplanationTrackerCallback(tracker(target=99)), tmp_path)
    with pytest.raises(ValueError, match="needs object masks"):
        hv.ExplanationTracker("gradcam", PROBE.images).metric("pointing game")
    with pytest.raises(ValueError, match="no snapshot yet"):
        tracker().figure()


def test_hugging_face_callback_events(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    from hookviz.integrations.transformers import ExplanationTrackerCallback as HFTracker

    model = net().train()
    t = tracker()
    callback = HFTracker(t, writer=tmp_path / "tb")
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    callback.on_train_begin(args, state, control, model=model)
    state.global_step, state.epoch = 5, 1.0
    callback.on_step_end(args, state, control, model=model)  # epoch schedule: no snapshot per step
    callback.on_epoch_end(args, state, control, model=model)
    callback.on_train_end(args, state, control, model=model)
    assert [(s, e) for s, e, _ in t.snapshots] == [(0, 0), (5, 1)] and model.training
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    events.Reload()
    assert [i.step for i in events.Images("tracker/gradcam")] == [0, 5]
    with pytest.raises(ValueError, match="cannot be explained"):
        HFTracker(tracker(target=99)).on_train_begin(args, state, control, model=model)
