"""Embedded sample data and the embedded default model, one concept per module: the synthetic shapes data set
(`hookviz.zoo.data`), the small CNN trained on it and its shipped weights (`hookviz.zoo.model`), and its training
(`hookviz.zoo.train`, ``python -m hookviz.zoo.train --out FILE``)."""

from .data import CLASSES, Shapes, ShapesDataset, shapes, shapes_image
from .model import WEIGHTS_FILE, WEIGHTS_SHA256, ShapesCNN, accuracy, shapes_model
from .train import FRESH_SEED, main, train

__all__ = [
    "CLASSES",
    "FRESH_SEED",
    "WEIGHTS_FILE",
    "WEIGHTS_SHA256",
    "Shapes",
    "ShapesCNN",
    "ShapesDataset",
    "accuracy",
    "main",
    "shapes",
    "shapes_image",
    "shapes_model",
    "train",
]
