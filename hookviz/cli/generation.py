"""``hookviz explain-generation``: explain what a causal language model writes after each prompt (a local Hugging Face
model folder or the zoo's retrieval model), as one HTML view, a heat map, or the static report of several methods."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import UsageError, _parse_device, _parse_methods

if TYPE_CHECKING:
    from ..generation import GenerationExplanation

DESCRIPTION = """\
Explain what a causal language model generates after each prompt: every generated token's scores over the prompt
and the tokens before it, from one forward pass (hookviz.explain_generation). --model is a local Hugging Face folder
(config, weights, tokenizer) loaded with AutoModelForCausalLM / AutoTokenizer.from_pretrained, offline, or
retrieval-lm: the zoo's little model trained on key-value retrieval (hookviz.zoo.retrieval_lm; a folder of that
name is ./retrieval-lm). --out writes self-contained HTML (.html) or a heat map (.png, .pdf, .svg); --report DIR
writes the static report of a prompt file (hookviz.report_generation): one row per prompt, sortable and filtered,
and per prompt each method's token view and heat map. Several methods (--method a,b,c) explain the same
continuation: the first generates it, the others explain it forced.

example:
  hookviz explain-generation --model retrieval-lm --prompt "k3 v7 k1 v2 ? k1"
  hookviz explain-generation --model DIR --prompt-file prompts.txt --method input-x-gradient,attn-lrp --report out/
"""
METHODS = (
    "saliency", "input-x-gradient", "integrated-gradients", "attn-lrp", "cp-lrp", "attention-rollout",
    "gradient-rollout", "occlusion",
)  # fmt: skip
#: --model names of the zoo's language models: (the hookviz.zoo function returning (model, tokenizer), the default
#: --max-new-tokens: the retrieval model answers one value, then <eos>, within its 32 positions)
ZOO_LMS = {"retrieval-lm": ("retrieval_lm", 4)}


def add_parser(sub: Any) -> None:
    """The ``explain-generation`` subcommand's arguments."""
    p = sub.add_parser(
        "explain-generation",
        help="explain a language model's generated text token by token",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="a local Hugging Face causal LM folder, or retrieval-lm (the zoo's)",
    )
    p.add_argument("--prompt", action="append", default=None, help="a prompt (repeat for several)")
    p.add_argument("--prompt-file", default=None, help="a text file with one prompt per line")
    p.add_argument("--target", default=None, help="explain this continuation (forced) instead of the generated one")
    p.add_argument(
        "--method",
        default="input-x-gradient",
        metavar="M[,M...]",
        help=f"one or more (comma-separated) of {', '.join(METHODS)}; the first generates (default: %(default)s)",
    )
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: 32 (retrieval-lm: 4)")
    p.add_argument("--chat-template", action="store_true", help="apply the tokenizer's chat template to each prompt")
    p.add_argument(
        "--out", default=None, help="the file written: .html, .png, .pdf or .svg (default: generation.html, or none "
        "with --report); with several methods, the first method's"
    )  # fmt: skip
    p.add_argument("--report", default=None, metavar="DIR", help="write the static report of all prompts and methods")
    p.add_argument("--title", default=None, help="the report's title")
    p.add_argument(
        "--overwrite", action="store_true", help="write the report into DIR even if it holds files that are not one"
    )
    p.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    p.set_defaults(run=_explain_generation)


def _prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompt_file:
        path = Path(args.prompt_file)
        if not path.is_file():
            raise UsageError(f"--prompt-file: {str(path)!r} is not a file")
        prompts += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise UsageError("give a prompt: --prompt TEXT (repeatable) or --prompt-file FILE (one prompt per line)")
    return prompts


