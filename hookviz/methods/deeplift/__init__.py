r"""DeepLift and DeepLiftShap (Shrikumar et al., 2017, "Learning Important Features Through Propagating Activation
Differences", ICML, arXiv:1704.02685; Lundberg & Lee, 2017, "A Unified Approach to Interpreting Model
Predictions", NeurIPS), as a rule table on the rule engine `hookviz.methods.rules`.

The inputs and their baselines run in one batched forward pass (2N rows, `rows`); every intercepted operation
sees each activation beside its reference activation, and its backward pass uses a multiplier m with
``sum m * (t - t') = y - y'`` instead of the derivative. Multipliers compose by the chain rule, so the
attributions $$ (x - x') \odot m $$ sum to $$ y_c(x) - y_c(x') $$ wherever every nonlinear operation has a rule:

- ``rescale.py``: the rescale rule on every elementwise function of one input (activations as modules and as
  functional calls, ``exp``, ``rsqrt``, ``x ** 2``, ...);
- ``selection.py``: max pooling, exact for any kernel, stride, padding, dilation, ``ceil_mode`` and for adaptive
  pools (overlapping windows add their shares), and max / min reductions;
- ``products.py``: products and quotients of two activations (gates, gated MLPs, attention's products), the exact
  two-factor split;
- ``decomposed.py``: softmax, log-softmax, layer / group / RMS norm and ``F.scaled_dot_product_attention``, written
  out in the rules above;
- ``table.py``: the rule table, and which operations are reported as running without a rule;
- ``method.py``: `DeepLift`, `DeepLiftShap` and the summation-to-delta check.

A module called several times gets one rule per call; in-place calls run out of place during the call.
"""

from .method import DeepLift, DeepLiftShap
from .table import rule_table

__all__ = ["DeepLift", "DeepLiftShap", "rule_table"]
