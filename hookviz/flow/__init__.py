"""GradientFlow: per-layer gradient statistics during training, alarms for vanishing, exploding and NaN/Inf gradients.

Attach it to a model in training; at every step (or every ``every``-th) it records, per parameter and per module,
the gradient norm, mean and max |grad|, the update-to-weight ratio (opt-in: ``update_ratio=True`` with an optimizer),
and for activation modules the activation norm and, for ReLUs, the fraction of dead units (``output_stats="all"``: the
output norm and the norm of the gradient w.r.t. the output of every watched module). It is built to be left on:

- **No device sync per step.** Statistics are computed on the model's device and written into a preallocated
  ``(buffer_steps, statistics)`` buffer on that device; the buffer is read out in one transfer when it is full, and
  on `read`, `report`, the plots, the exports and `stop`. Alarms are checked at those read-outs, so they arrive up to
  ``buffer_steps`` recorded steps late, always naming the exact step (``buffer_steps=1`` checks every step, at the
  price of one sync per step).
- **Cost.** A recorded step reads each parameter gradient (on accelerators with three multi-tensor ``foreach``
  kernels; on the CPU once, with a kernel compiled by ``torch.compile`` that takes the norm, sum and max of |grad| in
  one pass: `fused_stats`) and each activation output once (with the fused kernels the activation outputs are kept
  until the step is taken and reduced by one compiled kernel too; an output modified in place after its module ran is
  caught by its version counter, loses that step's statistics and is reduced in the hook from then on); the update
  ratio reads the parameters three times (a snapshot before the step, the difference after it).
  benchmarks/bench_flow.py (resnet18 training step on 2 CPU cores, batch 16, 64x64; the paired overhead, median of 7
  processes): 3.6% and 4.0% at ``every=1`` in two runs; one process with every variant: 8% with the eager kernels,
  10% with ``output_stats="all"``, 13% with the update ratio, 1% at ``every=4``; ``detect_anomaly`` costs 25-28%
  there. ``every=N`` divides the cost by N.
- **Compiled kernels that check themselves.** ``torch.compile``'s code can be wrong for a CPU (code generated for
  another vector ISA, served by inductor's cache, gave about half the activation norm: the kernels now name their ISA in
  their compile options, kernels.py). So each compiled kernel (gradient statistics, activation statistics, parameter
  snapshot, update norms), on its first inputs of every set of shapes (each set is compiled anew), is also run eagerly
  and compared, to a tolerance derived from float32 rounding (kernels.py). If they differ, one warning names the kernel,
  the two values and the CPU capability, and the eager kernels compute the statistics of that step and of every
  GradientFlow after it in the process. The check costs one eager pass and one sync at a step that compiles anyway;
  later steps read no value back for it.
- **Hooks chosen on purpose.** Forward hooks on the parameter-free watched modules (activations, custom layers) and
  tensor hooks on the outputs of those whose backward could create a NaN (not the stock activations and pooling
  layers of `TRANSPARENT`); never full backward hooks (which break on in-place operations, pytorch#61519). For the
  first few recorded forward passes every watched module gets a forward hook, to learn which module's output feeds
  which (for naming NaN culprits); those hooks are then removed. The step is taken by ``step()`` after the backward
  pass, or automatically through the optimizer's step pre/post hooks when `optimizer` is given.

**NaN/Inf localisation.** Each recorded step keeps, on the host, the order in which the observed module outputs
were produced (forward) and in which the gradients w.r.t. them arrived (backward). A module with trainable
parameters is observed through them: every element of the gradient at its output feeds its parameters' gradients,
so those are non-finite exactly when that gradient is. A module of `TRANSPARENT` (ReLU, Tanh, pooling, dropout, ...)
cannot turn finite gradients into non-finite ones, so the localisation looks through it.
When a step has non-finite values the culprit is, in this order: the first module in forward order whose *output*
is non-finite (a forward NaN: ``log(0)``, ``0/0``, an overflow; with the default `output_stats` this is the first
*observed* output, and the message names the unobserved modules feeding it); else the first module in backward
order that turned finite gradients into non-finite ones (its output gradient is finite, but the gradient it passed
to its inputs, or to its own parameters, is not: e.g. the ``torch.where(x > 0, x, torch.sqrt(x))`` trap); else,
when the gradient was already non-finite where it reached the first module's output, the code after that module
(the loss). `torch.autograd.detect_anomaly` finds the backward culprit too, by checking the output of every backward
node (with a device sync per node on accelerators), and it raises instead of reporting.

**Gradient accumulation.** With `optimizer`, statistics are taken only when the optimizer steps: the parameter
gradients then hold the sum over the micro-steps, output statistics are aggregated over the micro-steps' forward and
backward passes (norms: root of the summed squares for gradients, mean for activations). Without it, call `step()`
once per optimizer step, after the last micro-step's backward.

**Mixed precision.** bf16 autocast needs nothing (no scaler; statistics accumulate in float32). With
``torch.amp.GradScaler``: pass ``scaler=``. Gradients w.r.t. module outputs are observed during the backward pass,
where they are scaled: they are divided by ``scaler.get_scale()`` (public API; one sync on recorded steps that observed
one). Parameter gradients are read as they are, never divided, in the documented order: after
``scaler.unscale_(optimizer)``. With `optimizer` this holds by itself (``scaler.step(optimizer)`` unscales before it
calls ``optimizer.step()``); so it does in the Lightning and Hugging Face callbacks (`hookviz.integrations`: their
pre-optimizer-step hooks run after the unscale); in manual mode call ``flow.step()`` after ``scaler.unscale_``
(before it, the parameter statistics would carry the scale, which the public API gives no way to detect). A scaler
without ``get_scale()`` gets a warning at construction. Caveat: a step the scaler skips (inf/NaN gradients) never
calls ``optimizer.step()``, so with `optimizer` that iteration is not a step: its output statistics merge into the
next step, and non-finite alarms come only from the parameter gradients of steps the optimizer takes (use manual mode
to see every iteration, with ``Alarms(nonfinite_steps=k)`` to ignore the few overflow steps a scaler takes to settle).

**Memory.** The on-device buffer holds ``buffer_steps`` rows of ``5 * parameters + 3 * module calls`` float32; the
host keeps ``4 * (5 * parameters + 3 * module calls)`` bytes per recorded step (`keep` bounds it). With the fused
kernels the activation outputs of a step are kept until it is taken. ``update_ratio=True`` (off by default) keeps one
full copy of the watched parameters on their device.

**Footguns.** Forward passes in eval mode or under ``torch.no_grad()`` are ignored (validation does not pollute the
statistics). The activation outputs kept for the compiled kernel live until the step is taken, a little longer than
autograd would keep them (with gradient accumulation, until the next micro-step's forward). With activation
checkpointing, the forward recomputed during the backward pass shows up as further calls of the checkpointed modules
(``"name#1"`` keys). A module's parameters are attributed to its first call key. Which module feeds which is learnt
from the first recorded forward passes: a model whose structure changes later gets less precise NaN culprits
(``output_stats="all"`` records the backward order at every step).

**DistributedDataParallel and FSDP** (`distributed`). Pass the wrapped model or the inner module (names differ by
the ``module.`` prefix). Parameter statistics are read after the backward pass, when ``.grad`` holds the all-reduced
(averaged) gradient: on every rank they are those of one process on the global batch, at no extra collective.
Statistics of module outputs and of the gradients w.r.t. them are local to each rank. FSDP (sharded parameters and
gradients) is refused with a ValueError: per-rank norms would cover only the local shard. (Tested on the CPU with
gloo: tests/test_ddp.py runs two ranks under ``torch.distributed.run`` and compares with one process on the global
batch.)

Example::

    flow = GradientFlow(model, optimizer=opt).start()
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()                       # the statistics of this step are taken here
    flow.stop()
    flow.report()                        # a table that renders in notebooks
    flow.plot_bars(); flow.plot_heatmap(); flow.plot_norms(["conv1", "fc"])

Layout of this package (one concern per file; every import points down this list)::

    monitor.py   GradientFlow: attach to the model and optimizer, take a step's statistics, read them out
    stats.py     FlowStats (the recorded statistics as arrays) and FlowReport (a per-module table at one step)
    plots.py     the bar chart, heatmap and norm curves behind FlowStats.plot_*
    export.py    CSV, JSON and TensorBoard
    alarms.py    Alarm, Alarms, the exceptions, and the checks run on every read-out
    locate.py    NaN/Inf localisation: the module that first produced non-finite values
    observe.py   what the hooks observe during one step (outputs, output gradients, their orders, the module graph)
    watch.py     what is watched and how (ACTIVATIONS, TRANSPARENT, parameter owners, which outputs get hooks)
    layout.py    the on-device buffer, its row layout, its read-out to host chunks
    kernels.py   the statistics kernels (multi-tensor, eager, compiled and self-checked) and the policy that picks them
    amp.py       the GradScaler's scale (public API), divided out of scaled output gradients
    distributed.py  DDP (what is reported) and FSDP (refused)
"""

from .alarms import Alarm, Alarms, GradientFlowError, GradientFlowWarning, OnAlarm  # noqa: F401
from .kernels import _COMPILED, FUSED_MIN_NUMEL, _grad_stats, _Scratch  # noqa: F401 (private ones: tests use them)
from .monitor import GradientFlow
from .stats import FlowReport, FlowStats
from .watch import ACTIVATIONS, TRANSPARENT

__all__ = [
    "ACTIVATIONS",
    "FUSED_MIN_NUMEL",
    "TRANSPARENT",
    "Alarm",
    "Alarms",
    "FlowReport",
    "FlowStats",
    "GradientFlow",
    "GradientFlowError",
    "GradientFlowWarning",
]