def _load(spec: str, device: Any) -> tuple[Any, Any]:
    """(model, tokenizer) of ``--model``: a zoo name (`ZOO_LMS`) or a local Hugging Face folder."""
    if spec in ZOO_LMS:
        from .. import zoo

        model, tokenizer = getattr(zoo, ZOO_LMS[spec][0])()
        return model.to(device), tokenizer
    folder = Path(spec)
    if not (folder / "config.json").is_file():
        raise UsageError(
            f"--model: {str(folder)!r} is not a Hugging Face model folder (no config.json in it) nor one of the zoo's "
            f"models ({', '.join(ZOO_LMS)})"
        )
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise UsageError("explain-generation needs transformers: pip install transformers") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).to(device)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--model: cannot load {str(folder)!r} as a causal LM with its tokenizer: {first}") from None
    return model, tokenizer


def _explain_generation(args: argparse.Namespace) -> int:
    from .. import report_generation

    prompts = _prompts(args)
    methods = _parse_methods(args.method, known=METHODS)
    if len(set(methods)) != len(methods):
        raise UsageError(f"--method: a method is named twice in {args.method!r}")
    device = _parse_device(args.device)
    out = Path(args.out) if args.out is not None else None if args.report else Path("generation.html")
    if out is not None and out.suffix.lower() not in (".html", ".htm", ".png", ".pdf", ".svg"):
        raise UsageError(f"--out must end with .html, .png, .pdf or .svg, got {str(out)!r}")
    if len(methods) > 1 and args.report is None:
        raise UsageError("several methods are shown together in the report: add --report DIR (and --out for the first)")
    if args.report is None and (args.title is not None or args.overwrite):
        raise UsageError("--title and --overwrite apply to --report DIR")
    model, tokenizer = _load(args.model, device)
    exps = _explain_all(model, tokenizer, prompts, methods, args)
    first = exps[methods[0]]
    for i, generated in enumerate(first.generated_tokens):
        print(f"prompt {i}: {''.join(generated)!r}")
    if out is not None:
        first.save(out)
        print(f"wrote {out}: {methods[0]}, {len(prompts)} prompt(s)")
    if args.report is not None:
        index = report_generation(exps, args.report, title=args.title, overwrite=args.overwrite)
        print(f"wrote {index}: {', '.join(methods)}, {len(prompts)} prompt(s)")
    return 0


def _explain_all(
    model: Any, tokenizer: Any, prompts: list[str], methods: list[str], args: argparse.Namespace
) -> dict[str, GenerationExplanation]:
    """{method: GenerationExplanation}: the first method explains the generation (or ``--target``), the others the
    same continuation forced (``target=`` its text); a prompt whose continuation is empty (only special tokens were
    generated) is left out of their runs and keeps the first method's empty entry."""
    from .. import explain_generation
    from ..generation import STEP_SCORES, GenerationExplanation

    common = {"chat_template": args.chat_template, "step_scores": STEP_SCORES}
    new = args.max_new_tokens if args.max_new_tokens is not None else ZOO_LMS.get(args.model, ("", 32))[1]
    first = explain_generation(
        model, tokenizer, prompts, method=methods[0], target=args.target, max_new_tokens=new, **common
    )
    exps = {methods[0]: first}
    texts = ["".join(t) for t in first.generated_tokens]
    keep = [i for i, t in enumerate(texts) if t]
    for name in methods[1:]:
        if keep == list(range(len(prompts))):
            exps[name] = explain_generation(model, tokenizer, prompts, method=name, target=texts, **common)
            continue
        rows: list[tuple[GenerationExplanation, int]] = [(first, i) for i in range(len(prompts))]
        score = first.score
        if keep:
            part = explain_generation(
                model, tokenizer, [prompts[i] for i in keep], method=name, target=[texts[i] for i in keep], **common
            )
            for k, i in enumerate(keep):
                rows[i] = (part, k)
            score = part.score
        exps[name] = GenerationExplanation(
            scores=[e.scores[k] for e, k in rows],
            source_tokens=[e.source_tokens[k] for e, k in rows],
            generated_tokens=[e.generated_tokens[k] for e, k in rows],
            prompt_lengths=[e.prompt_lengths[k] for e, k in rows],
            step_scores={s: [e.step_scores[s][k] for e, k in rows] for s in first.step_scores},
            method=name,
            score=score,
            word_starts=first.word_starts,
            prompts=list(prompts),
        )
    return exps
