"""hookviz.report: the static HTML report over stores (files, numbers, escaping, bad input, CLI hooks)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import hookviz as hv
from hookviz.cli import main
from hookviz.dataset.store import MANIFEST
from hookviz.explanation import Explanation
from hookviz.report import mapdata
from hookviz.report.output import MARKER
from hookviz.zoo import ShapesDataset, shapes_model

N = 12
METHODS = ("gradcam", "guided-backprop", "saliency")


def _data(path: Path) -> dict:
    text = (path / "data" / "items.js").read_text(encoding="utf-8")
    assert text.startswith("window.HV_DATA=") and text.rstrip().endswith(";")
    return json.loads(text[len("window.HV_DATA=") : text.rstrip().rindex(";")])


@pytest.fixture(scope="module")
def model():
    return shapes_model()


@pytest.fixture(scope="module")
def data():
    return ShapesDataset(N, seed=5)


@pytest.fixture(scope="module")
def stores(tmp_path_factory, model, data):
    root = tmp_path_factory.mktemp("stores")
    for name in METHODS:
        hv.explain_dataset(hv.METHODS[name](model), data, root / name, target="label", shard_size=8, progress=False)
    return [root / name for name in METHODS]


@pytest.fixture(scope="module")
def built(tmp_path_factory, stores, model, data):
    out = tmp_path_factory.mktemp("report") / "r"
    index = hv.report(stores, out, data=data, model=model, workers=2)
    return out, index


def test_files_thumbnails_and_items(built, stores, model, data):
    out, index = built
    assert index == out / "index.html" and index.is_file() and (out / "summary.html").is_file()
    assert json.loads((out / MARKER).read_text())["items"] == N
    d = _data(out)
    assert d["n"] == N and [m["name"] for m in d["methods"]] == list(METHODS)
    assert d["labels"] == data.shapes.labels.tolist()
    assert d["classes"] == list(data.classes)
    with torch.no_grad():
        p = model(data.shapes.images).softmax(dim=1)
    assert d["preds"] == p.argmax(dim=1).tolist()
    np.testing.assert_allclose(d["probs"], p.max(dim=1).values.numpy(), atol=1e-4)
    # thumbnails: one sprite sheet of N tiles side by side per column (N < 64 items: one sheet)
    sheet = np.asarray(Image.open(out / "img" / "0.png").convert("RGB"))
    assert sheet.shape == (64, 64 * N, 3)
    want_img = hv.display.to_uint8(data.shapes.images).permute(0, 2, 3, 1).numpy()
    np.testing.assert_array_equal(sheet[:, 64 * 3 : 64 * 4], want_img[3])
    # the method thumbnails are drawn by the page from the map files (pixels checked in test_report_browser.py)
    assert not (out / "m").exists()
    assert [m["folder"] for m in d["methods"]] == [None] * len(METHODS)
    assert [(m["alpha"], m["alphaByMap"]) for m in d["methods"]] == [(0.5, False), (0.5, True), (0.5, False)]


def test_thumbnail_files_where_the_page_cannot_draw_them(tmp_path, monkeypatch):
    """An overlay whose opacity follows the map, on images larger than a thumbnail, keeps its PNG thumbnails: the
    page would need every full-size image to blend it. They are what Explanation.overlay draws, resized."""
    from hookviz.report import thumbnails

    defaults = {**hv.GuidedBackprop.display_defaults, "overlay": True}
    monkeypatch.setattr(hv.GuidedBackprop, "display_defaults", defaults)
    data = ShapesDataset(3, seed=2, size=160)
    g = torch.Generator().manual_seed(0)
    maps = {"guided-backprop": torch.randn(3, 3, 160, 160, generator=g), "saliency": torch.randn(3, 1, 160, 160)}
    hv.report(maps, tmp_path / "r", data=data, workers=1)
    d = _data(tmp_path / "r")
    assert [m["folder"] for m in d["methods"]] == ["m/0", None]
    assert not (tmp_path / "r" / "m" / "1").exists()
    exp = Explanation(maps["guided-backprop"], data.shapes.images, data.shapes.images, None, torch.zeros(3, 1), "gb")
    exp = exp.with_display(**defaults)
    # like with like: the report renders on one torch thread; with more, torch splits the image into other chunks,
    # whose vectorised bodies and scalar tails round float32 differently, moving a value on a .5 edge by 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = hv.display.to_uint8(hv.display.resize(exp.overlay(), (128, 128))).permute(0, 2, 3, 1).numpy()
    finally:
        torch.set_num_threads(threads)
    sheet = np.asarray(Image.open(tmp_path / "r" / "m" / "0" / "0.png").convert("RGB"))
    assert sheet.shape == (128, 3 * 128, 3)
    for i in range(3):
        np.testing.assert_array_equal(sheet[:, 128 * i : 128 * (i + 1)], want[i])
    # the rule itself, over the cases
    column = thumbnails.Column("x", maps["saliency"], None, None, {}, {})
    assert thumbnails.drawn_in_page(column, (160, 160), (128, 128))  # overlay, one opacity: drawn
    column.display = {"overlay": True, "alpha_by_map": True}
    assert thumbnails.drawn_in_page(column, (64, 64), (64, 64))  # the image is its own thumbnail: drawn
    assert not thumbnails.drawn_in_page(column, (160, 160), (128, 128))
    column.display = {"overlay": False, "alpha_by_map": True}
    assert thumbnails.drawn_in_page(column, (160, 160), (128, 128))  # no overlay: opacity unused
    column.display = {"scale": "shared"}
    assert not thumbnails.drawn_in_page(column, (64, 64), (64, 64))


def test_old_report_is_rebuilt_whole(tmp_path, stores, data):
    """A folder holding a report of the previous format (method thumbnails as PNG sprite sheets, map files as plain
    16-bit codes) is rebuilt: none of its files is left behind to be mixed with the new ones."""
    out = tmp_path / "r"
    hv.report(stores[:2], out, data=data, workers=1)
    (out / "m" / "0").mkdir(parents=True)
    (out / "m" / "0" / "0.png").write_bytes((out / "img" / "0.png").read_bytes())
    (out / "maps" / "00007.js").write_text('HV.maps(7,[{"shape":[1,2,2],"lo":[0],"hi":[1],"data":"AAAAAAAAAAA="}]);\n')
    (out / MARKER).write_text(json.dumps({"format": "hookviz-report", "complete": True, "items": N, "methods": []}))
    hv.report(stores[:2], out, data=data, workers=1)
    assert not (out / "m").exists() and not (out / "maps" / "00007.js").exists()
    assert sorted(p.name for p in (out / "maps").iterdir()) == ["00000.js"]
    assert (
        '"z":' in (out / "maps" / "00000.js").read_text() and '"data":' not in (out / "maps" / "00000.js").read_text()
    )
    mark = json.loads((out / MARKER).read_text())
    assert mark["complete"] is True and mark["version"] == 2


def test_per_image_metrics_and_summary(built, stores, data):
    out, _ = built
    d = _data(out)
    html = (out / "summary.html").read_text(encoding="utf-8")
    for j, path in enumerate(stores):
        maps = hv.load_explanations(path)[:]
        hits = hv.pointing_game(maps, data.shapes.masks).float()
        energy = hv.energy_in_mask(maps, data.shapes.masks)
        got = d["methods"][j]["metrics"]
        assert got["pointing game"] == hits.tolist()
        np.testing.assert_allclose(got["energy in mask"], energy.numpy(), atol=1e-4)
        assert d["methods"][j]["targets"] == data.shapes.labels.tolist()  # target="label"
        # the summary's mean, and one per-class mean, by hand
        assert f"{hits.mean().item():.3f}" in html
        k = int(data.shapes.labels[0])
        mean_k = energy[data.shapes.labels == k].mean().item()
        assert f"{mean_k:.3f}" in html


def test_detail_maps_round_trip(built, stores):
    out, _ = built
    text = (out / "maps" / "00000.js").read_text()
    match = re.fullmatch(r"HV\.maps\(0,(.*)\);\n", text, flags=re.S)
    assert match is not None
    records = json.loads(match.group(1))
    for j, path in enumerate(stores):
        maps = hv.load_explanations(path)[: mapdata.BLOCK]
        if j == 2:  # saliency is displayed reduced with max-abs over its channels
            maps = hv.display.reduce_channels(maps, "max-abs")
        got = mapdata.decode(records[j])
        assert got.shape == maps.shape
        span = (maps.flatten(1).amax(1) - maps.flatten(1).amin(1)).view(-1, 1, 1, 1)
        # 16-bit codes over each map's range: within half a step (and float32 rounding of the decoded value)
        assert ((got - maps).abs() <= span / 65534 / 2 * 1.001 + 1e-6 * maps.abs()).all()
        assert ((maps == 0) <= (got == 0)).all()  # 0 decodes to exactly 0
    assert records[1]["shape"][0] == 3  # Guided Backprop keeps its RGB channels (display reduce None)
    assert all(set(r) == {"shape", "lo", "step", "z"} for r in records)  # deflated byte planes, nothing else


def test_html_is_escaped(tmp_path, stores, data):
    evil = "<script>alert(1)</script>"

    class Evil(torch.utils.data.Dataset):
        shapes = data.shapes
        classes = (evil, *data.classes[1:])

        def __len__(self):
            return N

        def __getitem__(self, i):
            return data[i]

    Evil.shapes = type(data.shapes)(
        data.shapes.images, data.shapes.labels, data.shapes.masks, data.shapes.boxes, (evil, *data.classes[1:])
    )
    labels = data.shapes.labels.clone()
    labels[0] = 0
    Evil.shapes = type(data.shapes)(
        data.shapes.images, labels, data.shapes.masks, data.shapes.boxes, (evil, *data.classes[1:])
    )
    out = tmp_path / "r"
    hv.report(stores, out, data=Evil(), title=f"title {evil}", workers=1)
    for page in ("index.html", "summary.html"):
        text = (out / page).read_text(encoding="utf-8")
        assert "<script>alert" not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert _data(out)["classes"][0] == evil  # data, set as textContent by the script (see the browser test)


def test_memory_maps_and_explain_dataset_report(tmp_path, model, data):
    maps = hv.GradCAM(model).attribute(data.shapes.images, data.shapes.labels)
    index = hv.report({"gradcam": maps}, tmp_path / "mem", data=data, workers=1)
    d = _data(index.parent)
    assert d["methods"][0]["targets"] == [-1] * N and d["preds"] is None
    np.testing.assert_allclose(
        d["methods"][0]["metrics"]["energy in mask"], hv.energy_in_mask(maps, data.shapes.masks).numpy(), atol=1e-4
    )
    store = hv.explain_dataset(hv.GradCAM(model), data, tmp_path / "run", target="label", progress=False, report=True)
    assert (tmp_path / "run" / "report" / "index.html").is_file() and len(store) == N
    assert _data(tmp_path / "run" / "report")["labels"] == data.shapes.labels.tolist()
    with pytest.raises(TypeError, match="report must be a bool or a folder path, got int"):
        hv.explain_dataset(hv.GradCAM(model), data, tmp_path / "run2", report=1, progress=False)


def test_model_left_as_it_was(tmp_path, stores, data):
    model = shapes_model().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hv.report(stores[:1], tmp_path / "r", data=data, model=model, workers=1)
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ------------------------------------------------------------------------------------------------ bad input


def test_missing_and_incomplete_stores(tmp_path, stores):
    with pytest.raises(FileNotFoundError, match="no store at .*nowhere"):
        hv.report(tmp_path / "nowhere", tmp_path / "r")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"holds no hookviz explanations \(manifest.json missing"):
        hv.report(tmp_path / "empty", tmp_path / "r")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in stores[0].iterdir():
        if f.is_file():
            (broken / f.name).write_bytes(f.read_bytes())
    (broken / "shard-00001.safetensors").unlink()
    with pytest.raises(ValueError, match=r"incomplete run: 1 of 2 shards missing \(shard-00001.safetensors\)"):
        hv.report(broken, tmp_path / "r")
    manifest = json.loads((broken / MANIFEST).read_text())
    manifest["complete"], manifest["shards"] = False, manifest["shards"][:0]
    (broken / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"2 of 2 shards missing \(shard-00000.safetensors, shard-00001"):
        hv.report(broken, tmp_path / "r")
    assert not (tmp_path / "r").exists()  # nothing written before the checks pass
    with pytest.raises(TypeError, match="stores must be a store directory, an ExplanationStore or a non-empty list"):
        hv.report([], tmp_path / "r")
    with pytest.raises(TypeError, match="stores must be store directories .* got int"):
        hv.report([stores[0], 3], tmp_path / "r")


def test_stores_over_different_images(tmp_path, stores, model):
    other = hv.explain_dataset(hv.GradCAM(model), ShapesDataset(N, seed=6), tmp_path / "o", progress=False)
    with pytest.raises(ValueError, match=r"must explain the same images: .* differ in data set .*'seed': 5.* vs "):
        hv.report([stores[0], other], tmp_path / "r")
    fewer = hv.explain_dataset(hv.GradCAM(model), ShapesDataset(N - 1, seed=5), tmp_path / "f", progress=False)
    with pytest.raises(ValueError, match=r"differ in number of items \(12 vs 11\)"):
        hv.report([stores[0], fewer], tmp_path / "r")
    with pytest.raises(ValueError, match=r"data has 11 items but the stores hold maps of 12"):
        hv.report(stores[0], tmp_path / "r", data=ShapesDataset(N - 1, seed=5))
    multi = tmp_path / "multi"
    multi.mkdir()
    for f in stores[0].iterdir():
        if f.is_file():
            (multi / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((multi / MANIFEST).read_text())
    (multi / MANIFEST).write_text(json.dumps({**manifest, "multi_target": True}))
    with pytest.raises(ValueError, match=r"holds K targets per image \(multi_target\); the report shows one map"):
        hv.report(multi, tmp_path / "r")
    with pytest.raises(ValueError, match=r"stores must hold maps of the same images: 'b' has 3 maps, not 2"):
        hv.report({"a": torch.zeros(2, 1, 4, 4), "b": torch.zeros(3, 1, 4, 4)}, tmp_path / "r")


def test_output_folder(tmp_path, stores, data):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match=r"exists, is not empty and is not a hookviz report; pass overwrite=True"):
        hv.report(stores[0], out, data=data)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    hv.report(stores[0], out, data=data, overwrite=True, workers=1)
    assert (out / "notes.txt").read_text() == "keep me" and (out / "index.html").is_file()
    # a previous report is rebuilt without overwrite, its old files replaced
    (out / "img" / "999.png").write_bytes(b"stale")
    hv.report(stores[:2], out, data=data, workers=1)
    assert not (out / "img" / "999.png").exists() and (out / "img" / "0.png").is_file()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; pass a directory"):
        hv.report(stores[0], tmp_path / "file")
    with pytest.raises(ValueError, match="workers must be an int >= 1 or None, got 0"):
        hv.report(stores[0], tmp_path / "w", workers=0)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module or None, got str"):
        hv.report(stores[0], tmp_path / "w", model="resnet")


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_report(tmp_path, stores, capsys):
    assert main(["report", str(stores[0]), str(stores[1]), "--out", str(tmp_path / "r"), "--workers", "1"]) == 0
    assert "hookviz report: wrote" in capsys.readouterr().out
    d = _data(tmp_path / "r")
    # rebuilt from the manifest's data record; the embedded model, recognised by its fingerprint, predicts
    assert d["source"] == f"{N} shapes images (seed 5)" and d["preds"] is not None and d["probs"] is not None
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "a").write_text("a")
    with pytest.raises(SystemExit) as exc:
        main(["report", str(stores[0]), "--out", str(tmp_path / "x")])
    assert exc.value.code == 2
    assert "hookviz report: error: out=" in capsys.readouterr().err
    assert main(["report", str(stores[0]), "--out", str(tmp_path / "x"), "--overwrite", "--workers", "1"]) == 0


def test_cli_evaluate_report(tmp_path, capsys):
    out = tmp_path / "ev"
    argv = ["evaluate", "--methods", "gradcam,saliency", "--data", "shapes:6", "--steps", "3", "--sanity-n", "1"]
    assert main([*argv, "--report", str(out)]) == 0
    d = _data(out)
    assert [m["name"] for m in d["methods"]] == ["gradcam", "saliency"]
    assert set(d["metrics"]) >= {"pointing game", "energy in mask", "deletion AUC", "insertion AUC", "sanity ρ"}
    assert all(v is not None for v in d["methods"][0]["metrics"]["deletion AUC"])
    assert (out / "sanity.png").is_file() and 'src="sanity.png"' in (out / "summary.html").read_text()
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("| gradcam"))
    assert row.split("|")[3].strip() in (out / "summary.html").read_text()  # the energy-in-mask mean, as printed


def test_interrupted_build_is_rebuilt(tmp_path, stores, data, monkeypatch):
    from hookviz.report import build

    out = tmp_path / "r"

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(build.thumbnails, "write_block", boom)
    with pytest.raises(KeyboardInterrupt):
        hv.report(stores[0], out, data=data, workers=1)
    assert json.loads((out / MARKER).read_text())["complete"] is False
    monkeypatch.undo()
    hv.report(stores[0], out, data=data, workers=1)  # recognised as a report: no overwrite needed
    assert json.loads((out / MARKER).read_text())["complete"] is True


def test_cli_evaluate_report_computes_each_map_once(tmp_path, monkeypatch):
    """`evaluate --report` shows the maps that `evaluate` scored: one `attribute` call over the images per method
    (the sanity check's calls on its --sanity-n images apart), where it used to compute every map again for the
    report; the report is the one built from maps computed again, file for file."""
    from hookviz.cli import evaluate as cli_evaluate
    from hookviz.metrics import evaluate as real_evaluate

    calls: list[tuple[str, int]] = []
    real_methods = cli_evaluate._methods

    def counted(*args, **kwargs):
        methods = real_methods(*args, **kwargs)
        for m in methods:
            m.attribute = wrap(m.attribute, type(m).__name__)
        return methods

    def wrap(original, name):
        def attribute(x, *a, **kw):
            calls.append((name, x.shape[0]))
            return original(x, *a, **kw)

        return attribute

    monkeypatch.setattr(cli_evaluate, "_methods", counted)
    argv = ["evaluate", "--methods", "gradcam,saliency", "--data", "shapes:6", "--steps", "3", "--sanity-n", "1"]
    assert main([*argv, "--report", str(tmp_path / "once")]) == 0
    assert sorted(c for c in calls if c[1] == 6) == [("GradCAM", 6), ("Saliency", 6)]
    # the old path, for the comparison: evaluate keeps no maps, so the report computes them again
    calls.clear()
    monkeypatch.setattr("hookviz.metrics.evaluate", lambda *a, **kw: real_evaluate(*a, **{**kw, "keep_maps": False}))
    assert main([*argv, "--report", str(tmp_path / "twice")]) == 0
    assert sorted(c for c in calls if c[1] == 6) == [("GradCAM", 6), ("GradCAM", 6), ("Saliency", 6), ("Saliency", 6)]
    once = sorted(p.relative_to(tmp_path / "once") for p in (tmp_path / "once").rglob("*") if p.is_file())
    twice = sorted(p.relative_to(tmp_path / "twice") for p in (tmp_path / "twice").rglob("*") if p.is_file())
    assert once == twice and len(once) > 5
    differ = [p for p in once if (tmp_path / "once" / p).read_bytes() != (tmp_path / "twice" / p).read_bytes()]
    # only the marker may differ, which holds the build time (equal when both builds round to the same seconds)
    assert set(differ) <= {Path(MARKER)}
    marks = [json.loads((tmp_path / run / MARKER).read_text()) for run in ("once", "twice")]
    assert marks[0].keys() == marks[1].keys() and all(marks[0][k] == marks[1][k] for k in marks[0] if k != "seconds")


#: how far (in colour-map bins, 1/256) the 16-bit codes may move a normalised value in any display mode: a step of
#: range / 65534 is 1/256 of a bin in minmax; seed mode divides by 10 std, which for sparse gradient maps is ~1/60 of
#: the range, so a step there moves a value by a few hundredths of a bin (0.08 the largest here: printed with -s)
EPS_BINS = 0.1


@pytest.mark.parametrize("scale", ["sample", "shared"])
def test_stored_maps_display_as_the_originals_in_every_mode(built, stores, scale):
    """The map files keep 16-bit codes over each map's range; what the detail view shows from them (normalised in
    every mode and sign, each map on its own or one scale over the item's maps, binned into a 256-entry colour map
    or rounded to 8-bit RGB) is what the full-precision maps show: normalised values within EPS_BINS of a bin, so
    the same colour-map bin except for a value that sits within that of a bin's edge, which may take the next one
    (the display's own float rounding does as much); RGB within 1.
    (That the page's normaliser is hookviz.display.normalize is test_report_browser's test.)"""
    out, _ = built
    text = (out / "maps" / "00000.js").read_text()
    records = json.loads(text[text.index(",") + 1 : text.rindex(")")])
    originals, stored = [], []
    for j, path in enumerate(stores):
        maps = hv.load_explanations(path)[:N].float()
        if j == 2:  # saliency: displayed reduced with max-abs over its channels, as stored
            maps = hv.display.reduce_channels(maps, "max-abs")
        originals.append(maps)
        stored.append(mapdata.decode(records[j]))
    worst = 0.0
    for mode in hv.display.NORMALIZATIONS:
        for sign in hv.display.SIGNS:
            for i in range(N):
                a = [m[i : i + 1].flatten() for m in originals]
                b = [m[i : i + 1].flatten() for m in stored]
                if scale == "shared":  # the detail view pools the item's maps: one set of statistics
                    want = [hv.display.normalize(torch.cat(a)[None], mode, sign=sign)[0]]
                    got = [hv.display.normalize(torch.cat(b)[None], mode, sign=sign)[0]]
                else:
                    want = [hv.display.normalize(x[None], mode, sign=sign)[0] for x in a]
                    got = [hv.display.normalize(x[None], mode, sign=sign)[0] for x in b]
                for w, g in zip(want, got, strict=True):
                    worst = max(worst, float((w - g).abs().max()) * 256)
                    assert (w - g).abs().max() <= EPS_BINS / 256, (mode, sign, i)
                    bins_w = (w * 256).floor().clamp(max=255)
                    bins_g = (g * 256).floor().clamp(max=255)
                    # a bin changes only for a value within EPS_BINS of a bin's edge, and then to the next bin
                    edge = ((w * 256 - (w * 256).round()).abs() <= EPS_BINS) & (w > 0) & (w < 1)
                    assert ((bins_w != bins_g) <= edge).all() and (bins_w - bins_g).abs().max() <= 1, (mode, sign, i)
                    rgb_w, rgb_g = hv.display.to_uint8(w).int(), hv.display.to_uint8(g).int()
                    assert (rgb_w - rgb_g).abs().max() <= 1, (mode, sign, i)
    print(f"largest change of a normalised value: {worst:.4f} colour-map bins")
