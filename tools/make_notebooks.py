"""Write the notebooks in notebooks/ from the cells below, with no outputs (CI executes them; git keeps them clean).

python tools/make_notebooks.py
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]

FIND_ASSETS = """\
# the notebook runs from notebooks/ (Jupyter, nbmake) or from the repository root
ASSETS = next(p for p in (Path("assets"), Path("../assets")) if (p / "chelsea.png").exists())
CAT = ASSETS / "chelsea.png\""""

QUICKSTART = [
    new_markdown_cell(
        "# hookviz quickstart\n\n"
        "Saliency maps in a notebook: every `visualize` call returns an `Explanation` that shows itself inline.\n\n"
        "This notebook runs offline, so the model has **random weights** (`weights=None`): the maps show how hookviz "
        "works, not what a trained network sees. On your machine, use "
        "`models.resnet18(weights=models.ResNet18_Weights.DEFAULT)` and pass `preprocess=weights.transforms()`, "
        "`labels=weights` to get real maps with ImageNet class names."
    ),
    new_code_cell(
        "from pathlib import Path\n\n"
        "import torch\n"
        "from torchvision import models\n\n"
        "import hookviz as hv\n\n"
        "torch.manual_seed(0)\n"
        "model = models.resnet18(weights=None).eval()\n\n" + FIND_ASSETS
    ),
    new_markdown_cell("## Guided Backpropagation\n\nA path, a PIL image, a numpy array or a tensor: all work."),
    new_code_cell("gb = hv.GuidedBackprop(model).visualize(CAT)\ngb"),
    new_markdown_cell(
        "Every ReLU call was overridden, module or functional; the coverage report says so "
        "(`layer*.relu` modules run twice per block in a ResNet)."
    ),
    new_code_cell("print(gb.coverage)"),
    new_markdown_cell("## Grad-CAM and friends\n\nThe layer is chosen automatically (`repr` says which)."),
    new_code_cell("cam = hv.GradCAM(model)\nexp = cam.visualize(CAT, target=281)\nprint(cam)\nexp"),
    new_code_cell(
        "# several targets per image from one forward pass: a K axis after N\n"
        "multi = hv.GradCAMPlusPlus(model, layer='layer4').visualize(CAT, target=torch.tensor([[281, 285, 1]]))\n"
        "multi"
    ),
    new_markdown_cell("## Raw tensors for code\n\n`attribute` returns tensors on the model's device."),
    new_code_cell(
        "batch = hv.load_images([CAT, CAT]).tensor\n"
        "print(hv.IntegratedGradients(model, steps=16).attribute(batch, target=281).shape)\n"
        "print(hv.GradCAM(model, layer='layer3').attribute(batch, target=281, upsample=True).shape)"
    ),
    new_markdown_cell(
        "## A figure for a paper\n\n"
        "Rows are images, columns are methods; one scale per column, colour bars, fixed size, vector PDF with "
        "embedded fonts."
    ),
    new_code_cell(
        "from hookviz.zoo import shapes_image\n\n"
        "images = [CAT, shapes_image(224)]\n"
        "fig = hv.grid(images, methods=['guided-backprop', 'saliency', 'gradcam', 'integrated-gradients'],\n"
        "              model=model, targets=281, colorbar=True, size=(7.5, 4.2))\n"
        "hv.save_figure(fig, 'quickstart_grid.pdf')\n"
        "fig"
    ),
    new_markdown_cell("## Saving\n\nEvery Explanation saves as PNG, PDF or SVG."),
    new_code_cell("gb.save('quickstart_guided.pdf')\nexp.save('quickstart_gradcam.png')"),
]


def write(name: str, cells: list) -> Path:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    path = ROOT / "notebooks" / name
    nbformat.write(nb, path)
    return path


if __name__ == "__main__":
    print(write("01_quickstart.ipynb", QUICKSTART))
