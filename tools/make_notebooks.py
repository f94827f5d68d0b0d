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
        "%matplotlib inline\n"
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


GRADIENT_FLOW = [
    new_markdown_cell(
        "# Watching gradient flow while a network trains\n\n"
        "A small CNN learns a synthetic task for 300 steps. At step 200 we plant a problem: the learning rate jumps "
        "500-fold, as a bad schedule would do. `GradientFlow` records per-layer gradient statistics on the device "
        "every step, raises alarms, and names the step and the module where things went wrong."
    ),
    new_code_cell(
        "%matplotlib inline\n"
        "import warnings\n"
        "from collections import OrderedDict\n\n"
        "import torch\n"
        "import torch.nn.functional as F\n"
        "from torch import nn\n\n"
        "import hookviz as hv\n\n"
        "torch.manual_seed(0)\n\n\n"
        "def batch(n=32):\n"
        "    # class = the quadrant that holds a faint blob, under noise, with 10% of the labels wrong\n"
        "    x = torch.randn(n, 1, 16, 16)\n"
        "    y = torch.randint(0, 4, (n,))\n"
        "    for i, q in enumerate(y.tolist()):\n"
        "        r, c = divmod(q, 2)\n"
        "        x[i, 0, r * 8 + 2 : r * 8 + 6, c * 8 + 2 : c * 8 + 6] += 1.0\n"
        "    flip = torch.rand(n) < 0.1\n"
        "    y[flip] = torch.randint(0, 4, (int(flip.sum()),))\n"
        "    return x, y\n\n\n"
        "model = nn.Sequential(OrderedDict(\n"
        "    conv1=nn.Conv2d(1, 8, 3, padding=1), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2),\n"
        "    conv2=nn.Conv2d(8, 16, 3, padding=1), relu2=nn.ReLU(), pool2=nn.MaxPool2d(2),\n"
        "    flat=nn.Flatten(), fc1=nn.Linear(16 * 4 * 4, 32), relu3=nn.ReLU(), fc2=nn.Linear(32, 4),\n"
        "))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)"
    ),
    new_markdown_cell("## Training, watched"),
    new_code_cell(
        "losses = []\n"
        "flow = hv.GradientFlow(model, every=1, on_alarm='warn')\n"
        "with warnings.catch_warnings(record=True) as caught, flow:\n"
        "    warnings.simplefilter('always')\n"
        "    for step in range(300):\n"
        "        if step == 200:\n"
        "            for group in opt.param_groups:\n"
        "                group['lr'] = 5.0  # the planted problem: 500 times the learning rate\n"
        "        x, y = batch()\n"
        "        loss = F.cross_entropy(model(x), y)\n"
        "        opt.zero_grad()\n"
        "        loss.backward()\n"
        "        flow.step()\n"
        "        opt.step()\n"
        "        losses.append(loss.item())\n"
        "print(f'loss at step 0: {losses[0]:.3f}, step 199: {losses[199]:.3f}, last: {losses[-1]}')"
    ),
    new_markdown_cell("## What GradientFlow says\n\nEvery alarm names its kind, the step and the module."),
    new_code_cell(
        "for alarm in flow.alarms[:8]:\n"
        "    print(alarm.kind, 'at step', alarm.step, 'in', alarm.name)\n"
        "first = min(flow.alarms, key=lambda a: a.step)\n"
        "# the notebook is a test: the planted problem must be caught right after it was planted\n"
        "assert 200 <= first.step <= 210, first\n"
        "assert {a.kind for a in flow.alarms} & {'exploding', 'nonfinite'}"
    ),
    new_code_cell("flow.plot_heatmap()"),
    new_code_cell("flow.plot_norms()"),
    new_code_cell("flow.report(step=190)"),
    new_code_cell("flow.plot_bars(step=190)"),
]


def write(name: str, cells: list) -> Path:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    path = ROOT / "notebooks" / name
    nbformat.write(nb, path)
    return path


if __name__ == "__main__":
    print(write("01_quickstart.ipynb", QUICKSTART))
    print(write("02_gradient_flow.ipynb", GRADIENT_FLOW))
