"""The console script and the embedded sample image."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from hookviz import METHODS
from hookviz.cli import main
from hookviz.zoo import shapes_image


def test_demo_writes_the_figure_and_one_pointing_game_line_per_method(tmp_path, capsys, grids) -> None:
    from hookviz import GradCAM, GuidedBackprop
    from hookviz.metrics import pointing_game
    from hookviz.zoo import CLASSES, shapes, shapes_model

    out = tmp_path / "sub" / "demo.png"
    assert main(["demo", "--out", str(out), "--dpi", "40", "--pointing-images", "12", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out.resolve()}" in printed and "shapes CNN" in printed
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[0] > 0 and im.size[1] > 0
    lines = [line for line in printed.splitlines() if line.startswith("pointing game")]
    assert [line.split()[-2] for line in lines] == ["guided-backprop", "gradcam", "guided-gradcam"]
    assert all(line.startswith("pointing game (12 images): ") for line in lines)
    # the printed scores are the metric on the first 12 images of that seed, for their true classes
    data, model = shapes(12, seed=3), shapes_model()
    for line, method in zip(lines[:2], (GuidedBackprop, GradCAM), strict=True):
        hits = pointing_game(method(model).attribute(data.images, data.labels), data.masks)
        assert float(line.split()[-1]) == pytest.approx(hits.mean().item(), abs=0.005)
    # four rows of different classes, labelled with the predicted class and its probability
    ((fig, kwargs),) = grids
    assert len(fig.axes) == 4 * 4
    rows = [fig.axes[4 * r].get_ylabel().replace("\n", " ") for r in range(4)]
    assert all(row.split()[0] in CLASSES and 0 <= float(row.split()[1]) <= 1 for row in rows), rows
    assert fig.axes[0].images[0].get_array().shape[:2] == (64, 64)


def test_demo_on_an_image_file(tmp_path, capsys, grids) -> None:
    src = tmp_path / "img.png"
    shapes_image(80, seed=3).save(src)
    out = tmp_path / "demo.png"
    assert main(["demo", "--image", str(src), "--out", str(out), "--dpi", "40", "--pointing-images", "4"]) == 0
    assert out.stat().st_size > 0
    ((fig, _),) = grids
    assert len(fig.axes) == 4  # one row: the image, resized to the 64 pixels of the shapes model
    assert fig.axes[0].images[0].get_array().shape[:2] == (64, 64)
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--image", str(tmp_path / "missing.png"), "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("hookviz demo: error: no such image file") and err.count("\n") == 1
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--out", str(tmp_path / "demo.gif")])  # refused before any work
    assert exc.value.code == 2 and "--out: the suffix chooses the format" in capsys.readouterr().err


def test_cli_requires_a_command(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "required" in capsys.readouterr().err


def test_shapes_image_is_deterministic_and_drawn() -> None:
    a = np.asarray(shapes_image(64, seed=1))
    assert a.shape == (64, 64, 3) and a.dtype == np.uint8
    assert np.array_equal(a, np.asarray(shapes_image(64, seed=1)))
    assert not np.array_equal(a, np.asarray(shapes_image(64, seed=2)))
    # the red circle is there: some pixels are strongly red
    assert ((a[..., 0] > 200) & (a[..., 1] < 60)).sum() > 50
    with pytest.raises(ValueError, match="at least 16 pixels"):
        shapes_image(8)


# ---------------------------------------------------------------------------------------------------- explain


def small_cnn(classes: int = 5) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, classes),
    )  # fmt: skip


def titles(fig, n_cols: int) -> list[str]:
    return [ax.get_title().replace("\n", " ") for ax in fig.axes[:n_cols]]  # long titles are wrapped


def explain(*args: str) -> int:
    return main(["explain", *args, "--dpi", "40"])


def fail(capsys, *args: str) -> str:
    """Run `hookviz explain` expecting a usage error: exit code 2 and one line on stderr, no traceback."""
    with pytest.raises(SystemExit) as exc:
        explain(*args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("hookviz explain: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def test_explain_torchvision_model_end_to_end(images, tmp_path, capsys, grids) -> None:
    out = tmp_path / "out" / "fig.png"
    args = ["--model", "torchvision:resnet18", "--method", "saliency,gradcam", "--size", "64", "--out", str(out)]
    assert explain(*images, *args) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out.resolve()}" in printed
    assert "RANDOM weights" in printed  # says that an untrained model's maps show no learned evidence
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ((fig, kwargs),) = grids
    assert len(fig.axes) == 2 * 3 and titles(fig, 3) == ["Input", "Saliency", "Grad-CAM"]
    assert fig.axes[0].images[0].get_array().shape[:2] == (64, 64)
    assert kwargs["targets"] is None  # top class of each image
    assert fig.axes[0].get_ylabel().startswith("class ")


def test_explain_pickled_model_with_k_targets_and_labels_file(images, tmp_path, capsys, grids) -> None:
    model_path = tmp_path / "model.pt"
    torch.save(small_cnn(), model_path)
    labels = tmp_path / "labels.txt"
    labels.write_text("ant\nbee\ncat\ndog\neel\n")
    out = tmp_path / "fig.pdf"
    args = ["--model", str(model_path), "--method", "gradcam", "--target", "1,3", "--labels", str(labels)]
    assert explain(images[0], *args, "--size", "32", "--out", str(out), "--colorbar") == 0
    assert f"wrote {out.resolve()}" in capsys.readouterr().out
    pdf = out.read_bytes()
    assert pdf.startswith(b"%PDF") and b"/FontFile2" in pdf
    ((fig, kwargs),) = grids
    assert titles(fig, 3) == ["Input", "bee", "dog"]  # one method, K = 2 targets: a column per target
    assert kwargs["targets"].tolist() == [[1, 3]]


def test_explain_pickled_model_several_methods_to_svg(images, tmp_path, grids) -> None:
    model_path = tmp_path / "model.pt"
    torch.save(small_cnn(), model_path)
    out = tmp_path / "fig.svg"
    methods = "guided-backprop,gradcam,integrated-gradients"
    assert explain(*images, "--model", str(model_path), "--method", methods, "--size", "32", "--out", str(out)) == 0
    assert b"<svg" in out.read_bytes()[:1000]
    ((fig, _),) = grids
    assert titles(fig, 4) == ["Input", "Guided Backprop", "Grad-CAM", "Integrated Gradients"]


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit is deprecated in favour of torch.export
def test_explain_torchscript_model(images, tmp_path, capsys) -> None:
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.trace(small_cnn(), torch.randn(1, 3, 32, 32)), str(path))
    out = tmp_path / "fig.png"
    assert explain(images[0], "--model", str(path), "--method", "saliency", "--size", "32", "--out", str(out)) == 0
    assert out.exists()
    capsys.readouterr()
    err = fail(capsys, images[0], "--model", str(path), "--method", "gradcam", "--size", "32", "--out", str(out))
    assert "TorchScript" in err and "saliency" in err


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit is deprecated in favour of torch.export
def test_explain_perturbation_methods_through_the_registry(images, tmp_path, grids) -> None:
    path = tmp_path / "scripted.pt"  # forward passes only: a TorchScript model works too
    torch.jit.save(torch.jit.trace(small_cnn(), torch.randn(1, 3, 32, 32)), str(path))
    out = tmp_path / "fig.png"
    args = ["--model", str(path), "--method", "occlusion,rise", "--size", "32", "--out", str(out)]
    assert explain(images[0], *args) == 0
    ((fig, _),) = grids
    assert titles(fig, 3) == ["Input", "Occlusion", "RISE"]


def test_explain_state_dict_weights_with_another_number_of_classes(images, tmp_path, grids) -> None:
    from torchvision import models

    path = tmp_path / "finetuned.pth"
    torch.save({"state_dict": models.resnet18(num_classes=7).state_dict()}, path)
    out = tmp_path / "fig.png"
    args = ["--model", "torchvision:resnet18", "--weights", str(path), "--method", "gradcam", "--target", "6"]
    assert explain(images[0], *args, "--size", "64", "--out", str(out)) == 0
    ((fig, kwargs),) = grids
    assert fig.axes[0].get_ylabel() == "class 6"


def test_explain_torchvision_weights_use_their_transforms_and_categories(images, tmp_path, monkeypatch, grids) -> None:
    # no download in tests: get_model is replaced, the weights enum (transforms, meta) is torchvision's own
    from torchvision import models

    built = []

    def fake_get_model(name, weights=None, **kwargs):
        built.append((name, weights))
        return small_cnn(1000)

    monkeypatch.setattr(models, "get_model", fake_get_model)
    out = tmp_path / "fig.png"
    args = ["--model", "torchvision:resnet18:DEFAULT", "--method", "saliency", "--target", "0", "--size", "48"]
    assert explain(images[0], *args, "--out", str(out)) == 0
    assert built == [("resnet18", models.ResNet18_Weights.IMAGENET1K_V1)]
    ((fig, kwargs),) = grids
    assert kwargs["labels"] == models.ResNet18_Weights.IMAGENET1K_V1.meta["categories"]
    assert type(kwargs["preprocess"]).__name__ == "ImageClassification"
    assert fig.axes[0].get_ylabel() == "tench"  # ImageNet class 0
    assert fig.axes[0].images[0].get_array().shape[:2] == (48, 48)  # --size is the weights' crop


def test_explain_errors_are_one_line_with_exit_code_2(images, tmp_path, capsys) -> None:
    out = str(tmp_path / "fig.png")
    tv = ["--model", "torchvision:resnet18", "--out", out]
    err = fail(capsys, *images, *tv, "--method", "gradcamm")
    assert "unknown method 'gradcamm'" in err and "did you mean 'gradcam'" in err
    # every registered method, in alphabetical order
    assert "available: " + ", ".join(sorted(METHODS)) in err
    assert "available: attention-rollout, deconvnet, deeplift, deeplift-shap, feature-ablation, " in err
    assert "lrp-epsilon-plus-flat" in err
    err = fail(capsys, *images, "--model", "torchvision:resnet19", "--method", "gradcam", "--out", out)
    assert "unknown torchvision classification model 'resnet19'" in err and "resnet18" in err
    err = fail(capsys, str(tmp_path / "missing.png"), *tv, "--method", "gradcam")
    assert "no such image file" in err and "missing.png" in err
    err = fail(capsys, *images, *tv, "--method", "gradcam", "--target", "cat")
    assert "--target" in err and "'cat'" in err
    err = fail(capsys, *images, *tv, "--method", "gradcam", "--target", "-1")
    assert "--target" in err
    err = fail(capsys, *images, "--model", "torchvision:resnet18:FOO", "--method", "gradcam", "--out", out)
    assert "no weights 'FOO'" in err and "IMAGENET1K_V1" in err
    err = fail(capsys, *images, "--model", str(tmp_path / "nope.pt"), "--method", "gradcam", "--out", out)
    assert "no such model file" in err
    err = fail(capsys, *images, *tv, "--method", "gradcam", "--out", str(tmp_path / "fig.gif"))
    assert "--out" in err


def test_explain_model_file_errors(images, tmp_path, capsys) -> None:
    out = str(tmp_path / "fig.png")
    state = tmp_path / "state.pt"
    torch.save(small_cnn().state_dict(), state)
    err = fail(capsys, images[0], "--model", str(state), "--method", "gradcam", "--out", out)
    assert "holds a state_dict" in err and "--weights" in err
    err = fail(capsys, images[0], "--model", "torchvision:resnet18", "--weights", str(state), "--method", "gradcam")
    assert "does not fit torchvision resnet18" in err and "missing key" in err
    model = tmp_path / "model.pt"
    torch.save(small_cnn(), model)
    err = fail(capsys, images[0], "--model", str(model), "--method", "gradcam", "--target", "9", "--size", "32")
    assert "out of range" in err  # hookviz's own target check, as one line
    err = fail(capsys, images[0], "--model", str(model), "--weights", str(state), "--method", "gradcam")
    assert "--weights applies to --model torchvision:NAME" in err


def test_explain_help_warns_about_pickle(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "torch.load(weights_only=True)" in text and "torchvision:NAME[:WEIGHTS]" in text
    assert "--trust-pickle" in text and "arbitrary code" in text and "only for files you trust" in text


class _Payload:
    """Unpickles by running code: writes a marker file, then returns a working model (what an attacker would ship)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        code = (
            f"[__import__('pathlib').Path({self.marker!r}).write_text('pwned'), __import__('torch').nn.Sequential("
            "__import__('torch').nn.Conv2d(3, 4, 3), __import__('torch').nn.ReLU(), "
            "__import__('torch').nn.AdaptiveAvgPool2d(1), __import__('torch').nn.Flatten(), "
            "__import__('torch').nn.Linear(4, 3))][1]"
        )
        return (eval, (code,))


