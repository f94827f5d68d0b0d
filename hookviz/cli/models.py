"""Loading ``--model``: the embedded models (``shapes``: the shapes CNN, ``vit``: the shapes ViT),
``torchvision:NAME[:WEIGHTS]``, ``timm:NAME[:pretrained]`` (random weights unless ``pretrained`` is asked), a local
state_dict (``--weights``), a whole model saved with ``torch.save(model)`` (``torch.load(weights_only=True)``, full
unpickling only with ``--trust-pickle``) or a TorchScript file. Every command that takes ``--model`` takes these
forms. A download that fails (no network, a proxy, a corrupt cache) is one line naming the cause and what to do.
"""

from __future__ import annotations

import argparse
import difflib
import os
import pickle
import re
import sys
import zipfile
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from ..images import IMAGENET_MEAN, IMAGENET_STD  # noqa: F401  defined once there; cli/evaluate.py imports them here
from .common import UsageError

STATE_DICT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
MODEL_FORMS = "shapes, vit, torchvision:NAME[:WEIGHTS], timm:NAME[:pretrained] or the path of a .pt file"

T = TypeVar("T")

# where an exception comes from when a download failed: the network stack and the hubs' clients
_NETWORK_MODULES = ("urllib", "http", "socket", "ssl", "requests", "httpx", "httpcore", "urllib3", "huggingface_hub")


