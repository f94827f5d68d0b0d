"""`Coverage`: what the rules of one forward pass did, and the one warning about operations no rule covered."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Coverage:
    """The rule coverage of one forward pass of a method.

    Attributes:
        method: the method's name (``"GuidedBackprop"``); model: the model's class name.
        covered: rule name -> {operation -> calls the rule rewrote}; an operation is a module's dotted name or a
            functional callable's report name (``"F.relu"``).
        by_kind: rule name -> {``"module"``: calls, ``"functional"``: calls} of `covered`.
        declined: rule name -> {operation -> calls the rule did not rewrite}: no tensor input needed a gradient, or
            the output was not a tensor.
        uncovered: operation -> calls that ran with no rule (operations the table watches, or that its
            ``uncovered`` predicate names): their backward pass is the plain gradient.
        left_alone: operation -> calls not rewritten, declined and uncovered together, in the order they first ran.
        module_calls: module name -> calls, for every module the engine hooked (a module run twice counts 2).
        kind_of: operation -> ``"module"`` or ``"functional"``, for every operation named above.
    """

    method: str = ""
    model: str = ""
    covered: dict[str, dict[str, int]] = field(default_factory=dict)
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    declined: dict[str, dict[str, int]] = field(default_factory=dict)
    uncovered: dict[str, int] = field(default_factory=dict)
    left_alone: dict[str, int] = field(default_factory=dict)
    module_calls: dict[str, int] = field(default_factory=dict)
    kind_of: dict[str, str] = field(default_factory=dict)

    def calls(self, rule: str) -> int:
        """Calls of the operations `rule` covers, rewritten or declined."""
        return sum(self.covered.get(rule, {}).values()) + sum(self.declined.get(rule, {}).values())

    def rewritten(self, rule: str | None = None) -> int:
        """Calls rewritten by `rule` (by any rule with None)."""
        rules = self.covered.values() if rule is None else [self.covered.get(rule, {})]
        return sum(sum(ops.values()) for ops in rules)

    def __str__(self) -> str:
        parts = []
        for rule, ops in self.covered.items():
            kinds = self.by_kind[rule]
            parts.append(
                f"{rule}: {sum(ops.values())} calls rewritten ({kinds['module']} module, {kinds['functional']} "
                f"functional)"
            )
        if not parts:
            parts.append("no call rewritten")
        if self.uncovered:
            parts.append(f"not covered: {first_few(self.uncovered)}")
        declined = Counter[str]()
        for ops in self.declined.values():
            declined.update(ops)
        if declined:
            parts.append(f"declined (no gradient): {first_few(dict(declined))}")
        return f"{self.method} on {self.model}: " + "; ".join(parts)

    def warning(self) -> str:
        """The one warning about `uncovered`, naming the method."""
        return (
            f"{self.method}: operations that no rule covers ran in the forward pass of {self.model}: "
            f"{first_few(self.uncovered, 8)}; their backward pass is the plain gradient (see .rule_coverage)"
        )


def first_few(calls: dict[str, int], shown: int = 3) -> str:
    """``"a x2, b x1, and 4 more"``: the first `shown` entries (all of them when only one more would follow)."""
    items = [f"{name} x{count}" for name, count in calls.items()]
    more = f", and {len(items) - shown} more" if len(items) > shown + 1 else ""
    return ", ".join(items if not more else items[:shown]) + more


class Recorder:
    """Counts the calls of one forward pass as they happen; `report` turns them into a `Coverage`."""

    def __init__(self) -> None:
        self.covered: dict[str, Counter[str]] = {}
        self.by_kind: dict[str, Counter[str]] = {}
        self.declined: dict[str, Counter[str]] = {}
        self.uncovered: Counter[str] = Counter()
        self.left_alone: Counter[str] = Counter()
        self.module_calls: Counter[str] = Counter()
        self.kind_of: dict[str, str] = {}

    def rewritten(self, rule: str, kind: str, op: str) -> None:
        self.kind_of[op] = kind
        ops = self.covered.get(rule)
        if ops is None:  # (not setdefault: that built two Counters per rewritten call)
            ops = self.covered[rule] = Counter()
            self.by_kind[rule] = Counter({"module": 0, "functional": 0})
        ops[op] += 1
        self.by_kind[rule][kind] += 1

    def declined_by(self, rule: str, kind: str, op: str) -> None:
        self.kind_of[op] = kind
        self.declined.setdefault(rule, Counter())[op] += 1
        self.left_alone[op] += 1

    def not_covered(self, kind: str, op: str) -> None:
        self.kind_of[op] = kind
        self.uncovered[op] += 1
        self.left_alone[op] += 1

    def report(self, method: str, model: str) -> Coverage:
        return Coverage(
            method=method,
            model=model,
            covered={r: dict(ops) for r, ops in self.covered.items()},
            by_kind={r: {"module": k["module"], "functional": k["functional"]} for r, k in self.by_kind.items()},
            declined={r: dict(ops) for r, ops in self.declined.items()},
            uncovered=dict(self.uncovered),
            left_alone=dict(self.left_alone),
            module_calls=dict(self.module_calls),
            kind_of=dict(self.kind_of),
        )