def test_explain_crafted_pickle_runs_no_code_without_trust_pickle(images, tmp_path, capsys) -> None:
    marker = tmp_path / "marker.txt"
    path = tmp_path / "evil.pt"
    torch.save(_Payload(str(marker)), path)
    out = tmp_path / "fig.png"
    err = fail(capsys, images[0], "--model", str(path), "--method", "gradcam", "--size", "32", "--out", str(out))
    assert not marker.exists()  # nothing from the file ran
    assert "--trust-pickle" in err and "weights_only=True" in err and "GLOBAL eval" in err
    assert not out.exists()

    # the explicit opt-in unpickles it (and so runs its code), with a warning
    assert explain(images[0], "--model", str(path), "--trust-pickle", "--method", "gradcam", "--size", "32",
                   "--out", str(out)) == 0  # fmt: skip
    assert marker.read_text() == "pwned" and out.exists()
    err = capsys.readouterr().err
    assert "warning: --trust-pickle" in err and "weights_only=False" in err and "runs any code" in err


class _OwnNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = small_cnn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_explain_models_of_torch_and_torchvision_classes_load_safely(images, tmp_path, capsys) -> None:
    from torchvision import models

    out = tmp_path / "fig.png"
    path = tmp_path / "mobilenet.pt"
    torch.manual_seed(0)
    torch.save(models.mobilenet_v3_small(weights=None, num_classes=4), path)
    assert explain(images[0], "--model", str(path), "--method", "saliency", "--size", "32", "--out", str(out)) == 0
    assert "warning" not in capsys.readouterr().err
    # a class of the user's own: refused by default, loaded with the flag
    own = tmp_path / "own.pt"
    torch.save(_OwnNet(), own)
    err = fail(capsys, images[0], "--model", str(own), "--method", "gradcam", "--size", "32", "--out", str(out))
    assert "_OwnNet" in err and "--trust-pickle" in err
    assert explain(images[0], "--model", str(own), "--trust-pickle", "--method", "gradcam", "--size", "32",
                   "--out", str(out)) == 0  # fmt: skip
    assert "warning: --trust-pickle" in capsys.readouterr().err
    err = fail(capsys, images[0], "--model", "torchvision:resnet18", "--trust-pickle", "--method", "gradcam")
    assert "--trust-pickle applies to --model PATH.pt" in err


