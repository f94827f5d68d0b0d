"""Hostile inputs across the public API, one table (issue 10, item 7).

Every row calls hookviz with one bad argument and pins the error: its type (`TypeError`/`ValueError`/`RuntimeError`,
hookviz's own, or the OS error of a missing file), and a message that names the argument, what came and what is
expected. After the error the model is exactly as it was (state_dict bit for bit, hooks, ``training``,
``requires_grad`` and ``inplace`` flags, no ``.grad``), so nothing was half-applied. The CLI rows check exit code 2
and one line on stderr, never a traceback (`cli` turns that line into a `UsageExit` for ``match=``).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image
from torch import nn

import hookviz as hv
from hookviz.cli import main
from hookviz.zoo import shapes_image


class Net(nn.Module):
    """conv -> ReLU(inplace) -> global pool -> linear: 3 channels in, 5 classes out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.relu(self.conv(x))).flatten(1))


class UsageExit(Exception):
    """`hookviz.cli.main` exited with code 2 and one line on stderr; the message is that line."""


def cli(*args: str) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        main(list(args))
    text = err.getvalue()
    assert exc.value.code == 2, exc.value.code
    assert text.count("\n") == 1 and "Traceback" not in text, text
    raise UsageExit(text.strip())


@dataclass
class Env:
    """What a row may use: a fresh model, a batch, an Explanation of it, a figure, files under tmp."""

    model: Net
    x: torch.Tensor
    exp: hv.Explanation
    tmp: Path
    monkeypatch: pytest.MonkeyPatch

    @property
    def image(self) -> str:
        path = self.tmp / "img.png"
        if not path.exists():
            shapes_image(40, seed=1).save(path)
        return str(path)

    def bomb(self) -> str:
        """An image PIL refuses once its limit is 100 pixels (it refuses more than 2 * 100)."""
        path = self.tmp / "bomb.png"
        Image.new("RGB", (32, 32)).save(path)
        self.monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
        return str(path)


def state(model: nn.Module) -> dict[str, Any]:
    return {
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "hooks": hv.hook_counts(model),
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad for p in model.parameters()],
        "inplace": [getattr(m, "inplace", None) for m in model.modules()],
    }


