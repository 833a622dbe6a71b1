"""`hf-ext optimus attribute ...`: train a latent attribute operator, sample and edit with operators
(`hf_ext.models.optimus.attributes`)."""

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from ...arguments import positive_float, positive_int, sentence
from ...cli_utils import add_device_arguments, add_model_argument, model_loading_settings
from ...errors import HfExtError, require
from .attributes import (
    ATTRIBUTES_FOLDER,
    DEFAULT_METHOD,
    FLOW_STEPS,
    GAUSSIAN_TEMPERATURE,
    METHODS,
    NAME_PATTERN,
    TRAINING_STEPS,
)
from .loading import load_optimus


def register_attribute_commands(tools: argparse._SubParsersAction) -> None:
    """The `attribute` group of `hf-ext optimus`."""
    help_text = "latent attribute operators: classifiers on z that steer sampling and editing (LatentOps)"
    group = tools.add_parser("attribute", help=help_text, description=help_text).add_subparsers(
        dest="attribute_tool", required=True, metavar="TOOL")

    help_text = (f"train an operator for one attribute from labelled sentences, the model frozen; writes "
                 f"OUT/{ATTRIBUTES_FOLDER}/NAME/ (give the model folder as OUT to keep it with the model)")
    parser = group.add_parser("train", help=help_text, description=help_text)
    add_model_argument(parser, "model folder or Hub repo id")
    parser.add_argument("out", type=Path, help="folder that receives the operator (the model folder, or any other)")
    parser.add_argument("--data", required=True, type=Path,
                        help='JSON lines, one {"text": ..., "label": ...} per sentence')
    parser.add_argument("--name", required=True, help="the attribute's name (letters, digits, '_', '-')")
    parser.add_argument("--steps", type=positive_int, default=TRAINING_STEPS,
                        help=f"optimizer steps (default {TRAINING_STEPS})")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace an operator of the same name")
    add_device_arguments(parser)
    parser.set_defaults(handler=_train)

    def flow_tool(name, help_text, handler):
        parser = group.add_parser(name, help=help_text, description=help_text)
        add_model_argument(parser, "model folder or Hub repo id")
        add_device_arguments(parser)
        parser.add_argument("--attribute", action="append", default=[], metavar="NAME=LABEL", required=True,
                            help="a requested attribute label (repeat for several)")
        parser.add_argument("--operators", help=f"folder or Hub repo id holding {ATTRIBUTES_FOLDER}/ "
                            "(default: the model's own)")
        parser.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD,
                            help="gaussian: the labels' Gaussians (sampling) and their means' difference (editing); "
                            f"flow: LatentOps' ODE on the classifiers (default {DEFAULT_METHOD})")
        parser.add_argument("--flow-steps", type=positive_int, default=FLOW_STEPS,
                            help=f"steps of the ODE of --method flow (default {FLOW_STEPS})")
        parser.add_argument("--strength", type=positive_float, default=1.0,
                            help="weight of the attributes' energy in --method flow (default 1.0)")
        parser.add_argument("--max-new-tokens", type=positive_int, default=32, help="tokens to generate (default 32)")
        parser.set_defaults(handler=handler)
        return parser

    parser = flow_tool("sample", "decode latents drawn with the requested attributes", _sample)
    parser.add_argument("--num", type=positive_int, default=5, help="how many sentences (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--temperature", type=positive_float, default=GAUSSIAN_TEMPERATURE,
                        help="share of the label Gaussian's spread in --method gaussian "
                        f"(default {GAUSSIAN_TEMPERATURE})")
    flow_tool("edit", "move sentences' latents to the requested attributes, keeping the other operators' "
              "attributes, and decode them", _edit).add_argument("texts", nargs="+", type=sentence,
                                                                 help="sentences")


def _labelled(path: Path) -> tuple[list[str], list[str]]:
    from ...text_files import json_lines

    texts, labels = [], []
    for where, row in json_lines(path, "--data"):
        text, label = (row.get("text"), row.get("label")) if isinstance(row, dict) else (None, None)
        require(isinstance(text, str) and text.strip() and isinstance(label, str | int) and str(label).strip(),
                f'{where}: expected {{"text": "...", "label": "..."}} with a non-empty text and label')
        texts.append(str(text))
        labels.append(str(label).strip())
    counts = Counter(labels)
    require(len(counts) >= 2, f"--data {path} needs sentences of at least 2 labels, got "
            f"{', '.join(map(repr, counts)) or 'none'}")
    return texts, labels


def _train(args):
    from ...output import atomic_output_dir, check_output_dir
    from . import OptimusLatentSpace
    from .attributes import train_latent_attribute

    require(NAME_PATTERN.fullmatch(args.name), f"--name {args.name!r}: use letters, digits, '_' and '-' "
            "(a letter first, at most 64)")
    target = args.out / ATTRIBUTES_FOLDER / args.name
    check_output_dir(target, args.overwrite)
    texts, labels = _labelled(args.data)
    model, processor = load_optimus(args.model, args.trust_remote_code, **model_loading_settings(args))
    space = OptimusLatentSpace(model, processor)
    attribute = train_latent_attribute(space, texts, labels, args.name, steps=args.steps, seed=args.seed)
    predicted = attribute.predict(space.encode(texts)[0])
    accuracy = sum(p == label for p, label in zip(predicted, labels, strict=True)) / len(labels)
    with atomic_output_dir(target, args.overwrite) as staging:
        attribute.save(staging)
    print(json.dumps({"operator": str(target), "labels": dict(sorted(Counter(labels).items())),
                      "training_accuracy": accuracy, "model_fingerprint": attribute.fingerprint}))


def _operators_and_request(args):
    from .attributes import load_latent_attributes, parse_request, resolve_request

    try:
        request = parse_request(args.attribute)
        model, processor = load_optimus(args.model, args.trust_remote_code, **model_loading_settings(args))
        operators = load_latent_attributes(args.operators or args.model, model)
        resolve_request(operators, request)
        if args.method == "gaussian":
            for operator in operators.values():
                operator.require_label_gaussians()
    except ValueError as error:
        raise HfExtError(str(error)) from None
    return model, processor, operators, request


def _space(args, model, processor):
    from . import OptimusLatentSpace

    try:
        return OptimusLatentSpace(model, processor, max_new_tokens=args.max_new_tokens)
    except ValueError as error:  # more tokens than the decoder's positions
        raise HfExtError(str(error)) from None


def _sample(args):
    model, processor, operators, request = _operators_and_request(args)
    space = _space(args, model, processor)
    generator = torch.Generator(device=model.device).manual_seed(args.seed)
    for text in space.guided_sample(request, args.num, operators=operators, generator=generator,
                                    steps=args.flow_steps, strength=args.strength, method=args.method,
                                    temperature=args.temperature):
        print(text)


def _edit(args):
    model, processor, operators, request = _operators_and_request(args)
    space = _space(args, model, processor)
    edited = space.edit(args.texts, request, operators=operators, steps=args.flow_steps, strength=args.strength,
                        method=args.method)
    for text, output in zip(args.texts, edited, strict=True):
        print(f"{text}\t->\t{output}")
