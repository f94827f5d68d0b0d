"""GradientFlowCallback in a real Hugging Face ``Trainer`` on a tiny BERT built from a config (no downloads, CPU):
gradients read once per optimizer step after accumulation, equal to a plain backward pass, scalars in TensorBoard."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from hookviz import hook_counts  # noqa: E402
from hookviz.integrations.transformers import GradientFlowCallback  # noqa: E402

SEQ = 12


def tiny_bert() -> torch.nn.Module:
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def example() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, 64, (SEQ,), generator=g), "labels": torch.tensor(2)}


def train(model, callback, tmp_path, accumulation: int, steps: int):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=accumulation,
        learning_rate=1e-3,
        max_grad_norm=0.0,  # the callback runs after the Trainer's clipping: none here
        use_cpu=True,
        report_to=["tensorboard"],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=[example()] * 16, callbacks=[callback])
    trainer.train()
    return trainer


def test_trainer_with_accumulation_logs_the_accumulated_gradient(tmp_path) -> None:
    """One statistics step per optimizer step, on the gradient accumulated over two micro-batches: its total norm is
    the one the Trainer logs itself (``grad_norm``, before clipping: no clipping here). Every micro-batch holds the
    same examples, so the accumulated gradient is a multiple of one plain backward pass: the classifier's share of
    the total norm must be the plain pass's (whatever loss scaling the Trainer applies to micro-batches)."""
    reference = tiny_bert()
    batch = {k: torch.stack([v] * 4) for k, v in example().items()}
    reference(**batch).loss.backward()
    head = reference.classifier
    plain_head = math.sqrt(head.weight.grad.norm().item() ** 2 + head.bias.grad.norm().item() ** 2)
    plain_total = math.sqrt(sum(p.grad.norm().item() ** 2 for p in reference.parameters() if p.grad is not None))

    model = tiny_bert()
    callback = GradientFlowCallback(every=1)
    trainer = train(model, callback, tmp_path, accumulation=2, steps=2)
    assert [step for step, _ in callback.history] == [0, 1]  # one statistics step per optimizer step
    first = callback.history[0][1]
    logged = [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e]
    assert math.isclose(first["flow/grad_norm/total"], float(logged[0]), rel_tol=1e-4)
    ratio = first["flow/grad_norm/classifier"] / first["flow/grad_norm/total"]
    assert math.isclose(ratio, plain_head / plain_total, rel_tol=1e-4)
    events = EventAccumulator(str(tmp_path / "runs" / "hookviz_flow"))
    events.Reload()
    scalars = events.Scalars("flow/grad_norm/classifier")
    assert [s.step for s in scalars] == [0, 1]
    assert math.isclose(scalars[0].value, first["flow/grad_norm/classifier"], rel_tol=1e-6)
    assert "flow/grad_norm/bert.encoder.layer.1.attention.self.query" in events.Tags()["scalars"]
    assert all(v == 0 for v in hook_counts(model).values()) and not callback.flow.active
    assert callback.alarms == [] and callback.failed is None


def test_bad_input_fails_at_train_begin(tmp_path) -> None:
    with pytest.raises(ValueError, match="every must be a positive int"):
        GradientFlowCallback(every=-1)
    with pytest.raises(TypeError, match="writer must be a SummaryWriter, a log directory or None, got int"):
        GradientFlowCallback(writer=3)
    frozen = tiny_bert()
    for p in frozen.parameters():
        p.requires_grad_(False)
    frozen.classifier.bias.requires_grad_(False)
    callback = GradientFlowCallback()
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    state = transformers.TrainerState()
    with pytest.raises(ValueError, match="has no parameters that require gradients"):
        callback.on_train_begin(args, state, transformers.TrainerControl(), model=frozen)
    assert all(v == 0 for v in hook_counts(frozen).values())


def test_importing_hookviz_imports_neither_training_library() -> None:
    code = (
        "import sys, hookviz, hookviz.integrations\n"
        "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
