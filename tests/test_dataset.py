"""explain_dataset / load_explanations: stored maps equal direct calls, crash safety, resume, torchrun, bad input."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dataset_run import BATCH, N_ITEMS, SHARD, TinyData, tiny_model
from torch.utils.data import DataLoader

import hookviz as hv
from hookviz.dataset import store as store_mod

HERE = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), *sys.path]), "OMP_NUM_THREADS": "1"}
LABELS = torch.arange(N_ITEMS) % 5


def _run(out, method=None, data=None, **kw):
    kw = {"target": "label", "batch_size": BATCH, "shard_size": SHARD, "dtype": "float32", "progress": False, **kw}
    return hv.explain_dataset(method or hv.Saliency(tiny_model()), data if data is not None else TinyData(), out, **kw)


def _files(out: Path) -> list[str]:
    return sorted(p.name for p in Path(out).iterdir())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run, and the maps of one direct hookviz call on the whole data set."""
    out = tmp_path_factory.mktemp("ref")
    store = _run(out)
    direct = hv.Saliency(tiny_model()).attribute(TinyData().images(), target=LABELS)
    return store, direct


def test_stored_maps_equal_a_direct_call(reference):
    store, direct = reference
    assert len(store) == N_ITEMS
    torch.testing.assert_close(store[:], direct, rtol=1e-6, atol=1e-7)
    assert store[:].dtype == torch.float32 and store[3].shape == (3, 8, 8)
    torch.testing.assert_close(store[-1], direct[-1], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(store[5:19:3], direct[5:19:3], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(store[[29, 0, 8]], direct[[29, 0, 8]], rtol=1e-6, atol=1e-7)
    assert torch.equal(store.targets, LABELS)
    out = tiny_model()(TinyData().images())
    torch.testing.assert_close(store.scores, out.gather(1, LABELS[:, None])[:, 0])
    with pytest.raises(IndexError, match="out of range for a store of 30"):
        store[30]


def test_manifest_records_the_run(reference):
    store, _ = reference
    m = store.manifest
    assert m["complete"] and m["items"] == N_ITEMS and m["dtype"] == "float32" and m["target"] == {"kind": "label"}
    assert m["method"]["name"] == "Saliency"
    assert m["model"] == hv.dataset.model_fingerprint(tiny_model())
    assert m["model"]["class"] == "Sequential" and len(m["model"]["state_dict_sha256"]) == 64
    assert m["versions"]["torch"] == torch.__version__ and "hookviz" in m["versions"]
    assert [(s["start"], s["stop"]) for s in m["shards"]] == [(0, 8), (8, 16), (16, 24), (24, 30)]
    for s in m["shards"]:
        assert store_mod.sha256_file(store.root / s["file"]) == s["sha256"]
    assert _files(store.root) == ["manifest.json"] + [f"shard-0000{i}.safetensors" for i in range(4)]
    assert hv.load_explanations(store.root).manifest == m


def test_float16_storage_top_class_default_and_a_worker(tmp_path):
    store = _run(tmp_path, target=None, dtype="float16", num_workers=1)  # items come through a worker process
    x = TinyData().images()
    # the direct call in the run's batches (BATCH items, within shards of SHARD, a multiple of BATCH): float32 maps
    # of other batch arrangements may differ in the last bit, which can move a value across a float16 rounding
    # boundary; with the same batches the stored maps are the direct maps rounded to float16, exactly
    assert SHARD % BATCH == 0
    batches = [x[i : i + BATCH] for i in range(0, N_ITEMS, BATCH)]
    direct = torch.cat([hv.Saliency(tiny_model()).attribute(b) for b in batches])
    assert torch.equal(store[:], direct.half().float())
    assert torch.equal(store.targets, torch.cat([tiny_model()(b).argmax(1) for b in batches]))


def test_dataloader_and_bare_images_and_callable_target(tmp_path):
    loader = DataLoader(TinyData(labels=False), batch_size=BATCH, shuffle=True)  # its shuffling is ignored
    store = _run(tmp_path, data=loader, target=lambda out: out[:, 2] - out[:, 0])
    x = TinyData().images()
    direct = hv.Saliency(tiny_model()).attribute(x, target=lambda out: out[:, 2] - out[:, 0])
    torch.testing.assert_close(store[:], direct, rtol=1e-6, atol=1e-7)
    assert (store.targets == -1).all()


def test_gradcam_maps_and_an_explanation_for_grid(tmp_path):
    model = tiny_model()
    store = _run(tmp_path, method=hv.GradCAM(model, layer="1"))
    x = TinyData().images()
    torch.testing.assert_close(store[:], hv.GradCAM(model, layer="1").attribute(x, target=LABELS))
    exp = store.explanation(slice(0, 2), x[:2])
    assert (
        exp.attribution.shape == (2, 1, 8, 8) and exp.method == "GradCAM" and torch.equal(exp.targets[:, 0], LABELS[:2])
    )
    fig = hv.grid([exp])
    assert len(fig.axes) >= 4


def test_sigkill_then_resume_gives_the_uninterrupted_maps(tmp_path, reference):
    out = tmp_path / "run"
    kill_at = 2 * SHARD + 1  # inside shard 2: shards 0 and 1 are finished (or being written) when the process dies
    proc = subprocess.run(
        [sys.executable, str(HERE / "dataset_run.py"), str(out), "--kill-at", str(kill_at)],
        env=ENV,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    killed = json.loads((out / "manifest.json").read_text())
    assert not killed["complete"] and len(killed["shards"]) <= 2
    data = TinyData()
    store = _run(out, data=data)
    done = sum(s["stop"] - s["start"] for s in killed["shards"])
    assert data.loaded == N_ITEMS - done + 1  # only the unfinished shards were computed (+1: item 0, looked at first)
    assert torch.equal(store[:], reference[0][:])
    assert torch.equal(store.targets, reference[0].targets)
    assert not [f for f in _files(out) if f.endswith(".tmp")]
    assert _files(out) == _files(reference[0].root)


def test_corrupted_and_missing_shards_are_recomputed(tmp_path, reference):
    _run(tmp_path)
    shard1 = tmp_path / "shard-00001.safetensors"
    raw = bytearray(shard1.read_bytes())
    raw[-5] ^= 0xFF  # one flipped byte in the maps: same size, other checksum
    shard1.write_bytes(bytes(raw))
    (tmp_path / "shard-00003.safetensors").unlink()
    data = TinyData()
    store = _run(tmp_path, data=data)
    assert data.loaded == SHARD + (N_ITEMS - 3 * SHARD) + 1
    assert torch.equal(store[:], reference[0][:])


def test_a_different_model_method_target_or_dtype_is_refused(tmp_path):
    _run(tmp_path)
    other = tiny_model()
    with torch.no_grad():
        other[0].bias[0] += 1e-3
    with pytest.raises(ValueError, match=r"different model: stored .*state_dict_sha256.*overwrite=True"):
        _run(tmp_path, method=hv.Saliency(other))
    with pytest.raises(ValueError, match="different method: stored .*Saliency.*InputXGradient"):
        _run(tmp_path, method=hv.InputXGradient(tiny_model()))
    with pytest.raises(ValueError, match="different target spec: stored {'kind': 'label'}, now {'kind': 'class'"):
        _run(tmp_path, target=3)
    with pytest.raises(ValueError, match="different dtype: stored 'float32', now 'float16'"):
        _run(tmp_path, dtype="float16")
    with pytest.raises(ValueError, match="already holds a hookviz run; pass resume=True"):
        _run(tmp_path, resume=False)
    manifest = (tmp_path / "manifest.json").read_text()
    store = _run(tmp_path, method=hv.Saliency(other), overwrite=True)  # starts again
    assert store.manifest["model"] == hv.dataset.model_fingerprint(other) and manifest != store.manifest


def test_full_disk_keeps_finished_shards_and_leaves_no_partial_file(tmp_path, monkeypatch, reference):
    real = store_mod._write_bytes
    calls = []

    def full_disk(f, data):
        calls.append(f.name)
        if Path(f.name).name.startswith(".shard-00001"):
            real(f, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(f, data)

    monkeypatch.setattr(store_mod, "_write_bytes", full_disk)
    with pytest.raises(
        OSError, match=r"no space left on device while writing shard 1 .*1 finished shard\(s\) are kept"
    ):
        _run(tmp_path)
    assert _files(tmp_path) == ["manifest.json", "shard-00000.safetensors"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [s["index"] for s in manifest["shards"]] == [0] and not manifest["complete"]
    monkeypatch.setattr(store_mod, "_write_bytes", real)
    assert torch.equal(_run(tmp_path)[:], reference[0][:])


def test_bad_input_is_refused_before_anything_is_written(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="out=.*file.* is a file; pass a directory"):
        _run(a_file)
    with pytest.raises(ValueError, match="is not a writable directory"):
        _run(a_file / "sub")
    with pytest.raises(ValueError, match="target='label' needs a data set that yields \\(image, label\\) pairs"):
        _run(tmp_path / "a", data=TinyData(labels=False))
    with pytest.raises(ValueError, match="dtype must be one of 'float16', 'bfloat16', 'float32', got 'int8'"):
        _run(tmp_path / "b", dtype="int8")
    with pytest.raises(ValueError, match="target string must be 'label'"):
        _run(tmp_path / "c", target="labels")
    with pytest.raises(TypeError, match="method must be a hookviz attribution method instance"):
        _run(tmp_path / "d", method=tiny_model())
    assert _files(tmp_path) == ["file"]


class Mixed(TinyData):
    def __getitem__(self, i):
        image, label = super().__getitem__(i)
        return (image[:, :6] if i == 13 else image), label


@pytest.mark.parametrize("batch_size", [4, 1])
def test_items_of_different_shapes(tmp_path, batch_size):
    with pytest.raises(ValueError, match=r"data items 1[23]\.\.1[3-5] have (different shapes|shape \(3, 6, 8\))"):
        _run(tmp_path, data=Mixed(), batch_size=batch_size)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [s["index"] for s in manifest["shards"]] == [0]  # the finished shard is kept
    assert store_mod.sha256_file(tmp_path / "shard-00000.safetensors") == manifest["shards"][0]["sha256"]


def test_the_model_and_a_user_process_group_are_left_as_they_were(tmp_path):
    model = tiny_model().train()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        _run(tmp_path / "out", method=hv.Saliency(model))
        assert dist.is_initialized()  # not ours to destroy
    finally:
        dist.destroy_process_group()
    assert model.training and all(p.requires_grad for p in model.parameters())
    assert hv.hook_counts(model) == hv.hook_counts(tiny_model())


def test_unfinished_run_cannot_be_loaded(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no hookviz explanations"):
        hv.load_explanations(tmp_path)


def test_two_gloo_ranks_under_torchrun_equal_one_process(tmp_path, reference):
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(HERE / "dataset_run.py"),
        str(out),
    ]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, timeout=180)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    store = hv.load_explanations(out)
    assert torch.equal(store[:], reference[0][:])
    assert torch.equal(store.scores, reference[0].scores)
    assert store.manifest["world_size"] == 2
    assert _files(out) == _files(reference[0].root)  # the ranks' progress manifests are merged and removed


def test_cli_explains_a_folder_of_images(tmp_path, capsys):
    from PIL import Image

    from hookviz.cli import main

    images = TinyData(n=6).images()
    for i in range(6):
        folder = tmp_path / "data" / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (images[i].permute(1, 2, 0) * 255).round().byte().numpy()
        Image.fromarray(pixels).save(folder / f"{i}.png")
    torch.save(tiny_model(), tmp_path / "model.pt")
    args = [
        "explain-dataset",
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "out"),
        "--method",
        "saliency",
        "--model",
        str(tmp_path / "model.pt"),
        "--size",
        "8",
        "--target",
        "label",
        "--batch-size",
        "4",
        "--shard-size",
        "4",
        "--no-progress",
    ]
    assert main(args) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("hookviz explain-dataset: 6 maps (3x8x8, float16) by saliency in ")
    assert summary.endswith(f"2 shards in {(tmp_path / 'out').resolve()}")
    store = hv.load_explanations(tmp_path / "out")
    assert torch.equal(store.targets, torch.tensor([0, 0, 0, 1, 1, 1]))  # ImageFolder order: class0/0,2,4 class1/1,3,5
    with pytest.raises(SystemExit) as exit_info:
        main([*args[:-1], "--dtype", "float32"])
    assert exit_info.value.code == 2
    assert "different dtype: stored 'float16', now 'float32'" in capsys.readouterr().err


def test_cli_shapes_data_needs_the_zoo(tmp_path, capsys, monkeypatch):
    from hookviz import zoo
    from hookviz.cli import main

    monkeypatch.delattr(zoo, "ShapesDataset", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["explain-dataset", "--data", "shapes:4", "--out", str(tmp_path), "--method", "gradcam"])
    assert exit_info.value.code == 2
    assert "needs hookviz.zoo.ShapesDataset, which this hookviz version does not have" in capsys.readouterr().err
