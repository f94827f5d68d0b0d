"""TCAV: Testing with Concept Activation Vectors (Kim et al., 2018).

Kim, Wattenberg, Gilmer, Cai, Wexler, Viegas, Sayres, "Interpretability Beyond Feature Attribution: Quantitative
Testing with Concept Activation Vectors (TCAV)", ICML 2018, https://arxiv.org/abs/1711.11279.

For a class k, a concept C and a layer l with activations a_l(x) (pooled to (D,), see ``pool``):

- the CAV v_C^l is the unit normal of a linear classifier separating C's activations from a random set's
  (`hookviz.concepts.cav`);
- the directional derivative of input x is S(x) = grad_{a_l} h_k(x) . v_C^l, h_k the class logit (section 3.2): how
  the logit changes when the layer's activation moves along the concept;
- the sign count (the paper's TCAV_Q) is the fraction of class-k inputs with S(x) > 0;
- the magnitude score (the paper's magnitude variant, section 3.2; the formula of captum's TCAV docstring) is
  sum_x max(S(x), 0) / sum_x |S(x)|: like the sign count in [0, 1], with 0.5 for no preference, but weighting
  each input by how strongly it moves.

Significance (section 3.3): the scores of CAVs against `n_random` random sets are compared with those of CAVs
trained between one random set and each of the others (the null: "random concept" vs random), by a two-sided
t-test, with a multiple-testing correction over everything asked (`hookviz.concepts.stats`). A significant score
above 0.5 says the class's logit increases along the concept; below 0.5, that it decreases.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import torch
from torch import Tensor, nn

from .._checks import bool_option, int_option, number_option
from .._modes import training_restored
from ..classes import class_names
from ..hooks import HookError, HookManager, Selection, Selector, select_modules
from ..methods.scope import active_call, model_lock
from ..targets import check_target, class_logits
from .cav import CAV_KINDS, CAVKind, train_cavs
from .examples import Examples, load_examples
from .result import SCORES, ScoreStats, TCAVResult, TCAVRow
from .stats import CORRECTIONS, TESTS, Correction, TestKind, correct, ttest_ind

__all__ = ["POOLS", "TCAV", "Pool", "tcav_scores"]

Pool: TypeAlias = Literal["flatten", "mean", "cls"]
POOLS: tuple[str, ...] = ("flatten", "mean", "cls")
Null: TypeAlias = Literal["independent", "fixed"]
NULLS: tuple[str, ...] = ("independent", "fixed")
_RANDOM = "\0random"  # the random pool's key in the activation cache: no concept can be named so
_TINY = 1e-30


def _fingerprint(examples: Any) -> Any:
    """What identifies a set of examples for the cache: a tensor by its memory, shape, strides and version counter
    (``data[:10]`` twice is two objects but one set; an in-place change bumps the version); anything else by
    identity (a folder's path string, a list or a data set: pass the same object, or call `TCAV.clear_cache`)."""
    if isinstance(examples, Tensor):
        return ("tensor", examples.data_ptr(), tuple(examples.shape), examples.stride(), examples.dtype,
                examples.device, examples._version)  # fmt: skip
    return ("object", id(examples))


@dataclass
class _Cached:
    """A set's activations at every layer, valid while the caller's examples are the ones they came from."""

    source: Any  # held, so that neither its id nor its memory can be reused by another object while cached
    acts: dict[str, Tensor]
    token: object = field(default_factory=object)  # CAVs trained on these activations are cached under it
    # taken when cached: a view of the same tensor shares its version counter, so it cannot be read again later
    fingerprint: Any = None

    def __post_init__(self) -> None:
        self.fingerprint = _fingerprint(self.source)

    def holds(self, examples: Any) -> bool:
        return self.fingerprint == _fingerprint(examples)


def _pool(t: Tensor, pool: str, name: str) -> Tensor:
    """(N, ...) layer output -> (N, D) vectors the CAV lives among."""
    if pool == "cls":
        if t.dim() != 3:
            raise ValueError(
                f"pool='cls' takes the class token of (N, T, D) token outputs, but layer {name!r} outputs shape "
                f"{tuple(t.shape)}; use pool='flatten' or 'mean' for this layer"
            )
        return t[:, 0]
    if pool == "mean" and t.dim() == 3:
        return t.mean(1)
    if pool == "mean" and t.dim() > 3:
        return t.flatten(2).mean(2)  # (N, C, h, w): over space, one value per channel
    return t.flatten(1)


def _pool_grad(g: Tensor, pool: str) -> Tensor:
    """The gradient of the logit w.r.t. the pooled vector's direction: moving the pooled vector along v means adding
    v to the class token (cls), to every token or position (mean: d/de h(a + e v) = sum over positions), or to the
    flattened activation itself."""
    if pool == "cls":
        return g[:, 0]
    if pool == "mean" and g.dim() == 3:
        return g.sum(1)
    if pool == "mean" and g.dim() > 3:
        return g.flatten(2).sum(2)
    return g.flatten(1)


def tcav_scores(grads: Tensor, cavs: Tensor, targets: Tensor, classes: Tensor) -> tuple[Tensor, Tensor]:
    """The sign count and the magnitude score of each class for each CAV, each (K, P).

    grads: (N, D) each input's gradient of its target logit w.r.t. the (pooled) layer activation; cavs: (P, D);
    targets: (N,) each input's class; classes: (K,) the classes to score (each must occur in `targets`). With
    S = grads @ cavs.T the directional derivatives (N, P): sign count = mean over the class's inputs of [S > 0]
    (strictly: a zero derivative does not count, as in the paper and captum), magnitude = sum max(S, 0) / sum |S|
    (0 where every S is 0). Batched: two matrix products, no loop over inputs, classes or CAVs.
    """
    s = grads @ cavs.T
    onehot = (targets[None, :] == classes[:, None].to(targets.device)).to(s.dtype)  # (K, N)
    sign = (onehot @ (s > 0).to(s.dtype)) / onehot.sum(1, keepdim=True)
    magnitude = (onehot @ s.clamp_min(0)) / (onehot @ s.abs()).clamp_min(_TINY)
    return sign, magnitude


class TCAV:
    """TCAV scores with a significance test, for a classifier and a few layers (Kim et al., ICML 2018).

    Args:
        model: a classifier whose output is (N, classes) logits (or holds them, see `hookviz.targets`).
        layers: the layers whose activations the CAVs live in: a selector (dotted name, glob such as
            ``"blocks.*.norm1"``, module class, module instance, predicate, as `HookManager` takes them), or a list of
            selectors; every module they match is one layer. Each must output one floating-point tensor and run once
            per forward pass.
        cav: ``"logistic"`` (L2-regularised logistic regression, the paper's linear classifier) or ``"mean"``
            (difference of means, faster); see `hookviz.concepts.cav`.
        pool: how a layer's output becomes one vector per example: ``"flatten"`` (the paper: (N, C, H, W) ->
            (N, C*H*W), tokens (N, T, D) -> (N, T*D)), ``"mean"`` (over space or tokens: (N, C) / (N, D)),
            ``"cls"`` (the class token, first of (N, T, D)). 2-D outputs are used as they are.
        l2: the logistic regression's regularisation weight (see `hookviz.concepts.cav.train_cavs`).
        steps: at most this many Newton steps per logistic CAV.
        batch_size: examples per forward pass.
        preprocess: for image files and folders: ``"auto"`` (the model's own preprocessing, as everywhere in
            hookviz), a preset name, a `hookviz.Preset`, a callable or None.
        eval_mode: run the model in eval mode (its flags restored after each call).

    Activations are cached per concept and layer, keyed by the concept's name and its examples (a tensor by its memory
    and version, so a slice taken again or changed in place is recognised; anything else by identity: pass the same
    object again, or call `clear_cache` after changing its files), CAVs per concept, random set and layer, so further
    calls with new classes or inputs compute neither again. A call that raises (or is interrupted) leaves both caches
    as they were before it.

    Example::

        tcav = hv.TCAV(model, ["features.4", "conv3"])
        result = tcav.interpret(images, target=5, concepts={"round": round_imgs, "edges": "concepts/edges/"},
                                random="concepts/random/", n_random=20)
        print(result.table())
        result.figure().savefig("tcav.png")
    """

    def __init__(
        self,
        model: nn.Module,
        layers: Selector | Sequence[Selector],
        *,
        cav: CAVKind = "logistic",
        pool: Pool = "flatten",
        l2: float = 0.01,
        steps: int = 25,
        batch_size: int = 64,
        preprocess: Any = "auto",
        eval_mode: bool = True,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if cav not in CAV_KINDS:
            raise ValueError(f"cav must be one of {', '.join(repr(k) for k in CAV_KINDS)}, got {cav!r}")
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {', '.join(repr(p) for p in POOLS)}, got {pool!r}")
        number_option("l2", l2, "a number > 0 (the CAV's L2 regularisation)", lambda v: v > 0, error=ValueError)
        int_option("steps", steps, "an int >= 1 (Newton steps per CAV)")
        int_option("batch_size", batch_size, "an int >= 1 (examples per forward pass)")
        bool_option("eval_mode", eval_mode)
        self.model = model
        self.layers = self._resolve_layers(model, layers)
        self.cav, self.pool, self.l2, self.steps = cav, pool, float(l2), steps
        self.batch_size, self.preprocess, self.eval_mode = batch_size, preprocess, eval_mode
        self._acts: dict[str, _Cached] = {}
        self._cavs: dict[tuple[Any, ...], Tensor] = {}

    @staticmethod
    def _resolve_layers(model: nn.Module, layers: Any) -> dict[str, nn.Module]:
        selectors = list(layers) if isinstance(layers, list) else [layers]
        if not selectors:
            raise ValueError("layers must name at least one module, got an empty list")
        found: dict[str, nn.Module] = {}
        for i, selector in enumerate(selectors):
            where = "layers" if len(selectors) == 1 and not isinstance(layers, list) else f"layers[{i}]"
            try:
                for name, module in select_modules(model, selector):
                    found.setdefault(name, module)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{where}: {exc}") from None
        return found

    def __repr__(self) -> str:
        return (
            f"TCAV({type(self.model).__name__}, layers={list(self.layers)}, cav={self.cav!r}, pool={self.pool!r}, "
            f"cached sets={len(self._acts)}, cached CAVs={len(self._cavs)})"
        )

    def clear_cache(self) -> None:
        """Forget every cached activation and CAV."""
        self._acts.clear()
        self._cavs.clear()

    @contextmanager
    def _cache_kept_on_failure(self) -> Iterator[None]:
        """The caches as they were before the call when it ends in an exception or Ctrl-C: no set's activations or
        CAVs from a call that did not finish (a later call computes them again); the entries themselves are never
        changed in place, so copies of the two dicts restore them."""
        acts, cavs = dict(self._acts), dict(self._cavs)
        try:
            yield
        except BaseException:
            self._acts.clear()
            self._acts.update(acts)
            self._cavs.clear()
            self._cavs.update(cavs)
            raise

    # -- the model, prepared and restored -----------------------------------------------------------------------
    @contextmanager
    def _prepared(self) -> Iterator[HookManager]:
        if torch.is_inference_mode_enabled():
            raise RuntimeError(
                "TCAV needs autograd, which torch.inference_mode() switches off; call it outside inference_mode "
                "(torch.no_grad() is fine)"
            )
        model = self.model
        with model_lock(model), training_restored(model) as modes:
            # train-mode forwards (eval_mode=False) move BatchNorm's running statistics: a copy is put back
            training = not self.eval_mode and any(flag for _, flag in modes)
            buffers = [(b, b.detach().clone()) for b in model.buffers()] if training else []
            try:
                if self.eval_mode:
                    model.eval()
                # parameters keep their requires_grad: the gradients are taken with torch.autograd.grad w.r.t. the
                # layer outputs only, so no weight gradient is computed and no .grad changes
                with active_call(), HookManager(model) as hooks:
                    yield hooks
            finally:
                with torch.no_grad():
                    for b, saved in buffers:
                        b.copy_(saved)

    def _record(self, taken: dict[str, Tensor], grad: bool, sink: Any = None) -> Any:
        def hook(name: str, module: nn.Module, args: Any, out: Any) -> Tensor:
            if not isinstance(out, Tensor) or not out.is_floating_point():
                what = f"a {out.dtype} tensor" if isinstance(out, Tensor) else type(out).__name__
                raise HookError(
                    f"layer {name!r} outputs {what}; TCAV needs a layer whose output is one floating-point tensor "
                    "(choose another layer)"
                )
            if name in taken:
                raise HookError(
                    f"layer {name!r} ran more than once in one forward pass; TCAV needs a module that runs once "
                    "(choose another layer)"
                )
            if not grad:
                # copied out now (pooled, into the call's buffer): an in-place operation after the layer (a
                # ReLU(inplace=True) after a BatchNorm) would otherwise change what was recorded before it is read
                taken[name] = out
                sink(name, out.detach())
                return out
            # a leaf where no earlier layer's graph reaches (frozen model, input without grad); the model goes on
            # with a copy, so that in-place operations after the layer cannot change what was recorded
            rec = out if out.requires_grad else out.detach().requires_grad_(True)
            taken[name] = rec
            return rec.clone()

        return hook

    def _forward(
        self, hooks: HookManager, x: Tensor, where: str, grad: bool, sink: Any = None
    ) -> tuple[Any, dict[str, Tensor]]:
        taken: dict[str, Tensor] = {}
        handles = hooks.forward(Selection(self.layers.items()), self._record(taken, grad, sink), with_name=True)
        try:
            out = self.model(x)
        except HookError:
            raise
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise ValueError(
                f"{where}: the model refused these examples of shape {tuple(x.shape)} ({type(exc).__name__}: {exc}); "
                "give examples shaped like the model's inputs"
            ) from exc
        finally:
            for h in handles:
                h.remove()
        missing = [n for n in self.layers if n not in taken]
        if missing:
            raise ValueError(
                f"layers {missing} did not run in the forward pass of {where}; TCAV needs layers the model runs"
            )
        return out, taken

    # -- activations ----------------------------------------------------------------------------------------------
    def _activations(self, hooks: HookManager, batch: Tensor, where: str) -> dict[str, Tensor]:
        """Per layer the pooled activations (N, D) of `batch`, each written into its buffer by the hook as the layer
        runs (one copy: no per-chunk parts to concatenate, nothing an in-place operation later in the model reaches)."""
        out: dict[str, Tensor] = {}
        errors: list[ValueError] = []
        at = 0

        def sink(name: str, t: Tensor) -> None:
            try:
                v = _pool(t, self.pool, name)
            except ValueError as exc:  # raised after the forward pass, not inside the model
                errors.append(exc)
                return
            if name not in out:
                out[name] = torch.empty(batch.shape[0], v.shape[1], dtype=torch.float32, device=v.device)
            out[name][at : at + v.shape[0]].copy_(v)

        with torch.no_grad():
            for chunk in batch.split(self.batch_size):
                self._forward(hooks, chunk, where, grad=False, sink=sink)
                if errors:
                    raise errors[0]
                at += chunk.shape[0]
        return out

    def _load(self, sets: Mapping[str, Any]) -> dict[str, Tensor]:
        """The example batches of the sets not cached yet: all loaded and counted before any forward pass."""
        batches = {}
        for key, (examples, where) in sets.items():
            entry = self._acts.get(key)
            if entry is None or not entry.holds(examples):
                batches[key] = load_examples(self.model, examples, where, preprocess=self.preprocess)
        return batches

    def _fill(self, hooks: HookManager, sets: Mapping[str, Any], batches: Mapping[str, Tensor]) -> None:
        for key, batch in batches.items():
            examples, where = sets[key]
            self._acts[key] = _Cached(examples, self._activations(hooks, batch, where))

    # -- CAVs -----------------------------------------------------------------------------------------------------
    @staticmethod
    def _random_sets(pool_size: int, n_sets: int, size: int, seed: int) -> Tensor:
        """(n_sets, size) rows of the random pool: disjoint sets where the pool is large enough (as the paper's
        distinct random image sets), else each drawn on its own (sets may overlap, never within a set)."""
        g = torch.Generator().manual_seed(seed)
        if n_sets * size <= pool_size:
            return torch.randperm(pool_size, generator=g)[: n_sets * size].view(n_sets, size)
        return torch.stack([torch.randperm(pool_size, generator=g)[:size] for _ in range(n_sets)])

    def _train(self, concepts: Sequence[str], draw: Tensor, draw_key: tuple[Any, ...]) -> dict[str, dict[str, Tensor]]:
        """{layer: {concept or _RANDOM: (n_random, D) CAVs}}: concept c vs random set j, and null set j vs random
        set j (`_draw`); cached ones reused, the others trained per layer in one call."""
        pool = self._acts[_RANDOM]
        n_random = draw_key[0]
        fixed = draw_key[3] == "fixed"
        out: dict[str, dict[str, Tensor]] = {}
        for layer in self.layers:
            parts = [self._acts[c].acts[layer] for c in concepts] + [pool.acts[layer]]  # rows of their concatenation
            offsets, start = {}, 0
            for c, part in zip([*concepts, _RANDOM], parts, strict=True):
                offsets[c] = start
                start += part.shape[0]
            rows = draw + offsets[_RANDOM]  # on the host, like the draw: the indices go to the device in train_cavs
            problems: list[tuple[tuple[Any, ...], Tensor, Tensor]] = []
            for c in [*concepts, _RANDOM]:
                for j in range(n_random):
                    if c == _RANDOM:
                        null = n_random if fixed else n_random + j
                        pos, token = rows[null], (pool.token, draw_key, null)
                    else:
                        n = self._acts[c].acts[layer].shape[0]
                        pos, token = torch.arange(offsets[c], offsets[c] + n), self._acts[c].token
                    key = (layer, self.cav, self.l2, self.steps, token, (pool.token, draw_key, j))
                    problems.append((key, pos, rows[j]))
            todo = [p for p in problems if p[0] not in self._cavs]
            if todo:
                cavs = train_cavs(
                    parts,
                    [p[1] for p in todo],
                    [p[2] for p in todo],
                    kind=self.cav,
                    l2=self.l2,
                    steps=self.steps,
                )
                for p, v in zip(todo, cavs, strict=True):
                    self._cavs[p[0]] = v
            vs = [self._cavs[p[0]] for p in problems]
            keys = [*concepts, _RANDOM]
            out[layer] = {c: torch.stack(vs[i * n_random : (i + 1) * n_random]) for i, c in enumerate(keys)}
        return out

    def compute_cavs(
        self,
        concepts: Mapping[str, Examples],
        random: Examples,
        *,
        n_random: int = 10,
        random_size: int | None = None,
        null: Null = "independent",
        seed: int = 0,
    ) -> dict[str, dict[str, Tensor]]:
        """The CAVs alone: ``{layer: {concept: (n_random, D) unit CAVs, "random": (n_random, D) null CAVs}}``.

        Row j of a concept's CAVs separates it from random set j; row j of ``"random"`` separates null set j from
        random set j (the null of the significance test, see `interpret`), each pointing away from random set j.
        See `interpret` for the arguments.
        """
        names, sets = self._check_sets(concepts, random, n_random, random_size, seed, null)
        batches = self._load(sets)
        with self._cache_kept_on_failure():
            with self._prepared() as hooks:
                self._fill(hooks, sets, batches)
            draw, draw_key = self._draw(names, n_random, random_size, seed, null)
            cavs = self._train(names, draw, draw_key)
        return {layer: {("random" if c == _RANDOM else c): v for c, v in d.items()} for layer, d in cavs.items()}

    def _check_sets(
        self, concepts: Any, random: Any, n_random: Any, random_size: Any, seed: Any, null: Any
    ) -> tuple[list[str], dict[str, tuple[Any, str]]]:
        if null not in NULLS:
            raise ValueError(f"null must be one of {', '.join(repr(n) for n in NULLS)}, got {null!r}")
        if not isinstance(concepts, Mapping) or not concepts:
            raise TypeError(
                "concepts must be a non-empty dict {name: examples} (examples: a tensor (N, ...), an image folder, a "
                f"list of image files, a Dataset or an iterable of batches), got "
                f"{type(concepts).__name__}" + (" (empty)" if isinstance(concepts, Mapping) else "")
            )
        for name in concepts:
            if not isinstance(name, str) or not name or name == "random" or name.startswith("\0"):
                raise ValueError(f"concepts: names must be non-empty strings other than 'random', got {name!r}")
        if random is None:
            raise TypeError(
                "random must be examples of no particular concept (a tensor, an image folder, a list of image files, a "
                "Dataset), from which the random counter-example sets are drawn; got None"
            )
        int_option("n_random", n_random, "an int >= 2 (random sets: the t-test needs at least two scores)", minimum=2)
        int_option("random_size", random_size, "an int >= 2 (examples per set) or None", minimum=2, optional=True)
        int_option("seed", seed, "an int (the random sets' draw)", minimum=None)
        sets = {name: (ex, f"concepts[{name!r}]") for name, ex in concepts.items()}
        sets[_RANDOM] = (random, "random")
        return list(concepts), sets

    def _draw(
        self, names: Sequence[str], n_random: int, random_size: int | None, seed: int, null: str
    ) -> tuple[Tensor, tuple[Any, ...]]:
        """The random sets, (n_sets, size) rows of the pool: sets 0..n_random-1 are the counter-examples; the null's
        "random concepts" follow: one more set (null="fixed") or n_random more (null="independent")."""
        pool_size = next(iter(self._acts[_RANDOM].acts.values())).shape[0]
        if random_size is None:
            largest = max(next(iter(self._acts[c].acts.values())).shape[0] for c in names)
            size = min(pool_size, largest)
        elif random_size > pool_size:
            raise ValueError(
                f"random_size={random_size} but random holds {pool_size} examples; pass random_size <= {pool_size} "
                "or more random examples"
            )
        else:
            size = random_size
        n_sets = n_random + (1 if null == "fixed" else n_random)
        return self._random_sets(pool_size, n_sets, size, seed), (n_random, size, seed, null)

    # -- gradients ------------------------------------------------------------------------------------------------
    def _gradients(self, hooks: HookManager, x: Tensor, target: Any) -> tuple[dict[str, Tensor], Tensor]:
        """Per layer the pooled gradients (N, D) of each input's target logit, and the targets (N,): one forward and
        one backward pass per batch, all layers at once (the gradient of the sum of the rows' logits is each row's
        own gradient: rows do not mix in eval mode)."""
        plan = check_target(target, x.shape[0])
        if plan.fn is not None or plan.multi:
            raise TypeError(
                "target must be None (each input's top class), an int, or one int per input; TCAV groups the inputs "
                "by class, so callables and (N, K) targets are not taken"
            )
        grads: dict[str, list[Tensor]] = {n: [] for n in self.layers}
        targets: list[Tensor] = []
        with torch.enable_grad():
            for start in range(0, x.shape[0], self.batch_size):
                chunk = x[start : start + self.batch_size]
                out, taken = self._forward(hooks, chunk, "inputs", grad=True)
                logits = class_logits(out)
                if plan.indices is None:
                    t = logits.detach().argmax(1)
                else:
                    t = plan.indices[start : start + chunk.shape[0], 0].to(logits.device)
                    if int(t.max()) >= logits.shape[1]:
                        raise ValueError(
                            f"target class {int(t.max())} is out of range: the model outputs {logits.shape[1]} classes"
                        )
                score = logits.gather(1, t[:, None]).sum()
                names = list(self.layers)
                got = torch.autograd.grad(score, [taken[n] for n in names], allow_unused=True)
                for name, g in zip(names, got, strict=True):
                    if g is None:
                        raise ValueError(
                            f"the class logits do not depend on layer {name!r}'s output; choose a layer on the way "
                            "to the output"
                        )
                    grads[name].append(_pool_grad(g, self.pool).float())
                targets.append(t)
        return {n: torch.cat(g) for n, g in grads.items()}, torch.cat(targets)

    # -- the method -----------------------------------------------------------------------------------------------
    def interpret(
        self,
        inputs: Examples,
        concepts: Mapping[str, Examples],
        random: Examples,
        *,
        target: Any = None,
        n_random: int = 10,
        random_size: int | None = None,
        null: Null = "independent",
        test: TestKind = "student",
        correction: Correction = "bonferroni",
        alpha: float = 0.05,
        seed: int = 0,
    ) -> TCAVResult:
        """TCAV scores of the classes of `inputs` for each concept at each layer, with p-values.

        Args:
            inputs: the inputs whose class sensitivity is measured, in any form concepts take.
            concepts: ``{name: examples}``; examples: a tensor (N, ...), an image folder, a list of image files, a
                Dataset, an iterable of batches (`hookviz.concepts.examples`); at least two each.
            random: examples of no particular concept, from which the random sets of `random_size` examples
                (default: the largest concept's size, at most all of them) are drawn with `seed`: disjoint where
                the pool is large enough (2 n_random sets, or n_random + 1 with null="fixed"), else each on its own.
            target: None (each input's top class), an int (every input), or one int per input (a sequence or 1-D
                tensor): inputs are grouped by their target class.
            n_random: the CAVs per concept, one per random counter-example set, and as many null CAVs; >= 2.
            null: the random-vs-random CAVs the scores are compared with. ``"independent"`` (default): null CAV j
                separates a random set of its own ("a random concept") from random set j, so the null's spread
                includes the variation of the random concept, which the paper's test is about (section 3.3: "TCAV
                scores of random CAVs"). ``"fixed"``: one random set against each random set j, as the paper's code
                (tensorflow/tcav's ``random_counterpart``) and captum's tutorial do; with one draw of the random
                concept, its own idiosyncrasy sets the null, and unrelated concepts come out significant more often
                than alpha says (measured on the shapes models: docs/concepts.md).
            test: ``"student"`` (pooled variance, the paper's code) or ``"welch"``.
            correction: ``"bonferroni"``, ``"holm"``, ``"bh"`` (Benjamini-Hochberg) or ``"none"``, over all
                (class, concept, layer) tests of the call, per score kind.
            alpha: the significance level applied to the corrected p-values.

        Returns a `TCAVResult`: one row per (class, concept, layer) with both scores' per-CAV values, their null
        values, t statistics and p-values.
        """
        if test not in TESTS:
            raise ValueError(f"test must be one of {', '.join(repr(t) for t in TESTS)}, got {test!r}")
        if correction not in CORRECTIONS:
            raise ValueError(f"correction must be one of {', '.join(repr(c) for c in CORRECTIONS)}, got {correction!r}")
        number_option("alpha", alpha, "a number in (0, 1)", lambda v: 0 < v < 1)
        names, sets = self._check_sets(concepts, random, n_random, random_size, seed, null)
        batches = self._load(sets)
        x = load_examples(self.model, inputs, "inputs", preprocess=self.preprocess, minimum=1)
        with self._cache_kept_on_failure():
            with self._prepared() as hooks:
                self._fill(hooks, sets, batches)
                grads, targets = self._gradients(hooks, x, target)
            draw, draw_key = self._draw(names, n_random, random_size, seed, null)
            cavs = self._train(names, draw, draw_key)
        return self._scores(names, grads, targets, cavs, test, correction, float(alpha))

    def _scores(
        self,
        names: Sequence[str],
        grads: Mapping[str, Tensor],
        targets: Tensor,
        cavs: Mapping[str, Mapping[str, Tensor]],
        test: TestKind,
        correction: Correction,
        alpha: float,
    ) -> TCAVResult:
        classes = torch.unique(targets)
        sign: dict[str, Tensor] = {}
        magnitude: dict[str, Tensor] = {}
        for layer in self.layers:
            v = torch.cat([cavs[layer][c] for c in [*names, _RANDOM]])  # (S * R, D)
            sign[layer], magnitude[layer] = tcav_scores(grads[layer].to(v.device), v, targets.to(v.device), classes)
        n_random = next(iter(cavs[next(iter(self.layers))].values())).shape[0]
        labels = class_names(self.model)
        class_list = [int(c) for c in classes.tolist()]
        values = {
            kind: {layer: t.view(len(class_list), len(names) + 1, n_random).tolist() for layer, t in d.items()}
            for kind, d in (("sign_count", sign), ("magnitude", magnitude))
        }
        rows: list[TCAVRow] = []
        for ki, k in enumerate(class_list):
            for ci, c in enumerate(names):
                for layer in self.layers:
                    stats = {}
                    for kind in SCORES:
                        scores, null = values[kind][layer][ki][ci], values[kind][layer][ki][len(names)]
                        tt = ttest_ind(scores, null, test)
                        stats[kind] = ScoreStats(scores, null, tt.t, tt.df, tt.p)
                    rows.append(TCAVRow(k, _class_name(labels, k), c, layer, stats))
        for kind in SCORES:
            adjusted = correct([r.stats[kind].p for r in rows], correction)
            for r, p in zip(rows, adjusted, strict=True):
                r.stats[kind].p_corrected = p
                r.stats[kind].significant = p < alpha
        return TCAVResult(
            rows,
            layers=list(self.layers),
            concepts=list(names),
            classes=class_list,
            n_random=n_random,
            test=test,
            correction=correction,
            alpha=alpha,
            cav=self.cav,
            pool=self.pool,
        )


def _class_name(labels: Any, k: int) -> str:
    try:
        return str(labels[k]) if labels is not None and not hasattr(labels, "meta") else str(k)
    except (IndexError, KeyError, TypeError):
        return str(k)
