"""Embedded sample data and the embedded models, one concept per module: the synthetic shapes data set
(`hookviz.zoo.data`) and concept example sets drawn from it (`hookviz.zoo.concepts`), the small CNN trained on it
and its shipped weights (`hookviz.zoo.model`: the default model), the small vision transformer trained on it and its
shipped weights (`hookviz.zoo.vit`), the synthetic key-value retrieval task (`hookviz.zoo.retrieval`), its word
tokenizer (`hookviz.zoo.tokenizer`) and the small causal language model trained on it (`hookviz.zoo.lm`,
``retrieval_lm()``), and their training (`hookviz.zoo.train`, ``python -m hookviz.zoo.train [--model vit|lm] --out
FILE``)."""

from .concepts import CONCEPT_NAMES, background_images, outline_images, shapes_concepts
from .data import CLASSES, Shapes, ShapesDataset, shapes, shapes_image
from .lm import (
    LM_WEIGHTS_FILE,
    LM_WEIGHTS_SHA256,
    RetrievalLM,
    RetrievalLMConfig,
    retrieval_accuracy,
    retrieval_lm,
)
from .model import WEIGHTS_FILE, WEIGHTS_SHA256, ShapesCNN, accuracy, shapes_model
from .retrieval import Retrieval, retrieval, training_batch
from .tokenizer import RetrievalTokenizer
from .train import FRESH_SEED, RECIPES, main, train
from .vit import VIT_WEIGHTS_FILE, VIT_WEIGHTS_SHA256, ShapesViT, shapes_vit

__all__ = [
    "CLASSES",
    "CONCEPT_NAMES",
    "FRESH_SEED",
    "LM_WEIGHTS_FILE",
    "LM_WEIGHTS_SHA256",
    "RECIPES",
    "VIT_WEIGHTS_FILE",
    "VIT_WEIGHTS_SHA256",
    "WEIGHTS_FILE",
    "WEIGHTS_SHA256",
    "Shapes",
    "ShapesCNN",
    "ShapesDataset",
    "ShapesViT",
    "Retrieval",
    "RetrievalLM",
    "RetrievalLMConfig",
    "RetrievalTokenizer",
    "accuracy",
    "background_images",
    "main",
    "outline_images",
    "retrieval",
    "retrieval_accuracy",
    "retrieval_lm",
    "shapes",
    "shapes_concepts",
    "shapes_image",
    "shapes_model",
    "shapes_vit",
    "train",
    "training_batch",
]
