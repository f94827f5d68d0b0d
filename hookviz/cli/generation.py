"""``hookviz explain-generation``: explain what a local Hugging Face causal language model writes after a prompt."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import UsageError, _parse_device

DESCRIPTION = (
    "Explain what a causal language model generates after each prompt: every generated token's scores over the "
    "prompt and the tokens before it, from one forward pass (hookviz.explain_generation). --model is a local Hugging "
    "Face folder (config, weights, tokenizer) loaded with AutoModelForCausalLM / AutoTokenizer.from_pretrained, "
    "offline. Writes self-contained HTML (.html) or a heat map (.png, .pdf, .svg)."
)
METHODS = (
    "saliency", "input-x-gradient", "integrated-gradients", "attn-lrp", "cp-lrp", "attention-rollout",
    "gradient-rollout", "occlusion",
)  # fmt: skip


def add_parser(sub: Any) -> None:
    """The ``explain-generation`` subcommand's arguments."""
    p = sub.add_parser(
        "explain-generation", help="explain a language model's generated text token by token", description=DESCRIPTION
    )
    p.add_argument("--model", required=True, metavar="DIR", help="a local Hugging Face causal LM folder")
    p.add_argument("--prompt", action="append", default=None, help="a prompt (repeat for several)")
    p.add_argument("--prompt-file", default=None, help="a text file with one prompt per line")
    p.add_argument("--target", default=None, help="explain this continuation (forced) instead of the generated one")
    p.add_argument("--method", default="input-x-gradient", choices=METHODS, help="default: %(default)s")
    p.add_argument("--max-new-tokens", type=int, default=32, help="default: %(default)s")
    p.add_argument("--chat-template", action="store_true", help="apply the tokenizer's chat template to each prompt")
    p.add_argument("--out", default="generation.html", help="the file written (default: %(default)s)")
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


def _explain_generation(args: argparse.Namespace) -> int:
    from .. import explain_generation

    prompts = _prompts(args)
    device = _parse_device(args.device)
    out = Path(args.out)
    if out.suffix.lower() not in (".html", ".htm", ".png", ".pdf", ".svg"):
        raise UsageError(f"--out must end with .html, .png, .pdf or .svg, got {str(out)!r}")
    folder = Path(args.model)
    if not (folder / "config.json").is_file():
        raise UsageError(f"--model: {str(folder)!r} is not a Hugging Face model folder (no config.json in it)")
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
    exp = explain_generation(
        model,
        tokenizer,
        prompts,
        method=args.method,
        target=args.target,
        max_new_tokens=args.max_new_tokens,
        chat_template=args.chat_template,
    )
    exp.save(out)
    for i, generated in enumerate(exp.generated_tokens):
        print(f"prompt {i}: {''.join(generated)!r}")
    print(f"wrote {out}: {args.method}, {len(prompts)} prompt(s)")
    return 0
