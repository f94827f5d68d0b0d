"""One engine for every modified backward pass: a table from operations to rules, active only during the method's
own forward pass, with one coverage report and one warning for operations no rule covers.

Every modified backward pass is the same act: intercept an operation during the method's own forward pass and give
its backward a rule. The pieces:

- `RuleTable` (``table.py``): operations -> `Rule`. Operations are module types (or instances, or predicates over
  ``(name, module)``) and functional callables, each spelling its own entry (``F.relu``, ``torch.relu_``,
  ``Tensor.relu``: `ops.spellings` lists them, in-place variants and Tensor methods included). A rule None watches
  an operation without rewriting it (it is reported as not covered).
- `Rule`: a name, ``apply(call) -> output`` (typically through a custom `torch.autograd.Function` whose backward is
  the rule, or a tensor hook on the output), ``needs_input`` (in-place calls then run out of place, their result
  written back; in-place modules are switched out of place for the call) and ``owns_call`` (the rule takes the whole
  call: every module call, also without a gradient; functional calls before the operation runs, the rule computing
  it; `NotImplemented` leaves a call to the engine as an uncovered one) and, for module rules, ``enter`` (called
  when the module's call starts; the functional calls inside it then reach the table instead of passing untouched:
  LRP's gradient form holds a normalisation's std constant inside the module's own computation).
- `Call` (``call.py``): what a rule receives: the module or function, its name, arguments, output, the method's
  `HookManager`, whether the engine split an in-place call, which call of that operation it is.
- `RuleEngine` (``engine.py``): module hooks through the method's `HookManager` and a `TorchFunctionMode` during
  the forward pass only, scoped to the method's own call and thread (`scope.acting`), with depth tracking so that a
  functional call inside a hooked module is not seen twice; everything undone in ``finally``.
- `Coverage` (``coverage.py``): which operations each rule rewrote, how often, by kind; which ran with no rule; one
  warning that names the method.

The methods on it: Guided Backprop and Deconvnet (``guided.py``: one ReLU rule, other activations watched or, with
``activations="all"``, covered by the same rule under another name), DeepLift (``deeplift.py``: the rescale rule on
nonlinearities, captum's max-pool rule), LRP with its composites (``lrp/``, below).

LRP (``methods/lrp/gradient_form.py``: ``GradientFormRun.table``, the layer rules from ``layers.py``) is a table
built per call from the composite:

- per-module rules resolved by a composite: one owning rule (``owns_call``) on the layers the composite handles,
  which resolves the LRP rule at each call (name map, then the first-layer map for the first convolution or linear
  layer to run, then the type map: it must see every call, also one without a gradient, for "first"); activation
  modules under an entry with ``needs_input`` (run out of place);
- BatchNorm folded into the preceding layer seen at run time: the linear layers' rule records, per call, its output
  tensor; the BatchNorm rule looks its input up there and returns the output of the folded layer's rule. The record
  is dropped when the forward pass ends (``GradientFormRun.forward_pass`` wraps `RuleEngine.forward_pass` in
  ``try/finally``);
- branch additions ``a + b`` / ``a += b`` / ``torch.add`` / ``a.add_(b)``, functional activations, pooling and
  scaling by a constant: function entries whose owning rules compute the operation themselves (an addition that is
  not of two branches needing a gradient runs as called);
- the transformer composites' rules (products, softmax, normalisations, fused attention decomposed): more function
  entries, before the others (the first entry naming a callable wins; a rule falls back to the generic one or
  returns `NotImplemented`);
- the operations LRP reports as uncovered (every call on a tensor that needs a gradient, except reshaping and
  routing): the table's ``uncovered`` predicate, and the one warning names "LRP";
- an audit entry per rule call: the rule creates it when applied and fills it in its backward.
"""

from .call import Call
from .coverage import Coverage, first_few
from .engine import RuleEngine
from .ops import MATMUL_FUNCTIONS, MAX_POOL_MODULES, function_name, out_of_place, spellings
from .table import Rule, RuleTable

__all__ = [
    "MATMUL_FUNCTIONS",
    "MAX_POOL_MODULES",
    "Call",
    "Coverage",
    "Rule",
    "RuleEngine",
    "RuleTable",
    "first_few",
    "function_name",
    "out_of_place",
    "spellings",
]
