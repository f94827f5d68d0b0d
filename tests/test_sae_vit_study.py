"""The shapes-ViT SAE study (benchmarks/sae_vit_study.py, issue 37 part 8): the patch-mask mapping checked by hand on
synthetic masks, and the study's functions run end to end on 8 images with a tiny SAE."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import torch

from hookviz.features import SAE
from hookviz.zoo import shapes, shapes_vit

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "sae_vit_study.py"
_spec = importlib.util.spec_from_file_location("sae_vit_study", _PATH)
vit_study = importlib.util.module_from_spec(_spec)
sys.modules["sae_vit_study"] = vit_study  # its dataclass looks its module up while being defined
_spec.loader.exec_module(vit_study)


def test_patch_object_by_hand() -> None:
    masks = torch.zeros(2, 64, 64, dtype=torch.bool)
    masks[0, 0:8, 8:16] = True  # patch (row 0, col 1) fully covered: token 1
    masks[0, 8:16, 0:5] = True  # patch (1, 0): 40 of 64 pixels, > 50 %: token 8
    masks[0, 56:64, 60:64] = True  # patch (7, 7): 32 of 64 pixels, exactly 50 %, not an object patch
    masks[0, 16:20, 16:24] = True  # patch (2, 2): 32 pixels ...
    masks[0, 20, 16] = True  # ... plus one: 33 > 32, token 18
    masks[1, 60:64, 0:64] = True  # the bottom row of patches, half covered each: none
    masks[1, 24:40, 40:56] = True  # patches (3, 5), (3, 6), (4, 5), (4, 6): tokens 29, 30, 37, 38
    got = vit_study.patch_object(masks)
    assert got.shape == (2, 64) and got.dtype == torch.bool
    assert torch.nonzero(got[0]).flatten().tolist() == [1, 8, 18]
    assert torch.nonzero(got[1]).flatten().tolist() == [29, 30, 37, 38]
    touched = vit_study.patch_object(masks, threshold=0.0)  # any pixel: also the half-covered patches
    assert torch.nonzero(touched[0]).flatten().tolist() == [1, 8, 18, 63]
    assert torch.nonzero(touched[1]).flatten().tolist() == [29, 30, 37, 38, *range(56, 64)]


def test_patch_tokens_drop_the_class_token() -> None:
    a = torch.arange(2 * 65 * 3).reshape(2, 65, 3)
    rows = vit_study.patch_tokens(a)
    assert rows.shape == (128, 3)
    assert torch.equal(rows[0], a[0, 1]) and torch.equal(rows[64], a[1, 1])


def test_mask_stats_by_hand() -> None:
    latents = torch.zeros(2, 4, 3)
    latents[0, 0, 0] = 3.0  # latent 0: on an object patch of image 0 (class 1)
    latents[1, 2, 0] = 1.0  # ... and on a background patch of image 1
    latents[:, :, 1] = 1.0  # latent 1: everywhere
    objects = torch.tensor([[True, False, False, False], [False, True, False, False]])
    got = vit_study.mask_stats(latents, objects, torch.tensor([1, 0]), n_classes=2)
    assert got.chance == 0.25
    assert torch.allclose(got.object_fraction[:2], torch.tensor([0.75, 0.25]))
    assert math.isnan(got.object_fraction[2])  # never fired
    assert torch.allclose(got.class_share[:, 0], torch.tensor([0.0, 1.0]))
    assert torch.allclose(got.class_share[:, 1], torch.tensor([0.5, 0.5]))


def test_the_study_runs_on_eight_images() -> None:
    torch.manual_seed(0)
    model = shapes_vit().eval()
    data = shapes(8, seed=7)
    layer = "blocks.2"
    sae = vit_study.train(model, layer, data.images, d_sae=32, k=4, steps=3, batch_size=128)
    assert isinstance(sae, SAE) and (sae.d_in, sae.d_sae, sae.k) == (64, 32, 4)
    ev = vit_study.evaluate(model, layer, sae, data.images)
    assert ev.rows == 8 * 64 and ev.l0 <= 4
    cls = vit_study.classifier_metrics(model, layer, sae, data)
    assert set(cls) == {"original", "sae", "zero", "mean"}
    assert all(0 <= r["accuracy"] <= 1 for r in cls.values())
    with torch.no_grad():  # the original run is the model's own output
        ce = torch.nn.functional.cross_entropy(model(data.images).double(), data.labels)
    assert abs(cls["original"]["ce"] - float(ce)) < 1e-9
    objects = vit_study.patch_object(data.masks)
    f = vit_study.patch_latents(model, layer, sae, data.images)
    assert f.shape == (8, 64, 32)
    ms = vit_study.mask_stats(f, objects, data.labels)
    assert abs(ms.chance - float(objects.float().mean())) < 1e-12
    touched = vit_study.patch_object(data.masks, threshold=0.0)
    assert bool((touched >= objects).all())
    att = vit_study.attribution_on_objects(model, layer, sae, data, objects, batch=4, touched=touched)
    for key in ("abs", "pos", "top_abs", "chance", "abs_touched", "chance_touched"):
        assert att[key].shape == (8,) and bool(((att[key] >= 0) & (att[key] <= 1 + 1e-9)).all())
    cfg = dict(layer=layer, command="python x", d_sae=32, k=4, steps=3, train_seconds=0.1, threads=1)
    ms_touched = vit_study.mask_stats(f, touched, data.labels)
    text = vit_study.report(dict(cfg, n_train=8, n=8, seed=7), ev, cls, ms, att, data, ms_touched)
    assert "## Latents against the object masks" in text and "python x" in text and "touches" in text