def _network_cause(exc: BaseException) -> BaseException | None:
    """The exception in `exc`'s chain that says a download failed (a URL, connection, DNS, TLS or hub error)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ConnectionError | TimeoutError) or type(e).__module__.split(".")[0] in _NETWORK_MODULES:
            return e
        e = e.__cause__ or e.__context__
    return None


def _downloading(what: str, fix: str, load: Callable[[], T]) -> T:
    """`load()`, which may download `what`; a failure becomes one line: the cause, then what to do (`fix`)."""
    try:
        return load()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - whatever the hub client raises, the CLI says it in one line
        cause = _network_cause(exc)
        shown = cause if cause is not None else exc
        detail = " ".join(str(shown).split())[:200] or type(shown).__name__
        if cause is not None:
            raise UsageError(
                f"cannot download {what}: no network or the server refused ({type(shown).__name__}: {detail}); {fix}"
            ) from None
        raise UsageError(f"cannot load {what} ({type(shown).__name__}: {detail}); {fix}") from None


# --model names of the embedded models trained on the shapes data: (hookviz.zoo function, how captions name it)
ZOO_MODELS: dict[str, tuple[str, str]] = {
    "shapes": ("shapes_model", "the embedded shapes CNN"),
    "vit": ("shapes_vit", "the embedded shapes ViT"),
}


def zoo_model(spec: str) -> tuple[nn.Module, str] | None:
    """(model, caption) for a ``--model`` that names an embedded model (`ZOO_MODELS`), in eval mode; else None."""
    if spec not in ZOO_MODELS:
        return None
    from .. import zoo

    name, described = ZOO_MODELS[spec]
    return getattr(zoo, name)(), described


def _preset(size: int) -> Any:
    from ..images import Preset

    return Preset(f"cli-{size}", size, size, IMAGENET_MEAN, IMAGENET_STD)


def _own_or_size(model: nn.Module, size: int | None) -> Any:
    """The one preprocessing rule of every entry point, the model's own (`hookviz.images.auto_preprocess`, as
    `visualize` and `grid` use it), unless --size asks for another input size."""
    from ..images import auto_preprocess

    return auto_preprocess(model)[0] if size is None else _preset(size)


def _load_state_dict(path: str) -> dict[str, torch.Tensor]:
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read the file is the user's to fix
        raise UsageError(f"--weights: cannot load {path!r} as a state_dict ({type(exc).__name__}: {exc})") from None
    for key in ("state_dict", "model_state_dict", "model"):  # common checkpoint wrappers
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise UsageError(f"--weights: {path!r} does not hold a state_dict (a dict of tensors)")
    if sd and all(k.startswith("module.") for k in sd):  # saved from DataParallel
        sd = {k[len("module.") :]: v for k, v in sd.items()}
    return sd


def _torchvision_model(name: str, weights: str | None, size: int | None) -> tuple[nn.Module, Any, Any, str]:
    """(model, preprocess, labels, note) for ``torchvision:NAME[:WEIGHTS]`` or ``--weights``."""
    import torchvision
    from torchvision import models

    available = models.list_models(module=torchvision.models)
    if name not in available:
        close = difflib.get_close_matches(name, available, n=5, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else "see torchvision.models.list_models()"
        raise UsageError(f"unknown torchvision classification model {name!r}; {hint}")

    if weights is not None and (
        os.path.exists(weights) or weights.lower().endswith(STATE_DICT_SUFFIXES) or os.sep in weights
    ):
        if not os.path.isfile(weights):
            raise UsageError(f"--weights: no such file {weights!r}")
        sd = _load_state_dict(weights)
        torch.manual_seed(0)
        model = models.get_model(name, weights=None)
        linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        head = f"{linears[-1]}.weight" if linears else None
        if head in sd and sd[head].ndim == 2 and sd[head].shape[0] != model.state_dict()[head].shape[0]:
            model = models.get_model(name, weights=None, num_classes=int(sd[head].shape[0]))
        try:
            result = model.load_state_dict(sd, strict=False)
        except RuntimeError as exc:  # shapes that differ
            lines = [line.strip() for line in str(exc).strip().splitlines()]
            detail = next((line for line in lines if line.startswith("size mismatch")), lines[-1])
            raise UsageError(f"--weights: {weights!r} does not fit torchvision {name}: {detail}") from None
        if result.missing_keys or result.unexpected_keys:
            missing, unexpected = result.missing_keys, result.unexpected_keys
            raise UsageError(
                f"--weights: {weights!r} does not fit torchvision {name}: {len(missing)} missing key(s)"
                + (f" (first {missing[0]!r})" if missing else "")
                + f", {len(unexpected)} unexpected key(s)"
                + (f" (first {unexpected[0]!r})" if unexpected else "")
            )
        return model, _own_or_size(model, size), None, f"weights from {weights}"

    if weights is not None:
        enum = models.get_model_weights(name)
        if weights not in enum.__members__:
            raise UsageError(
                f"torchvision {name} has no weights {weights!r}; available: {', '.join(enum.__members__)} "
                f"(or --weights FILE.pt for a local state_dict)"
            )
        w = enum[weights]
        hub = os.path.join(torch.hub.get_dir(), "checkpoints")
        fix = (
            f"connect once to download it (torchvision caches it in {hub}), or copy the file there from a machine "
            f"that has it ({w.url}), or pass --model torchvision:{name} --weights FILE.pt for a local state_dict, "
            f"or torchvision:{name} for random weights"
        )
        # torchvision downloads and caches the file on first use
        model = _downloading(f"the weights {w} of torchvision {name}", fix, lambda: models.get_model(name, weights=w))
        preprocess = w.transforms() if size is None else w.transforms(crop_size=size, resize_size=size)
        return model, preprocess, w.meta.get("categories"), f"weights {w}"

    torch.manual_seed(0)
    model = models.get_model(name, weights=None)
    note = (
        f"note: torchvision:{name} has RANDOM weights (weights=None, seed 0), so the maps show the mechanics, not "
        f"learned evidence; use torchvision:{name}:DEFAULT for pretrained weights"
    )
    return model, _own_or_size(model, size), None, note


def _timm_model(name: str, weights: str | None, size: int | None) -> tuple[nn.Module, Any, Any, str]:
    """(model, preprocess, labels, note) for ``timm:NAME[:pretrained]``: ``pretrained=False`` (random weights, seed 0)
    unless ``pretrained`` is asked, or a local state_dict (``--weights FILE``). Preprocessing: a `Preset` from the
    model's data config (input size, crop fraction, mean and std), or `size` square when given."""
    try:
        import timm
    except ImportError:
        raise UsageError("--model timm:NAME needs timm: pip install timm") from None
    from ..images import Preset

    if not timm.is_model(name):
        available = timm.list_models()
        close = difflib.get_close_matches(name, available, n=5, cutoff=0.6)
        hint = f"closest: {', '.join(close)}" if close else "see timm.list_models()"
        raise UsageError(f"unknown timm model {name!r}; {hint}")
    local = weights is not None and weights != "pretrained"
    if local and not os.path.isfile(weights):  # type: ignore[arg-type]
        raise UsageError(f"--weights: no such file {weights!r} (timm:{name} takes a state_dict file or :pretrained)")
    torch.manual_seed(0)
    if weights == "pretrained":
        cache = os.environ.get("HF_HOME", "~/.cache/huggingface")
        fix = (
            f"connect once to download it (Hugging Face caches it in {cache}), or pass --model timm:{name} --weights "
            f"FILE.pt for a local state_dict, or timm:{name} for random weights"
        )
        model = _downloading(
            f"the pretrained weights of timm {name}", fix, lambda: timm.create_model(name, pretrained=True)
        )
        note = f"weights timm {name} pretrained"
    else:
        model = timm.create_model(name, pretrained=False)
        note = (
            f"note: timm:{name} has RANDOM weights (pretrained=False, seed 0), so the maps show the mechanics, not "
            f"learned evidence; use timm:{name}:pretrained for pretrained weights"
        )
        if local:
            result = model.load_state_dict(_load_state_dict(weights), strict=False)  # type: ignore[arg-type]
            if result.missing_keys or result.unexpected_keys:
                raise UsageError(
                    f"--weights: {weights!r} does not fit timm {name}: {len(result.missing_keys)} missing key(s), "
                    f"{len(result.unexpected_keys)} unexpected key(s)"
                )
            note = f"weights from {weights}"
    cfg = timm.data.resolve_data_config({}, model=model)
    crop = size or int(cfg["input_size"][-1])
    resize = size or max(crop, round(crop / float(cfg.get("crop_pct") or 1.0)))
    preprocess = Preset(f"timm-{name}", resize, crop, tuple(cfg["mean"]), tuple(cfg["std"]))
    return model, preprocess, None, note