def test_every_torch_load_in_the_library_is_weights_only() -> None:
    import ast
    from pathlib import Path

    import hookviz

    root = Path(hookviz.__file__).parent
    calls = []
    for f in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                kw = {k.arg: ast.unparse(k.value) for k in node.keywords}
                calls.append((str(f.relative_to(root)), kw.get("weights_only")))
    assert ("cli/models.py", "True") in calls  # the CLI loads files
    # the one full unpickling is the CLI's --trust-pickle branch
    assert [c for c in calls if c[1] != "True"] == [("cli/models.py", "False")]


# ---------------------------------------------------------------------------------------------------- evaluate


def evaluate_cli(*args: str) -> int:
    return main(["evaluate", "--data", "shapes:8", "--steps", "4", "--sanity-n", "2", *args])


def test_evaluate_prints_the_table_of_hookviz_metrics_evaluate(tmp_path, capsys) -> None:
    from hookviz import GradCAM
    from hookviz.metrics import evaluate, sanity_check
    from hookviz.zoo import shapes, shapes_model

    table, fig = tmp_path / "table.md", tmp_path / "sanity.png"
    assert evaluate_cli("--methods", "gradcam,saliency", "--out", str(table), "--sanity-figure", str(fig)) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0] == "| method | pointing game ↑ | energy in mask ↑ | deletion AUC ↓ | insertion AUC ↑ | sanity ρ ↓ |"
    rows = {line.split("|")[1].strip(): [float(v) for v in line.split("|")[2:-1]] for line in lines[2:4]}
    assert list(rows) == ["gradcam", "saliency"]
    assert "8 fresh shapes images (seed 0)" in printed and "4 steps" in printed and "2 images" in printed
    assert table.read_text().startswith(lines[0]) and "| saliency |" in table.read_text()
    with Image.open(fig) as im:
        assert im.format == "PNG"
    # the same numbers as the library's evaluate and sanity_check with these settings
    data, model = shapes(8, seed=0), shapes_model()
    ref = evaluate(["gradcam", "saliency"], model, data, steps=4, sanity_n=0, seed=0, progress=False)
    for i, name in enumerate(ref.methods):
        assert rows[name][:4] == pytest.approx(ref.table[i].tolist(), abs=5e-4)
    sanity = sanity_check(GradCAM(model), data.images[:2], data.labels[:2], seed=0).final.nanmean()
    assert rows["gradcam"][4] == pytest.approx(sanity.item(), abs=5e-4)


