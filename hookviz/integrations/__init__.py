"""hookviz inside training loops: callbacks for PyTorch Lightning and the Hugging Face ``Trainer``.

- `hookviz.integrations.lightning.GradientFlowCallback`: `GradientFlow` in a Lightning ``Trainer`` (statistics read
  in ``on_before_optimizer_step``: gradients accumulated and unscaled, not yet clipped), logged to the Trainer's
  loggers (TensorBoard, CSV, ...).
- `hookviz.integrations.transformers.GradientFlowCallback`: the same for the Hugging Face ``Trainer``
  (``on_pre_optimizer_step``: after the Trainer's gradient clipping), logged to TensorBoard.

Optional imports: ``import hookviz`` (and this package) imports neither ``lightning`` nor ``transformers``; each
submodule imports its library when it is itself imported. Layout::

    session.py       the GradientFlow life cycle both callbacks share: attach, take a step, log, alarms, failures
    lightning.py     the Lightning callback
    transformers.py  the Hugging Face callback
"""