def _is_torchscript(path: str) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        return any(n.endswith("constants.pkl") or "/code/" in n for n in zf.namelist())


def _safe_model_globals() -> list[Any]:
    """What a whole pickled model may name under ``weights_only=True``: the module classes of torch.nn, torchvision
    models and torchvision ops, and ``functools.partial`` (torchvision stores ``norm_layer=partial(nn.LayerNorm, ...)``;
    unpickling a partial calls nothing, and its function must itself be allowed)."""
    import functools
    import importlib
    import pkgutil

    import torchvision

    found: set[type] = set()
    for package in (torch.nn.modules, torchvision.models, torchvision.ops):
        names = [package.__name__] + [i.name for i in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
        for name in names:
            try:
                module = importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112 - an optional submodule that cannot import names nothing to allow
                continue
            for value in vars(module).values():
                if (
                    isinstance(value, type)
                    and issubclass(value, nn.Module)
                    and value.__module__.startswith(("torch.nn.", "torchvision."))
                ):
                    found.add(value)
    return [functools.partial, *sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")]


def _file_model(path: str, device: str, trust_pickle: bool = False) -> nn.Module:
    if not os.path.isfile(path):
        raise UsageError(f"--model: no such model file {path!r}; pass {MODEL_FORMS}")
    try:
        if _is_torchscript(path):
            model = torch.jit.load(path, map_location=device)
        elif trust_pickle:
            print(
                f"hookviz: warning: --trust-pickle: unpickling {path!r} with torch.load(weights_only=False), "
                "which runs any code the file contains",
                file=sys.stderr,
            )
            model = torch.load(path, map_location=device, weights_only=False)
        else:
            with torch.serialization.safe_globals(_safe_model_globals()):
                model = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        if trust_pickle:
            raise UsageError(f"--model: cannot unpickle {path!r} ({exc})") from None
        # torch's message spans many lines; the reason is on the line naming the global that is not allowed
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).splitlines()]
        reason = next((line for line in lines if "Unsupported global" in line), lines[0] if lines else "")
        reason = reason.split(". Please use")[0].removeprefix("WeightsUnpickler error: ")
        raise UsageError(
            f"--model: {path!r} is not a model made of torch.nn / torchvision classes, so it cannot be loaded safely "
            f"with torch.load(weights_only=True) ({reason}); if you trust the file, pass --trust-pickle (unpickling "
            "can run any code in it)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any failure to read the file is the user's to fix
        raise UsageError(
            f"--model: cannot load {path!r} ({type(exc).__name__}: {exc}); a pickled model's class must be importable"
        ) from None
    if isinstance(model, dict):
        raise UsageError(
            f"--model: {path!r} holds a state_dict, not a model; pass --model torchvision:NAME --weights {path}"
        )
    if not isinstance(model, nn.Module):
        raise UsageError(f"--model: {path!r} holds a {type(model).__name__}, not a torch.nn.Module")
    return model


def _load_model(args: argparse.Namespace) -> tuple[nn.Module, Any, Any, str]:
    """(model, preprocess, class names or None, note) for ``args.model`` in any of its forms (`MODEL_FORMS`)."""
    spec = args.model
    if args.trust_pickle and (spec.startswith(("torchvision:", "timm:")) or spec in ZOO_MODELS):
        raise UsageError("--trust-pickle applies to --model PATH.pt; other models and --weights load safely")
    if spec in ZOO_MODELS:
        if args.weights is not None:
            raise UsageError(f"--weights applies to --model torchvision:NAME or timm:NAME; {spec} carries its own")
        if getattr(args, "size", None) is not None:
            raise UsageError(f"--size applies to other models; {spec} takes its own input size (64 pixels)")
        from ..images import auto_preprocess
        from ..zoo import CLASSES

        model, described = zoo_model(spec)  # type: ignore[misc]
        return model, auto_preprocess(model)[0], list(CLASSES), described
    if spec.startswith("timm:"):
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[1] or (len(parts) == 3 and parts[2] != "pretrained"):
            raise UsageError(f"--model: expected timm:NAME or timm:NAME:pretrained, got {spec!r}")
        if len(parts) == 3 and args.weights is not None:
            raise UsageError(f"--model {spec} already names weights; leave out --weights {args.weights}")
        return _timm_model(parts[1], "pretrained" if len(parts) == 3 else args.weights, args.size)
    if spec.startswith("torchvision:"):
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[1]:
            raise UsageError(f"--model: expected torchvision:NAME or torchvision:NAME:WEIGHTS, got {spec!r}")
        name, weights = parts[1], parts[2] if len(parts) == 3 else None
        if weights is not None and args.weights is not None:
            raise UsageError(f"--model {spec} already names weights; leave out --weights {args.weights}")
        return _torchvision_model(name, weights or args.weights, args.size)
    if args.weights is not None:
        raise UsageError(
            "--weights applies to --model torchvision:NAME or timm:NAME; a PATH.pt model carries its own weights"
        )
    model = _file_model(spec, args.device, args.trust_pickle)
    return model, _own_or_size(model, args.size), None, ""
