"""``--model`` in every command (issue 27, point 4): the same forms everywhere (shapes, vit, torchvision:NAME[:WEIGHTS],
timm:NAME[:pretrained], a local file), and a download that fails (no network) as one line with the cause and what to
do, never a traceback. Nothing is downloaded: the download functions are replaced by ones that raise, as they do
without a network, and the caches point to empty folders."""

from __future__ import annotations

import urllib.error

import pytest
import torch
from torch import nn

from hookviz.cli import main
from hookviz.zoo import CLASSES, shapes_image


@pytest.fixture
def offline(tmp_path, monkeypatch) -> list[str]:
    """No network: empty caches, and torch.hub's and the Hugging Face hub's downloads raise what they raise without
    one. Returns the URLs that were asked for."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    asked: list[str] = []

    def no_network(url, *args, **kwargs):
        asked.append(str(url))
        raise urllib.error.URLError(OSError(-3, "Temporary failure in name resolution"))

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    timm_hub = pytest.importorskip("timm.models._hub")

    def no_hub(repo_id, *args, **kwargs):
        asked.append(str(repo_id))
        raise ConnectionError(f"Failed to establish a new connection to huggingface.co for {repo_id}")

    monkeypatch.setattr(timm_hub, "hf_hub_download", no_hub)
    return asked


def one_line_error(capsys, command: str, *args: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main([command, *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hookviz {command}: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def test_explain_torchvision_weights_without_network_is_one_line(images, tmp_path, capsys, offline) -> None:
    """On today's main: a URLError traceback (the download is tried, its exception escapes main)."""
    out = str(tmp_path / "fig.png")
    err = one_line_error(
        capsys, "explain", *images, "--model", "torchvision:resnet18:DEFAULT", "--method", "saliency", "--out", out
    )
    assert len(offline) == 1 and offline[0].endswith(".pth")  # the download was tried, and failed
    assert "cannot download the weights ResNet18_Weights.IMAGENET1K_V1 of torchvision resnet18" in err
    assert "URLError" in err and "Temporary failure in name resolution" in err  # the cause
    # what to do: where the cache is, the file to put there, a local file, or random weights
    assert str(tmp_path / "torch-home" / "hub" / "checkpoints") in err
    assert "resnet18-f37072fd.pth" in err and "--weights FILE.pt" in err and "torchvision:resnet18 for random" in err
    assert not (tmp_path / "fig.png").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["evaluate", "--data", "shapes:2", "--steps", "2"],
        ["features", "--layer", "fc", "--units", "0", "--steps", "1"],
        ["explain-dataset", "--method", "saliency"],
    ],
)
def test_every_command_says_a_failed_download_in_one_line(command, images, tmp_path, capsys, offline) -> None:
    extra = ["--data", str(tmp_path), "--out", str(tmp_path / "store")] if command[0] == "explain-dataset" else []
    if command[0] == "explain-dataset":
        (tmp_path / "cls").mkdir()
        shapes_image(40, seed=3).save(tmp_path / "cls" / "a.png")
    err = one_line_error(capsys, command[0], *command[1:], *extra, "--model", "torchvision:resnet18:DEFAULT")
    assert "cannot download the weights" in err and "URLError" in err


def test_timm_pretrained_without_network_is_one_line(images, tmp_path, capsys, offline) -> None:
    err = one_line_error(
        capsys, "explain", *images, "--model", "timm:resnet18:pretrained", "--method", "saliency", "--out", "x.png"
    )
    assert offline and offline[0].startswith("timm/resnet18")
    assert "cannot download the pretrained weights of timm resnet18" in err and "ConnectionError" in err
    assert "timm:resnet18 for random weights" in err