def assert_same_state(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    for k, v in before["params"].items():
        assert torch.equal(v, after["params"][k]), k
    for key in ("hooks", "training", "requires_grad", "grads", "inplace"):
        assert before[key] == after[key], key


def nan_batch(e: Env) -> torch.Tensor:
    x = e.x.clone()
    x[0, 0, 0, 0], x[1, 1, 1, 1] = float("nan"), float("inf")
    return x


def noop(*args: Any) -> None:
    return None


Row = tuple[str, Callable[[Env], Any], type[BaseException], str]
CLI_TV = ("--model", "torchvision:resnet18")

ROWS: list[Row] = [
    # -- attribute(): inputs -------------------------------------------------------------------------------------------
    ("attribute-list", lambda e: hv.Saliency(e.model).attribute([1, 2]), TypeError,
     r"inputs: attribute\(\) takes a batch tensor \(N, \.\.\.\), got list; use visualize\(\)"),
    ("attribute-uint8", lambda e: hv.Saliency(e.model).attribute((e.x * 255).to(torch.uint8)), TypeError,
     r"inputs is an integer tensor \(torch.uint8\); Saliency differentiates its inputs, so they must be "
     r"floating-point \(images: x.float\(\) / 255\)"),
    ("attribute-5d", lambda e: hv.GuidedBackprop(e.model).attribute(e.x[:, :, None]), ValueError,
     r"inputs have shape \(2, 3, 1, 8, 8\) \(5-D\) but the model's first convolution 'conv' \(Conv2d\) takes 4-D"),
    ("attribute-unbatched", lambda e: hv.GradCAM(e.model).attribute(e.x[0]), ValueError,
     r"inputs have shape \(3, 8, 8\) \(3-D\) .* takes 4-D batches \(N, C, H, W\); add the batch axis"),
    ("attribute-channels", lambda e: hv.Saliency(e.model).attribute(e.x[:, :1]), ValueError,
     r"inputs has 1 channels \(shape \(2, 1, 8, 8\)\) but the model's first convolution 'conv' .* expects 3"),
    ("attribute-empty", lambda e: hv.Saliency(e.model).attribute(e.x[:0]), ValueError,
     r"inputs hold an empty batch \(N = 0\), shape \(0, 3, 8, 8\); expected N >= 1"),
    ("attribute-nan", lambda e: hv.IntegratedGradients(e.model, steps=2).attribute(nan_batch(e)), ValueError,
     r"inputs: found 2 non-finite value\(s\) \(NaN or Inf\) among 384; expected finite values"),
    ("attribute-sparse", lambda e: hv.Saliency(e.model).attribute(e.x.to_sparse()), TypeError,
     r"inputs must be a dense tensor, got layout torch.sparse_coo; convert with x.to_dense\(\)"),
    ("attribute-meta", lambda e: hv.Saliency(e.model).attribute(e.x.to("meta")), ValueError,
     r"inputs are on the meta device \(shapes without data\)"),
    # -- attribute(): targets ------------------------------------------------------------------------------------------
    ("target-out-of-range", lambda e: hv.Saliency(e.model).attribute(e.x, target=7), ValueError,
     r"target class 7 is out of range: the model has 5 classes \(valid targets are 0..4\)"),
    ("target-negative", lambda e: hv.GradCAM(e.model).attribute(e.x, target=-1), ValueError,
     r"target classes must be >= 0; got -1 \(negative indices are not wrapped\)"),
    ("target-str", lambda e: hv.Saliency(e.model).attribute(e.x, target="cat"), TypeError,
     r"target must be None, an int, a sequence or tensor of ints, .* got str"),
    ("target-float", lambda e: hv.Saliency(e.model).attribute(e.x, target=2.5), TypeError,
     r"target must be None, an int, .* got float"),
    ("target-bool", lambda e: hv.Saliency(e.model).attribute(e.x, target=True), TypeError,
     r"target must be an int class index, not a bool"),
    ("target-length", lambda e: hv.Saliency(e.model).attribute(e.x, target=[1, 2, 3]), ValueError,
     r"target has 3 entries but the batch has 2 inputs; give one per input"),
    ("target-ragged", lambda e: hv.Saliency(e.model).attribute(e.x, target=[[1], [2, 3]]), TypeError,
     r"target sequence must hold ints \(one per input\) or equal-length rows of ints; got \[\[1\], \[2, 3\]\]"),
    ("target-3d", lambda e: hv.Saliency(e.model).attribute(e.x, target=torch.zeros(2, 1, 1, dtype=torch.long)),
     ValueError, r"target must be 0-, 1- or 2-D \(N, K\); got shape \(2, 1, 1\)"),
    ("target-numpy-float", lambda e: hv.Saliency(e.model).attribute(e.x, target=np.array([1.0, 2.0])), TypeError,
     r"target must hold integer class indices; got a numpy float64 array of shape \(2,\)"),
    ("target-callable-shape", lambda e: hv.Saliency(e.model).attribute(e.x, target=lambda out: out.sum()),
     ValueError, r"a callable target must return a tensor of shape \(N,\) or \(N, K\) with N = 2 .* got shape \(\)"),
    ("target-callable-raises", lambda e: hv.Saliency(e.model).attribute(e.x, target=lambda out: out.logits),
     RuntimeError, r"the target callable '<lambda>' failed on the model output \(a tensor of shape \(2, 5\)\) with "
     r"AttributeError: .*; it must map the output to \(N,\) or \(N, K\) scores"),
    # -- method constructors -------------------------------------------------------------------------------------------
    ("method-model", lambda e: hv.Saliency("resnet18"), TypeError, r"model must be a torch.nn.Module, got str"),
    ("method-backward", lambda e: hv.Saliency(e.model, backward="fast"), ValueError,
     r"backward must be 'auto', 'vmap' or 'loop', got 'fast'"),
    ("method-eval-mode", lambda e: hv.GuidedBackprop(e.model, eval_mode="no"), TypeError,
     r"eval_mode must be True or False, got str 'no'"),
    ("gradcam-layer-missing", lambda e: hv.GradCAM(e.model, layer="conv9"), ValueError,
     r"layer: selector 'conv9' matches no module of Net; closest module names: 'conv'"),
    ("gradcam-layer-glob", lambda e: hv.GradCAM(e.model, layer="conv*"), ValueError,
     r"layer must name one module, got the glob 'conv\*'"),
    ("gradcam-call", lambda e: hv.GradCAM(e.model, call="last"), TypeError,
     r"call must be an int \(index of the layer's call in the forward\), got 'last'"),
    ("gradcam-upsample", lambda e: hv.GradCAM(e.model).attribute(e.x, upsample="yes"), ValueError,
     r"upsample must be False, True \(bilinear\) or one of 'bilinear', 'nearest', 'bicubic'; got 'yes'"),
    ("guided-without-relu", lambda e: hv.GuidedBackprop(nn.Linear(3, 2)).attribute(torch.ones(1, 3)), ValueError,
     r"GuidedBackprop rewrites the gradient at ReLU calls, but no ReLU ran .*; use Saliency"),
    ("ig-steps", lambda e: hv.IntegratedGradients(e.model, steps=0), ValueError,
     r"steps must be >= 1 \(quadrature points; >= 1 for method='gausslegendre'\), got 0"),
    ("ig-method", lambda e: hv.IntegratedGradients(e.model, method="simpson"), ValueError,
     r"method must be one of 'riemann_left', .*; got 'simpson'"),
    ("ig-baseline-type", lambda e: hv.IntegratedGradients(e.model, baseline="zeros"), TypeError,
     r"baseline must be None \(zeros\), a number \(a constant image\), a tensor .* got str"),
    ("ig-baseline-nan", lambda e: hv.IntegratedGradients(e.model, baseline=float("nan")), ValueError,
     r"baseline must be a finite number \(a constant image\), got nan"),
    ("ig-baseline-shape", lambda e: hv.IntegratedGradients(e.model, baseline=torch.zeros(5, 5)).attribute(e.x),
     ValueError, r"baseline of shape \(5, 5\) does not broadcast to the inputs' shape \(2, 3, 8, 8\)"),
    ("smoothgrad-sigma", lambda e: hv.SmoothGrad(e.model, sigma=-1), ValueError,
     r"sigma must be a finite number >= 0 \(a fraction of the input range\), got -1"),
    ("smoothgrad-class", lambda e: hv.SmoothGrad(hv.Saliency), TypeError,
     r"method must be an instance of an attribution method, got the class Saliency; pass e.g. "
     r"SmoothGrad\(Saliency\(model\)\)"),
    # -- visualize() and load_images -----------------------------------------------------------------------------------
    ("visualize-preset", lambda e: hv.Saliency(e.model).visualize(e.image, preprocess="imagenett"), ValueError,
     r"preprocess: unknown preset 'imagenett'; valid names are \['imagenet', 'none'\]"),
    ("visualize-labels", lambda e: hv.Saliency(e.model).visualize(e.x, labels=5), TypeError,
     r"labels must be a sequence of class names, a torchvision weights enum member .* got int"),
    ("visualize-none", lambda e: hv.GradCAM(e.model).visualize(None), TypeError,
     r"images: expected a path, a PIL image, a numpy array HxW / HxWxC or a tensor .* got NoneType"),
    ("visualize-nan-tensor", lambda e: hv.Saliency(e.model).visualize(nan_batch(e)), ValueError,
     r"images: found 2 non-finite value\(s\) \(NaN or Inf\) among 384"),
    ("load-missing", lambda e: hv.load_images(str(e.tmp / "missing.png")), FileNotFoundError,
     r"images: no such file '.*missing.png'"),
    ("load-directory", lambda e: hv.load_images(str(e.tmp)), IsADirectoryError,
     r"images: '.*' is a directory; pass the path of an image file"),
    ("load-not-an-image", lambda e: hv.load_images(__file__), ValueError,
     r"images: '.*test_hostile.py' is not an image file PIL can read"),
    ("load-bomb", lambda e: hv.load_images(e.bomb()), ValueError,
     r"images: '.*bomb.png' has 1,024 pixels, more than 200 \(twice PIL.Image.MAX_IMAGE_PIXELS = 100\), .*if you "
     r"trust the file, raise the limit"),
    ("load-empty-list", lambda e: hv.load_images([]), ValueError, r"images: got an empty list; pass at least one"),
    ("load-channels", lambda e: hv.load_images(e.image, channels=2), ValueError,
     r"channels: expected 1 \(grayscale\) or 3 \(RGB\) for non-tensor images, got 2"),
    ("load-device", lambda e: hv.load_images(e.image, device="gpu9"), ValueError,
     r"device: 'gpu9' is not a valid device; use e.g. 'cpu', 'cuda' or 'cuda:0'"),
    ("load-float-range", lambda e: hv.load_images(np.full((4, 4), 3.0)), ValueError,
     r"images: float numpy images must lie in \[0, 1\], found values in \[3, 3\]; divide by 255"),
    ("load-int16", lambda e: hv.load_images(np.zeros((4, 4), np.int16)), TypeError,
     r"images: numpy image dtype int16 is not supported; expected uint8 \(0..255\), bool, or float in \[0, 1\]"),
    ("load-sizes", lambda e: hv.load_images([np.zeros((4, 4), np.uint8), np.zeros((5, 5), np.uint8)],
                                            preprocess=None), ValueError,
     r"images: all images must end with the same height x width .* 4x4 at images\[0\]; 5x5 at images\[1\]"),
    # -- Explanation display -------------------------------------------------------------------------------------------
    ("normalized-mode", lambda e: e.exp.normalized(mode="zscore"), ValueError,
     r"mode must be one of \('seed', 'minmax', 'absmax', 'percentile', 'mass'\), got 'zscore'"),
    ("normalized-reduce", lambda e: e.exp.normalized(reduce="mean2"), ValueError,
     r"reduce must be one of \('sum', 'abs-sum', 'max-abs', 'l2'\) or None, got 'mean2'"),
    ("normalized-sign", lambda e: e.exp.normalized(sign="pos"), ValueError,
     r"sign must be one of \('all', 'positive', 'negative', 'absolute'\), got 'pos'"),
    ("normalized-eps", lambda e: e.exp.normalized(eps=0), ValueError, r"eps must be a positive number, got 0"),
    ("figure-cmap", lambda e: e.exp.figure(cmap="jte"), ValueError,
     r"cmap 'jte' is not a matplotlib colour map; did you mean 'jet'\?"),
    ("figure-option", lambda e: e.exp.figure(colour="red"), TypeError,
     r"figure\(\) got unknown display option\(s\) \['colour'\]; expected among \('reduce', 'mode'"),
    ("figure-max-rows", lambda e: e.exp.figure(max_rows=0), ValueError, r"max_rows must be a positive int, got 0"),
    ("figure-overlay", lambda e: e.exp.figure(overlay="yes"), TypeError, r"overlay must be a bool, got str"),
    ("save-suffix", lambda e: e.exp.save(e.tmp / "fig.gif"), ValueError,
     r"path must end with one of \('.pdf', '.svg', '.png', '.eps', '.jpg', '.jpeg'\) .* got suffix '.gif'"),
    ("save-no-suffix", lambda e: e.exp.save(e.tmp / "fig"), ValueError,
     r"path must end with one of .* got suffix '' in '.*fig'"),
    ("save-dpi", lambda e: e.exp.save(e.tmp / "fig.png", dpi=0), ValueError, r"dpi must be a positive number, got 0"),
    # -- grid and save_figure ------------------------------------------------------------------------------------------
    ("grid-scale", lambda e: hv.grid(e.exp, scale="global"), ValueError,
     r"scale must be one of \('column', 'sample', 'shared'\), got 'global'"),
    ("grid-overlay", lambda e: hv.grid(e.exp, overlay="yes"), ValueError,
     r"overlay must be True, False or 'auto', got 'yes'"),
    ("grid-row-labels", lambda e: hv.grid(e.exp, row_labels=["a"]), ValueError,
     r"row_labels must hold 2 strings \(one per row\), got 1"),
    ("grid-no-model", lambda e: hv.grid(e.x, methods=["saliency"]), ValueError,
     r"method 'saliency' needs model=: pass the nn.Module to explain"),
    ("grid-unknown-method", lambda e: hv.grid(e.x, methods=["saliency", "gradcamm"], model=e.model), ValueError,
     r"unknown method 'gradcamm'; did you mean 'gradcam'\? available: .*gradcam"),
    ("grid-cmap", lambda e: hv.grid(e.x, methods=["saliency"], model=e.model, cmap="jte"), ValueError,
     r"cmap 'jte' is not a matplotlib colour map; did you mean 'jet'\?"),
    ("grid-empty", lambda e: hv.grid([]), ValueError,
     r"items is an empty list: pass Explanation objects \(one per column\), or images with methods= and model="),
    ("grid-mixed", lambda e: hv.grid([e.exp, 3]), TypeError,
     r"items mixes Explanation objects and other things: pass only Explanations, or only images"),
    ("save-figure-suffix", lambda e: hv.save_figure(Figure(), e.tmp / "fig.gif"), ValueError,
     r"path must end with one of \('.pdf', '.svg', '.png', '.eps', '.jpg', '.jpeg'\) .* got suffix '.gif' "
     r"in '.*fig.gif'"),
    ("save-figure-dpi", lambda e: hv.save_figure(Figure(), e.tmp / "fig.png", dpi=-1), ValueError,
     r"dpi must be a positive number or None, got -1"),
    ("save-figure-not-a-figure", lambda e: hv.save_figure("fig", e.tmp / "fig.png"), TypeError,
     r"fig must be a matplotlib Figure \(e.g. from hookviz.grid\), got str"),
    # -- HookManager ---------------------------------------------------------------------------------------------------
    ("hooks-model", lambda e: hv.HookManager("net"), TypeError, r"model must be a torch.nn.Module, got str"),
    ("hooks-selector-int", lambda e: hv.HookManager(e.model).forward(3, noop), TypeError,
     r"selector must be a module name or glob \(str\), a module class or tuple of classes, .* got int"),
    ("hooks-selector-list", lambda e: hv.HookManager(e.model).forward(["conv", "fc"], noop), TypeError,
     r"selector got a list \['conv', 'fc'\]; pass one selector per call, a tuple of module classes, or a predicate"),
    ("hooks-selector-empty-tuple", lambda e: hv.HookManager(e.model).forward((), noop), TypeError,
     r"selector \(\) is an empty tuple; pass module classes such as nn.ReLU"),
    ("hooks-selector-class", lambda e: hv.HookManager(e.model).forward(int, noop), TypeError,
     r"selector int is a class \(or tuple\) that is not an nn.Module subclass"),
    ("hooks-selector-missing", lambda e: hv.HookManager(e.model).backward("rellu", noop), ValueError,
     r"selector 'rellu' matches no module of Net; closest module names: 'relu'"),
    ("hooks-selector-foreign", lambda e: hv.HookManager(e.model).forward(nn.ReLU(), noop), ValueError,
     r"selector module instance ReLU matches no module of Net: the instance is not a submodule of this model"),
    ("hooks-fn", lambda e: hv.HookManager(e.model).forward(nn.ReLU, "print"), TypeError,
     r"hook fn must be callable, got str"),
    ("hooks-backward-fn", lambda e: hv.HookManager(e.model).backward(nn.ReLU, None), TypeError,
     r"hook fn must be callable, got NoneType"),
    ("hooks-tensor", lambda e: hv.HookManager(e.model).tensor("t", noop), TypeError,
     r"tensor must be a torch.Tensor, got str"),
    ("hooks-tensor-no-grad", lambda e: hv.HookManager(e.model).tensor(e.x, noop), ValueError,
     r"cannot place a tensor hook on a tensor that does not require grad"),
    # -- recorders -----------------------------------------------------------------------------------------------------
    ("recorder-model", lambda e: hv.ActivationRecorder("net", nn.ReLU), TypeError,
     r"model must be a torch.nn.Module, got str"),
    ("recorder-store", lambda e: hv.ActivationRecorder(e.model, nn.ReLU, store="gpu"), ValueError,
     r"store must be 'device' \(keep on the model's device\) or 'cpu', got 'gpu'"),
    ("recorder-dtype", lambda e: hv.ActivationRecorder(e.model, nn.ReLU, dtype=torch.int8), ValueError,
     r"dtype must be None \(keep the tensor's dtype\) or a floating dtype .* got torch.int8"),
    ("recorder-reduce", lambda e: hv.ActivationRecorder(e.model, nn.ReLU, reduce="mean"), TypeError,
     r"reduce must be a callable tensor -> tensor \(or None\), got str"),
    ("recorder-accumulate", lambda e: hv.ActivationRecorder(e.model, nn.ReLU, accumulate="yes"), TypeError,
     r"accumulate must be True or False, got str"),
    ("recorder-selector", lambda e: hv.ActivationRecorder(e.model, "relu9"), ValueError,
     r"selector 'relu9' matches no module of Net; closest module names: 'relu'"),
    ("recorder-max-batches", lambda e: hv.ActivationRecorder(e.model, nn.ReLU).record([e.x], max_batches=0),
     ValueError, r"max_batches must be a positive int or None, got 0"),
    ("gradient-recorder-store", lambda e: hv.GradientRecorder(e.model, nn.ReLU, store=None), ValueError,
     r"store must be 'device' \(keep on the model's device\) or 'cpu', got None"),
    ("gradient-recorder-dtype", lambda e: hv.GradientRecorder(e.model, nn.ReLU, dtype=torch.long), ValueError,
     r"dtype must be None \(keep the tensor's dtype\) or a floating dtype .* got torch.int64"),
    ("gradient-recorder-reduce", lambda e: hv.GradientRecorder(e.model, nn.ReLU, reduce=5), TypeError,
     r"reduce must be a callable tensor -> tensor \(or None\), got int"),
    ("gradient-recorder-loss", lambda e: hv.GradientRecorder(e.model, nn.ReLU).record([e.x], loss=lambda out, b: out),
     ValueError, r"loss must return a scalar tensor, got a tensor of shape \(2, 5\)"),
    # -- GradientFlow (its existing validation) ------------------------------------------------------------------------
    ("flow-model", lambda e: hv.GradientFlow("net"), TypeError, r"model must be a torch.nn.Module, got str"),
    ("flow-every", lambda e: hv.GradientFlow(e.model, every=0), ValueError,
     r"every must be a positive int \(record every every-th step\), got 0"),
    ("flow-every-float", lambda e: hv.GradientFlow(e.model, every=1.5), ValueError,
     r"every must be a positive int \(record every every-th step\), got 1.5"),
    ("flow-optimizer", lambda e: hv.GradientFlow(e.model, optimizer="adam"), TypeError,
     r"optimizer must be a torch.optim.Optimizer \(with register_step_pre_hook\), got str"),
    ("flow-on-alarm", lambda e: hv.GradientFlow(e.model, on_alarm="shout"), ValueError,
     r"on_alarm must be 'warn', 'log', 'raise' or a callable taking an Alarm, got 'shout'"),
    ("flow-alarms", lambda e: hv.GradientFlow(e.model, alarms="yes"), TypeError,
     r"alarms must be an Alarms, True, False or None, got str"),
    ("flow-alarms-exploding", lambda e: hv.Alarms(exploding=-1), ValueError,
     r"Alarms.exploding must be a positive number or None, got -1"),
    ("flow-alarms-jump", lambda e: hv.Alarms(jump=0.5), ValueError,
     r"Alarms.jump must be > 1 \(a factor over the running median\), got 0.5"),
    ("flow-output-stats", lambda e: hv.GradientFlow(e.model, output_stats="some"), ValueError,
     r"output_stats must be 'parameter-free' or 'all', got 'some'"),
    ("flow-fused-stats", lambda e: hv.GradientFlow(e.model, fused_stats="auto"), TypeError,
     r"fused_stats must be None \(automatic\), True or False, got 'auto'"),
    ("flow-buffer-steps", lambda e: hv.GradientFlow(e.model, buffer_steps=0), ValueError,
     r"buffer_steps must be a positive int, got 0"),
    ("flow-keep", lambda e: hv.GradientFlow(e.model, keep=0), ValueError,
     r"keep must be a positive int or None \(keep every recorded step\), got 0"),
    ("flow-unit-dim", lambda e: hv.GradientFlow(e.model, unit_dim="1"), TypeError, r"unit_dim must be an int, got str"),
    ("flow-select", lambda e: hv.GradientFlow(e.model, select="conv9"), ValueError,
     r"selector 'conv9' matches no module of Net; closest module names: 'conv'"),
    ("flow-scaler", lambda e: hv.GradientFlow(e.model, scaler=3), TypeError,
     r"scaler must be a torch.amp.GradScaler, got int"),
    # -- the CLI: exit code 2, one line on stderr ------------------------------------------------------------------
    ("cli-unknown-method", lambda e: cli("explain", e.image, *CLI_TV, "--method", "gradcamm"), UsageExit,
     r"^hookviz explain: error: unknown method 'gradcamm'; did you mean 'gradcam'\? available: "),
    ("cli-missing-file", lambda e: cli("explain", str(e.tmp / "nope.png"), *CLI_TV, "--method", "saliency"),
     UsageExit, r"^hookviz explain: error: no such image file '.*nope.png'$"),
    ("cli-target-word", lambda e: cli("explain", e.image, *CLI_TV, "--method", "saliency", "--target", "cat"),
     UsageExit, r"^hookviz explain: error: --target: expected a class index or comma-separated class indices .* "
     r"got 'cat'$"),
    ("cli-target-negative", lambda e: cli("explain", e.image, *CLI_TV, "--method", "saliency", "--target", "-1"),
     UsageExit, r"^hookviz explain: error: --target: class indices are >= 0, got -1$"),
    ("cli-target-out-of-range", lambda e: cli("explain", e.image, *CLI_TV, "--method", "saliency", "--size", "32",
                                              "--target", "1000", "--out", str(e.tmp / "fig.png")), UsageExit,
     r"^hookviz explain: error: target class 1000 is out of range: the model has 1000 classes"),
    ("cli-size-word", lambda e: cli("explain", e.image, *CLI_TV, "--method", "saliency", "--size", "big"),
     UsageExit, r"^hookviz explain: error: argument --size: invalid int value: 'big' \(see hookviz explain --help\)$"),
    ("cli-size-small", lambda e: cli("explain", e.image, *CLI_TV, "--method", "saliency", "--size", "8"),
     UsageExit, r"^hookviz explain: error: --size: expected at least 16 pixels, got 8$"),
    ("cli-out-suffix", lambda e: cli("explain", e.image, *CLI_TV, "--method", "saliency", "--out", "fig.gif"),
     UsageExit, r"^hookviz explain: error: --out: the suffix chooses the format, one of .* got 'fig.gif'$"),
    ("cli-scale", lambda e: cli("explain", e.image, *CLI_TV, "--method", "saliency", "--scale", "global"),
     UsageExit, r"^hookviz explain: error: argument --scale: invalid choice: 'global'"),
    ("cli-no-model", lambda e: cli("explain", e.image, "--method", "saliency"), UsageExit,
     r"^hookviz explain: error: the following arguments are required: --model"),
    ("cli-labels-missing", lambda e: cli("explain", e.image, *CLI_TV, "--method", "saliency", "--labels",
                                         str(e.tmp / "labels.txt")), UsageExit,
     r"^hookviz explain: error: --labels: no such file '.*labels.txt'$"),
    ("cli-bomb", lambda e: cli("explain", e.bomb(), *CLI_TV, "--method", "saliency", "--size", "32", "--out",
                               str(e.tmp / "fig.png")), UsageExit,
     r"^hookviz explain: error: images\[0\]: '.*bomb.png' has 1,024 pixels, .*PIL.Image.MAX_IMAGE_PIXELS"),
    ("cli-demo-pointing-images", lambda e: cli("demo", "--pointing-images", "0", "--out", str(e.tmp / "demo.png")),
     UsageExit, r"^hookviz demo: error: --pointing-images: expected at least 1 image, got 0$"),
    ("cli-demo-out", lambda e: cli("demo", "--out", str(e.tmp / "demo.gif")), UsageExit,
     r"^hookviz demo: error: --out: the suffix chooses the format, one of .* got '.*demo.gif'$"),
    ("cli-command", lambda e: cli("explian"), UsageExit,
     r"^hookviz: error: argument command: invalid choice: 'explian'"),
]  # fmt: skip


@pytest.fixture(scope="module")
def explanation() -> hv.Explanation:
    return hv.Saliency(Net()).visualize(torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)))


def test_the_table_is_large_and_ids_are_unique() -> None:
    assert len(ROWS) >= 40
    assert len({r[0] for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize(("call", "error", "match"), [pytest.param(*r[1:], id=r[0]) for r in ROWS])
def test_hostile_input(call, error, match, explanation, tmp_path, monkeypatch) -> None:
    model = Net()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    env = Env(model=model, x=x, exp=explanation, tmp=tmp_path, monkeypatch=monkeypatch)
    x_before = x.clone()
    before = state(model)
    with pytest.raises(error, match=match) as info:
        call(env)
    assert not isinstance(info.value, AssertionError)
    assert_same_state(before, state(model))
    assert torch.equal(x, x_before) and not x.requires_grad and x.grad is None
    assert not any(tmp_path.glob("fig*")) and not any(tmp_path.glob("demo*"))  # no figure written


def test_explanation_save_creates_missing_directories_like_save_figure(explanation, tmp_path) -> None:
    path = explanation.save(tmp_path / "new" / "dir" / "fig.png", dpi=20)
    assert path.is_file() and path.stat().st_size > 0
