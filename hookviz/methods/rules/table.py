"""`Rule` and `RuleTable`: which operations a method rewrites, and how.

A rule is data: a name (for the coverage report), a function that receives one intercepted `Call` during the
forward pass and returns the output to use, and whether it needs the call's input intact. A table maps operations
to rules: module types (or instances, or predicates over ``(name, module)``) and functional callables. An entry with
the rule None marks an operation the method watches but leaves alone: it is counted as not covered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from torch import nn

from .ops import function_name

if TYPE_CHECKING:
    from .call import Call

ModuleKey: TypeAlias = "type[nn.Module] | tuple[type[nn.Module], ...] | nn.Module | Callable[[str, nn.Module], bool]"
# (function, args, kwargs) -> the name to report the call under as not covered, or None to let it pass unreported
UncoveredPredicate: TypeAlias = Callable[[Callable[..., Any], tuple, dict], "str | None"]


@dataclass(frozen=True)
class Rule:
    """One rule: `apply` receives the intercepted call during the forward pass and returns the output to use in its
    place (None: keep the output as computed). Typically the returned tensor comes from a custom
    `torch.autograd.Function` whose backward *is* the rule, or carries a tensor hook placed with ``call.hooks``.

    Attributes:
        name: the rule's name in the coverage report (``"ReLU"``, ``"rescale"``, ``"epsilon"``).
        apply: ``(call) -> Tensor | None``; `NotImplemented` where the rule cannot take this call (an elementwise
            rule on a call with a second input that needs a gradient): the call keeps its output and is reported as
            not covered.
        needs_input: the rule reads the call's input after the operation ran: modules that work in place
            (``inplace=True``) run out of place while the engine's hooks live, and in-place functional calls
            (``torch.relu_``, ``F.relu(x, inplace=True)``, ``a += b``) run their out-of-place variant, the rule's
            result written back into the input afterwards.
        owns_call: the rule takes the whole call, for rules that keep state over the pass or compute the operation
            in another form (LRP): module calls reach it also when no input needs a gradient or the output is not a
            tensor (it returns None to keep the output), so that it sees every call; functional calls that an input
            needing a gradient reaches come to it before the operation runs (``call.output`` is None): it runs the
            operation itself, in-place variants included, and returns the output, or `NotImplemented` to leave the
            call to the engine as if no entry named it (run as called, or ``call.output`` if the rule set it, and
            reported through the table's ``uncovered`` predicate). `needs_input` has no effect on functional calls.
        enter: module rules only: ``(module) -> None``, called when a call of the module starts; the functional
            calls inside it are then intercepted as usual instead of passing untouched (the rule's table entries
            for functions can act on them: LRP holds a normalisation's std constant inside the module's own
            computation). `apply` still receives the call when it ends.
        inside: module rules with `enter` only: ``(func) -> bool``, the functional callables whose entries act on
            the calls made while the module runs; the others run as called, unreported, as inside any watched
            module (the module's rule covers it whole: LRP's normalisation rule lets only the std's calls be held,
            not a sum or a mean of the module's own computation take a rule of its own). None: every entry acts.
    """

    name: str
    apply: Callable[[Call], Any]
    needs_input: bool = False
    owns_call: bool = False
    enter: Callable[[nn.Module], None] | None = None
    inside: Callable[[Callable[..., Any]], bool] | None = None


class RuleTable:
    """Operations -> rules. Build it with `modules` and `functions` (chainable); the first entry that matches an
    operation decides its rule, for modules and functions alike.

    Args:
        warn: warn once after the forward pass when operations the table watches ran without a rule (the method's
            name in the message); False where leaving them alone is the method's documented choice (the coverage
            report still lists them).
        uncovered: for functional calls the table has no entry for: ``(func, args, kwargs) -> name | None``, the
            name under which the call counts as not covered (None: it passes unreported). LRP reports every
            operation on a tensor that needs a gradient except reshaping and routing; the ReLU rules report nothing.
        passes: for functional calls the table has no entry for: ``(func) -> bool``, true where `uncovered` would let
            every call of `func` pass unreported whatever its arguments (reshapes, routing): such calls run as
            called after one look-up, without the engine's call path (a LLaMA's forward makes about 450 calls, most
            of them reshapes). Asked once per callable and cached (`passing`); it must depend on `func` alone.

    Example::

        table = RuleTable().modules(nn.ReLU, rule).functions(spellings("relu"), rule).modules(nn.GELU, None)
    """

    def __init__(
        self,
        *,
        warn: bool = True,
        uncovered: UncoveredPredicate | None = None,
        passes: Callable[[Callable[..., Any]], bool] | None = None,
    ) -> None:
        if not isinstance(warn, bool):
            raise TypeError(f"warn must be True or False, got {type(warn).__name__} {warn!r}")
        if uncovered is not None and not callable(uncovered):
            raise TypeError(f"uncovered must be a callable (func, args, kwargs) -> name or None, got {uncovered!r}")
        if passes is not None and not callable(passes):
            raise TypeError(f"passes must be a callable (func) -> bool, got {passes!r}")
        self.warn = warn
        self.uncovered = uncovered
        self.passes = passes
        self._passing: dict[Callable[..., Any], bool] = {}
        self._modules: list[tuple[ModuleKey, Rule | None]] = []
        self._functions: dict[Callable[..., Any], tuple[str, Rule | None]] = {}
        # module type -> its entry, where every module key is a class or a tuple of classes (the answer depends on
        # the type alone); None where an instance or a predicate key makes it depend on the module and its name
        self._by_type: dict[type, tuple[bool, Rule | None]] | None = {}

    def modules(self, key: ModuleKey, rule: Rule | None) -> RuleTable:
        """Map modules to `rule`: a module class or tuple of classes (subclasses match), one module instance, or a
        predicate ``(name, module) -> bool``. Every call of a matching module is intercepted, however often it runs."""
        if not (
            isinstance(key, nn.Module)
            or (isinstance(key, type) and issubclass(key, nn.Module))
            or (isinstance(key, tuple) and key and all(isinstance(t, type) and issubclass(t, nn.Module) for t in key))
            or (callable(key) and not isinstance(key, type))
        ):
            raise TypeError(
                f"module key must be an nn.Module class or tuple of classes, a module instance or a predicate "
                f"(name, module) -> bool; got {key!r}"
            )
        _check_rule(rule)
        self._modules.append((key, rule))
        self._by_type = {} if self._by_type is not None and isinstance(key, type | tuple) else None
        return self

    def functions(
        self, funcs: Mapping[Callable[..., Any], str] | Iterable[Callable[..., Any]], rule: Rule | None
    ) -> RuleTable:
        """Map functional callables to `rule`: a mapping ``{callable: report name}`` (e.g. `ops.spellings`) or an
        iterable of callables (named by `ops.function_name`). In-place variants and Tensor methods are separate
        callables: list each spelling the table should see (`ops.spellings` lists them all)."""
        _check_rule(rule)
        items = funcs.items() if isinstance(funcs, Mapping) else ((f, function_name(f)) for f in funcs)
        for func, name in items:
            if not callable(func):
                raise TypeError(f"functions: {func!r} is not callable")
            self._functions.setdefault(func, (name, rule))
        return self

    # -- look-ups (the engine's) -----------------------------------------------------------------------------------
    def module_entry(self, name: str, module: nn.Module) -> tuple[bool, Rule | None]:
        """(whether the table names this module, its rule or None)."""
        by_type = self._by_type
        if by_type is not None:
            entry = by_type.get(type(module))
            if entry is None:
                entry = by_type[type(module)] = self._module_entry(name, module)
            return entry
        return self._module_entry(name, module)

    def _module_entry(self, name: str, module: nn.Module) -> tuple[bool, Rule | None]:
        for key, rule in self._modules:
            if isinstance(key, nn.Module):
                hit = key is module
            elif isinstance(key, type | tuple):
                hit = isinstance(module, key)
            else:
                hit = bool(key(name, module))
            if hit:
                return True, rule
        return False, None

    def function_entry(self, func: Callable[..., Any]) -> tuple[str, Rule | None] | None:
        """(report name, rule or None) of a functional callable; None if the table does not name it."""
        return self._functions.get(func)

    def passing(self, func: Callable[..., Any]) -> bool:
        """Whether an unnamed callable's calls run as called, unreported (`passes`, cached per callable; False
        without it)."""
        known = self._passing.get(func)
        if known is None:
            known = self._passing[func] = self.passes is not None and bool(self.passes(func))
        return known

    def function_keys(self) -> frozenset[Callable[..., Any]]:
        """Every functional callable the table names (the engine's first look-up per call)."""
        return frozenset(self._functions)

    def __repr__(self) -> str:
        rules = sorted({r.name for _, r in self._modules if r} | {r.name for _, r in self._functions.values() if r})
        return f"RuleTable({len(self._modules)} module entries, {len(self._functions)} functions, rules={rules})"


def _check_rule(rule: object) -> None:
    if rule is not None and not isinstance(rule, Rule):
        raise TypeError(f"rule must be a Rule or None (watched, left alone), got {type(rule).__name__}")