def test_explain_takes_the_embedded_shapes_models(images, tmp_path, capsys, grids) -> None:
    """On today's main: "--model: no such model file 'shapes'"."""
    for spec in ("shapes", "vit"):
        out = tmp_path / f"{spec}.png"
        assert main(["explain", *images, "--model", spec, "--method", "gradcam", "--out", str(out), "--dpi", "40"]) == 0
        assert out.stat().st_size > 0
    for fig, kwargs in grids:
        assert kwargs["labels"] == list(CLASSES)  # the zoo's class names
        assert kwargs["preprocess"].crop == 64  # the model's own preprocessing, not ImageNet's 224
        assert fig.axes[0].images[0].get_array().shape[:2] == (64, 64)
        assert fig.axes[0].get_ylabel() in CLASSES
    assert "RANDOM" not in capsys.readouterr().out


def test_explain_timm_model_has_random_weights_unless_asked(images, tmp_path, capsys, grids, monkeypatch) -> None:
    timm = pytest.importorskip("timm")
    created = []
    real = timm.create_model

    def spy(name, pretrained=False, **kwargs):
        created.append((name, pretrained))
        return real(name, pretrained=pretrained, **kwargs)

    monkeypatch.setattr(timm, "create_model", spy)
    out = tmp_path / "timm.png"
    args = ["--model", "timm:resnet18", "--method", "saliency", "--size", "32", "--out", str(out), "--dpi", "40"]
    assert main(["explain", images[0], *args]) == 0
    assert created == [("resnet18", False)]
    assert "timm:resnet18 has RANDOM weights (pretrained=False, seed 0)" in capsys.readouterr().out
    ((fig, kwargs),) = grids
    preset = kwargs["preprocess"]
    assert (preset.crop, preset.mean) == (32, (0.485, 0.456, 0.406))  # timm's data config, --size
    assert fig.axes[0].images[0].get_array().shape[:2] == (32, 32)


def test_timm_model_with_a_local_state_dict(images, tmp_path, capsys, grids) -> None:
    timm = pytest.importorskip("timm")
    torch.manual_seed(1)
    state = tmp_path / "w.pt"
    torch.save(timm.create_model("resnet18", pretrained=False).state_dict(), state)
    out = tmp_path / "fig.png"
    args = ["--model", "timm:resnet18", "--weights", str(state), "--method", "saliency", "--size", "32"]
    assert main(["explain", images[0], *args, "--out", str(out), "--dpi", "40"]) == 0
    assert "RANDOM" not in capsys.readouterr().out


def test_model_form_errors_are_one_line(images, tmp_path, capsys) -> None:
    pytest.importorskip("timm")
    out = str(tmp_path / "fig.png")
    err = one_line_error(capsys, "explain", *images, "--model", "timm:resnet19", "--method", "saliency", "--out", out)
    assert "unknown timm model 'resnet19'" in err and "resnet18" in err
    err = one_line_error(capsys, "explain", *images, "--model", "timm:resnet18:v2", "--method", "saliency")
    assert "expected timm:NAME or timm:NAME:pretrained" in err
    err = one_line_error(capsys, "explain", *images, "--model", "shapes", "--weights", "w.pt", "--method", "saliency")
    assert "shapes carries its own" in err
    err = one_line_error(capsys, "explain", *images, "--model", "vit", "--size", "128", "--method", "saliency")
    assert "--size applies to other models; vit takes its own input size" in err
    err = one_line_error(capsys, "explain", *images, "--model", "nope.pt", "--method", "saliency", "--out", out)
    assert "no such model file 'nope.pt'" in err and "shapes, vit" in err and "timm:NAME" in err


def test_features_takes_timm_models(tmp_path, capsys) -> None:
    pytest.importorskip("timm")
    out = tmp_path / "f.png"
    args = ["--model", "timm:resnet18", "--layer", "layer1", "--units", "0", "--steps", "2", "--size", "32"]
    assert main(["features", *args, "--out", str(out)]) == 0
    assert out.stat().st_size > 0


def test_a_pickled_model_of_torch_classes_still_loads(images, tmp_path, grids) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    path = tmp_path / "m.pt"
    torch.save(model, path)
    args = ["--model", str(path), "--method", "saliency", "--size", "32", "--out", str(tmp_path / "f.png")]
    assert main(["explain", images[0], *args, "--dpi", "40"]) == 0