def test_evaluate_without_sanity_check_on_predicted_classes_with_a_tolerance(capsys) -> None:
    from hookviz import GradCAM
    from hookviz.metrics import pointing_game
    from hookviz.zoo import shapes, shapes_model

    assert main(["evaluate", "--methods", "gradcam", "--data", "shapes:6", "--steps", "2", "--sanity-n", "0",
                 "--target", "predicted", "--tolerance", "4"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "sanity" not in printed.splitlines()[0] and printed.count("| gradcam |") == 1
    assert "explaining the predicted classes (pointing game within 4 pixels)" in printed
    data, model = shapes(6, seed=0), shapes_model()
    predicted = model(data.images).argmax(dim=1)
    hits = pointing_game(GradCAM(model).attribute(data.images, predicted), data.masks, tolerance=4)
    assert float(printed.splitlines()[2].split("|")[2]) == pytest.approx(hits.mean().item(), abs=5e-4)


def evaluate_fails(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exc:
        evaluate_cli(*args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("hookviz evaluate: error: ") and err.count("\n") == 1, err
    return err


def test_evaluate_errors_are_one_line_with_exit_code_2(tmp_path, capsys) -> None:
    assert "did you mean 'gradcam'" in evaluate_fails(capsys, "--methods", "gradcm")
    assert "--data: expected shapes:N" in evaluate_fails(capsys, "--methods", "gradcam", "--data", "mnist:10")
    assert "--data: expected shapes:N" in evaluate_fails(capsys, "--methods", "gradcam", "--data", "shapes:0")
    assert "--steps: expected an integer >= 1" in evaluate_fails(capsys, "--methods", "gradcam", "--steps", "0")
    assert "--tolerance: expected a distance" in evaluate_fails(capsys, "--methods", "gradcam", "--tolerance", "-1")
    err = evaluate_fails(capsys, "--methods", "gradcam", "--sanity-figure", str(tmp_path / "s.gif"))
    assert "--sanity-figure" in err and ".png" in err
    err = evaluate_fails(capsys, "--methods", "gradcam", "--weights", str(tmp_path / "w.pt"))
    assert "--weights applies to --model torchvision:NAME" in err
    assert "no such model file" in evaluate_fails(capsys, "--methods", "gradcam", "--model", str(tmp_path / "m.pt"))


def test_evaluate_runs_methods_that_multiply_the_batch_in_chunks(monkeypatch, capsys) -> None:
    import hookviz.metrics as metrics

    seen = {}
    real = metrics.evaluate

    def spy(methods, *args, **kwargs):
        seen.update({type(m).__name__: getattr(m, "batch_size", None) for m in methods})
        return real(methods, *args, **kwargs)

    monkeypatch.setattr(metrics, "evaluate", spy)
    args = ["--methods", "smoothgrad,scorecam,gradcam", "--data", "shapes:2", "--steps", "1", "--sanity-n", "0"]
    assert evaluate_cli(*args, "--batch-size", "8") == 0
    assert seen == {"SmoothGrad": 8, "ScoreCAM": 8, "GradCAM": None}
    assert capsys.readouterr().out.count("|") > 0


# ------------------------------------------------------------------------------------------------ concepts tcav


def concepts_fails(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["concepts", "tcav", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("hookviz concepts: error:") and err.count("\n") == 1, err
    return err


def test_concepts_tcav_demo_writes_table_figure_json_and_report(tmp_path, capsys) -> None:
    import json

    out, rep = tmp_path / "out", tmp_path / "rep"
    args = ["--demo", "--per-set", "6", "--n-random", "2", "--out", str(out), "--report", str(rep)]
    assert main(["concepts", "tcav", *args]) == 0
    printed = capsys.readouterr().out
    assert "| ring | round outline | conv3 |" in printed and "wrote" in printed
    data = json.loads((out / "tcav.json").read_text())
    assert data["method"] == "TCAV" and data["layers"] == ["conv3", "features.4"] and data["n_random"] == 2
    assert data["concepts"] == ["round outline", "straight edges", "circle shape", "background", "random images"]
    assert sorted(r["class_name"] for r in data["rows"][::10]) == ["circle", "ring", "square", "triangle"]
    assert len(data["rows"]) == 4 * 5 * 2 and {"p", "p_corrected", "significant"} <= set(data["rows"][0]["sign_count"])
    md = (out / "tcav.md").read_text()
    assert "## TCAV sign count" in md and "## TCAV magnitude" in md and "p corrected" in md
    with Image.open(out / "tcav.png") as im:
        assert im.size[0] > 400 and im.size[1] > 400
    assert (rep / "index.html").is_file() and (rep / "concept" / "4.html").is_file()


def test_concepts_tcav_on_folders_with_a_class_name_target(tmp_path, capsys) -> None:
    import json

    from hookviz.zoo import shapes, shapes_concepts

    def folder(name: str, images: torch.Tensor) -> str:
        (tmp_path / name).mkdir()
        for i, x in enumerate(images):
            Image.fromarray((x.permute(1, 2, 0) * 255).round().byte().numpy()).save(tmp_path / name / f"{i:02d}.png")
        return str(tmp_path / name)

    sets = shapes_concepts(5)
    random, inputs = folder("random", shapes(12, seed=3).images), folder("inputs", shapes(6, seed=4).images)
    args = ["--model", "shapes", "--layer", "conv3", "--concept", f"round={folder('round', sets['round outline'])}",
            "--concept", f"bg={folder('bg', sets['background'])}", "--random", random, "--inputs", inputs,
            "--target", "ring", "--n-random", "2", "--cav", "mean", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(["concepts", "tcav", *args]) == 0
    data = json.loads((tmp_path / "out" / "tcav.json").read_text())
    assert data["classes"] == [5] and data["concepts"] == ["round", "bg"] and data["cav"] == "mean"
    assert {r["class_name"] for r in data["rows"]} == {"ring"}


def test_concepts_tcav_errors_are_one_line_with_exit_code_2(tmp_path, capsys) -> None:
    out = ["--out", str(tmp_path / "out")]
    assert "--layer, --concept, --random, --inputs needed" in concepts_fails(capsys, "--model", "shapes", *out)
    err = concepts_fails(capsys, "--demo", "--model", "torchvision:resnet18", *out)
    assert "--demo runs on an embedded model" in err
    assert "expected NAME=DIR" in concepts_fails(capsys, "--demo", "--concept", "round", *out)
    assert "no such folder" in concepts_fails(capsys, "--demo", "--concept", f"a={tmp_path / 'nope'}", *out)
    assert "--n-random: expected at least 2" in concepts_fails(capsys, "--demo", "--n-random", "1", *out)
    err = concepts_fails(capsys, "--demo", "--per-set", "3", "--n-random", "2", "--layer", "conv9", *out)
    assert "conv9" in err and "conv3" in err  # the closest names
    assert "--target" in concepts_fails(capsys, "--demo", "--target", "hexagon", *out)
    with pytest.raises(SystemExit) as exc:
        main(["concepts"])
    assert exc.value.code == 2


# -------------------------------------------------------------------------------------------------- concepts crp


def test_concepts_crp_demo_writes_maps_table_relmax_and_report(tmp_path, capsys) -> None:
    import json

    out, rep = tmp_path / "out", tmp_path / "rep"
    args = ["--demo", "--relmax-data", "shapes:40", "--k", "3", "--out", str(out), "--report", str(rep)]
    assert main(["concepts", "crp", *args]) == 0
    printed = capsys.readouterr().out
    assert "| shapes #0 | 5 (ring) |" in printed and "wrote" in printed
    data = json.loads((out / "concept_relevance.json").read_text())
    assert data["method"] == "CRP" and data["layer"] == "features.3" and data["channels"] == [25, 8, 89]
    assert [r["target"] for r in data["inputs"]] == ["5 (ring)"] * 2 + ["3 (star)"] * 2 + ["4 (cross)"] * 2
    # each demo channel carries more of its own class's relevance than of the other classes'
    for j, c in enumerate(data["channels"]):
        own = min(r["relevance"][str(c)] for r in data["inputs"][2 * j : 2 * j + 2])
        others = max(r["relevance"][str(c)] for i, r in enumerate(data["inputs"]) if i // 2 != j)
        assert own > others, (c, own, others)
    assert data["relmax"]["data"] == "shapes:40" and data["relmax"]["target"] == "label"
    assert all(len(v["items"]) == 3 for v in data["relmax"]["relevance"].values())
    assert "| input | target | R at layer | ch 25 | ch 8 | ch 89 |" in (out / "concept_relevance.md").read_text()
    for name in ("crp_maps.png", "concept_relevance.png", "relmax.png", "actmax.png"):
        with Image.open(out / name) as im:
            assert im.size[0] > 300 and im.size[1] > 150, name
    assert (out / "relmax").is_dir()  # the resumable state
    page = (rep / "concept" / "2.html").read_text()
    assert "CRP: channel 89 of features.3" in page and 'src="2-relmax.png"' in page and 'src="2-maps.png"' in page
    assert 'src="concept/0-relmax.png"' in (rep / "index.html").read_text()


def test_concepts_crp_demo_on_the_vit_picks_a_neuron_per_class(tmp_path, capsys) -> None:
    import json

    args = ["--demo", "--model", "vit", "--relmax-data", "shapes:8", "--k", "2", "--out", str(tmp_path / "out")]
    assert main(["concepts", "crp", *args]) == 0
    data = json.loads((tmp_path / "out" / "concept_relevance.json").read_text())
    assert data["layer"] == "blocks.3.mlp.act" and data["channels"] == [29, 35, 43]
    for j, c in enumerate(data["channels"]):  # each neuron is most relevant on its own class's two inputs
        own = min(r["relevance"][str(c)] for r in data["inputs"][2 * j : 2 * j + 2])
        others = max(r["relevance"][str(c)] for i, r in enumerate(data["inputs"]) if i // 2 != j)
        assert own > others, (c, own, others)


def test_concepts_crp_on_a_folder_with_a_class_name_target(tmp_path, capsys) -> None:
    import json

    from hookviz.zoo import shapes

    (tmp_path / "in").mkdir()
    for i, x in enumerate(shapes(3, seed=4).images):
        Image.fromarray((x.permute(1, 2, 0) * 255).round().byte().numpy()).save(tmp_path / "in" / f"{i}.png")
    args = ["--model", "shapes", "--layer", "features.3", "--channels", "3,7", "--inputs", str(tmp_path / "in"),
            "--target", "ring", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(["concepts", "crp", *args]) == 0
    data = json.loads((tmp_path / "out" / "concept_relevance.json").read_text())
    assert [r["input"] for r in data["inputs"]] == ["0.png", "1.png", "2.png"] and data["channels"] == [3, 7]
    assert {r["target"] for r in data["inputs"]} == {"5 (ring)"} and "relmax" not in data
    assert not (tmp_path / "out" / "relmax.png").exists()


def test_concepts_crp_errors_are_one_line_with_exit_code_2(tmp_path, capsys) -> None:
    def fails(*args: str) -> str:
        with pytest.raises(SystemExit) as exc:
            main(["concepts", "crp", *args, "--out", str(tmp_path / "out")])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("hookviz concepts: error:") and err.count("\n") == 1, err
        return err

    assert "--layer, --channels, --inputs needed" in fails("--model", "shapes")
    assert "--channels: expected comma-separated" in fails("--demo", "--channels", "3,x")
    assert "given twice" in fails("--demo", "--channels", "3,3")
    assert "--relmax-data: expected shapes:N" in fails("--demo", "--relmax-data", "mnist:10")
    assert "--k: expected at least 1" in fails("--demo", "--k", "0")
    assert "--demo runs on an embedded model" in fails("--demo", "--model", "torchvision:resnet18")
    err = fails("--demo", "--channels", "3,500", "--relmax-data", "shapes:4")
    assert "500" in err and "96" in err  # the layer's channel count named
    assert "conv9" in fails("--demo", "--layer", "conv9", "--relmax-data", "shapes:4")
