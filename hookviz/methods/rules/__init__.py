"""One engine for every modified backward pass: a table from operations to rules, active only during the method's
own forward pass, with one coverage report and one warning for operations no rule covers.

Every modified backward pass is the same act: intercept an operation during the method's own forward pass and give
its backward a rule. The pieces:

- `RuleTable` (``table.py``): operations -> `Rule`. Operations are module types (or instances, or predicates over
  ``(name, module)``) and functional callables, each spelling its own entry (``F.relu``, ``torch.relu_``,
  ``Tensor.relu``: `ops.spellings` lists them, in-place variants and Tensor methods included). A rule None watches
  an operation without rewriting it (it is reported as not covered).
- `Rule`: a name, ``apply(call) -> output`` (typically through a custom `torch.autograd.Function` whose backward is
  the rule, or a tensor hook on the output), and ``needs_input`` (in-place calls then run out of place, their result
  written back; in-place modules are switched out of place for the call).
- `Call` (``call.py``): what a rule receives: the module or function, its name, arguments, output, the method's
  `HookManager`, whether the engine split an in-place call, which call of that operation it is.
- `RuleEngine` (``engine.py``): module hooks through the method's `HookManager` and a `TorchFunctionMode` during
  the forward pass only, scoped to the method's own call and thread (`scope.acting`), with depth tracking so that a
  functional call inside a hooked module is not seen twice; everything undone in ``finally``.
- `Coverage` (``coverage.py``): which operations each rule rewrote, how often, by kind; which ran with no rule; one
  warning that names the method.

The methods on it: Guided Backprop and Deconvnet (``guided.py``: one ReLU rule, other activations watched or, with
``activations="all"``, covered by the same rule under another name), DeepLift (``deeplift.py``: the rescale rule on
nonlinearities, captum's max-pool rule).

How LRP (``methods/lrp/``, still on its own interception today) maps onto it, without changing the engine:

- per-module rules resolved by a composite: the composite becomes the table's module entries, name maps first (a
  module instance as key: `RuleTable.modules` takes instances, the first matching entry wins), then the type map.
  The first-layer map is a rule object built per call that remembers whether a linear layer has run and applies the
  first-layer rule to the first one (rules are built per call, so they may keep state for one forward pass);
- BatchNorm folded into the preceding layer seen at run time: the linear layers' rule records, per call, its output
  tensor and its `Call`; the BatchNorm rule looks its input up there and returns the output of the folded layer's
  rule (``call.output`` replaced, as any rule does). The record is dropped when the forward pass ends (the method
  wraps `RuleEngine.forward_pass` in its own ``try/finally``);
- branch additions ``a + b`` / ``a += b`` / ``torch.add`` / ``a.add_(b)``: function entries for ``Tensor.add``,
  ``torch.add``, ``Tensor.__radd__`` and ``Tensor.add_`` with a two-input rule (``call.args`` holds both branches;
  the rule returns None for an addition that is not of two branches needing a gradient, which keeps the plain
  output). ``needs_input=True`` makes the engine run ``a += b`` as ``a + b`` and copy the result back into ``a``;
- functional activations and pooling: function entries (``call.function()`` re-evaluates the pooling in the
  backward pass for the Norm rule);
- the operations LRP reports as uncovered (every call on a tensor that needs a gradient, except reshaping and
  routing): the table's ``uncovered`` predicate, and the one warning names "LRP";
- an audit entry per rule call: the rule creates it when applied (``call.name`` and ``call.count`` give its key,
  ``layer#2`` for a second call) and fills it in its backward.
"""

from .call import Call
from .coverage import Coverage, first_few
from .engine import RuleEngine
from .ops import function_name, out_of_place, spellings
from .table import Rule, RuleTable

__all__ = [
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
