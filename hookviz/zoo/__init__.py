"""Embedded sample data and the embedded models, one concept per module: the synthetic shapes data set
(`hookviz.zoo.data`), the small CNN trained on it and its shipped weights (`hookviz.zoo.model`: the default model),
the small vision transformer trained on it and its shipped weights (`hookviz.zoo.vit`), and their training
(`hookviz.zoo.train`, ``python -m hookviz.zoo.train [--model vit] --out FILE``)."""

from .data import CLASSES, Shapes, ShapesDataset, shapes, shapes_image
from .model import WEIGHTS_FILE, WEIGHTS_SHA256, ShapesCNN, accuracy, shapes_model
from .train import FRESH_SEED, RECIPES, main, train
from .vit import VIT_WEIGHTS_FILE, VIT_WEIGHTS_SHA256, ShapesViT, shapes_vit

__all__ = [
    "CLASSES",
    "FRESH_SEED",
    "RECIPES",
    "VIT_WEIGHTS_FILE",
    "VIT_WEIGHTS_SHA256",
    "WEIGHTS_FILE",
    "WEIGHTS_SHA256",
    "Shapes",
    "ShapesCNN",
    "ShapesDataset",
    "ShapesViT",
    "accuracy",
    "main",
    "shapes",
    "shapes_image",
    "shapes_model",
    "shapes_vit",
    "train",
]
