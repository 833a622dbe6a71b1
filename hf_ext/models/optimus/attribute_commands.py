"""`hf-ext optimus attribute ...`: train a latent attribute operator, sample and edit with operators
(`hf_ext.models.optimus.attributes`)."""

import argparse
import json
import tempfile
from collections import Counter
from pathlib import Path

import torch

from ...arguments import positive_float, positive_int, sentence
from ...cli_utils import add_device_arguments, add_model_argument, model_loading_settings
from ...errors import HfExtError, require
from .attributes import (
    ATTRIBUTES_FOLDER,
    CONDITIONAL,
    CONDITIONAL_TEMPERATURE,
    DEFAULT_METHOD,
    FLOW_STEPS,
    GAUSSIAN_TEMPERATURE,
    METHODS,
    NAME_PATTERN,
    TRAINING_STEPS,
)
from .conditional import STEPS as CONDITIONAL_STEPS
from .loading import load_optimus


def register_attribute_commands(tools: argparse._SubParsersAction) -> None:
    """The `attribute` group of `hf-ext optimus`."""
    help_text = "latent attribute operators: classifiers on z that steer sampling and editing (LatentOps)"
    group = tools.add_parser("attribute", help=help_text, description=help_text).add_subparsers(
        dest="attribute_tool", required=True, metavar="TOOL")

    help_text = (f"train an operator for one attribute from labelled sentences, the model frozen; writes "
                 f"OUT/{ATTRIBUTES_FOLDER}/NAME/ (give the model folder as OUT to keep it with the model); with "
                 "--method conditional, fine-tune the model with label embeddings added to z instead (the Optimus "
                 f"paper's label-conditional generation) and write it to the new model folder OUT, its embeddings in "
                 f"OUT/{ATTRIBUTES_FOLDER}/NAME/")
    parser = group.add_parser("train", help=help_text, description=help_text)
    add_model_argument(parser, "model folder or Hub repo id")
    parser.add_argument("out", type=Path, help="folder that receives the operator (the model folder, or any other); "
                        "with --method conditional, the new model folder")
    parser.add_argument("--data", required=True, type=Path, action="append",
                        help='JSON lines, one {"text": ..., "label": ...} per sentence (with --method conditional, '
                        "repeat --name and --data for several attributes, in the same order)")
    parser.add_argument("--name", required=True, action="append",
                        help="the attribute's name (letters, digits, '_', '-')")
    parser.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD,
                        help="gaussian and flow: an operator on the frozen model's z (the same for both); "
                        f"conditional: the fine-tuned model with label embeddings (default {DEFAULT_METHOD})")
    parser.add_argument("--steps", type=positive_int,
                        help=f"optimizer steps (default {TRAINING_STEPS}; {CONDITIONAL_STEPS} with --method "
                        "conditional)")
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
        parser.add_argument("--method", choices=METHODS,
                            help="gaussian: the labels' Gaussians (sampling) and their means' difference (editing); "
                            "flow: LatentOps' ODE on the classifiers; conditional: a fine-tuned model's label "
                            "embeddings added to z (default: conditional for label embeddings, else "
                            f"{DEFAULT_METHOD})")
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
    parser.add_argument("--temperature", type=positive_float,
                        help="share of the label Gaussian's spread in --method gaussian (default "
                        f"{GAUSSIAN_TEMPERATURE}), of the drawn z's in --method conditional (default "
                        f"{CONDITIONAL_TEMPERATURE})")
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

    for name in args.name:
        require(NAME_PATTERN.fullmatch(name), f"--name {name!r}: use letters, digits, '_' and '-' "
                "(a letter first, at most 64)")
    require(len(args.name) == len(args.data), f"give one --data per --name: got {len(args.name)} names and "
            f"{len(args.data)} files")
    require(len(set(args.name)) == len(args.name), f"--name {args.name}: each attribute once")
    if args.method == CONDITIONAL:
        return _train_conditional(args)
    require(len(args.name) == 1, f"--method {args.method} trains one attribute per run: give one --name and "
            "one --data (several train together with --method conditional)")
    name, data = args.name[0], args.data[0]
    target = args.out / ATTRIBUTES_FOLDER / name
    check_output_dir(target, args.overwrite)
    texts, labels = _labelled(data)
    model, processor = load_optimus(args.model, args.trust_remote_code, **model_loading_settings(args))
    space = OptimusLatentSpace(model, processor)
    attribute = train_latent_attribute(space, texts, labels, name, steps=args.steps or TRAINING_STEPS,
                                       seed=args.seed)
    predicted = attribute.predict(space.encode(texts)[0])
    accuracy = sum(p == label for p, label in zip(predicted, labels, strict=True)) / len(labels)
    with atomic_output_dir(target, args.overwrite) as staging:
        attribute.save(staging)
    print(json.dumps({"operator": str(target), "labels": dict(sorted(Counter(labels).items())),
                      "training_accuracy": accuracy, "model_fingerprint": attribute.fingerprint}))


def _train_conditional(args):
    """`--method conditional`: the model fine-tuned with label embeddings (`conditional`), written whole to the new
    model folder OUT with its operators."""
    from ...cli_utils import training_device_settings
    from ...output import check_output_dir
    from ...trainer import training_run_output
    from .conditional import labelled_rows, train_label_conditional

    require(not (Path(args.model).exists() and Path(args.model).resolve() == args.out.resolve()),
            "--method conditional writes a new model folder: OUT must not be the model's own folder (its other "
            "operators are for the model before fine-tuning)")
    require(args.dtype != "auto", "--dtype auto: --method conditional trains float32 weights, in float32 or mixed "
            "precision (bfloat16, float16)")
    check_output_dir(args.out, args.overwrite)
    labelled = {name: _labelled(data) for name, data in zip(args.name, args.data, strict=True)}
    try:
        labelled_rows(labelled)
    except ValueError as error:  # a sentence labelled twice for one attribute
        raise HfExtError(str(error)) from None
    settings = training_device_settings(args)
    model, processor = load_optimus(args.model, args.trust_remote_code)  # float32 weights: Trainer places them
    with tempfile.TemporaryDirectory() as scratch:
        operators, trainer = train_label_conditional(model, processor, labelled, scratch,
                                                     steps=args.steps or CONDITIONAL_STEPS, seed=args.seed,
                                                     disable_tqdm=True, **settings)
        with training_run_output(args.out, trainer, processor, model=model, overwrite=args.overwrite) as staging:
            if staging is None:  # another process of a distributed run: the main one writes the output
                return
            for attribute in operators.values():
                attribute.save(staging / ATTRIBUTES_FOLDER / attribute.name)
    losses = [entry["train_loss"] for entry in trainer.state.log_history if "train_loss" in entry]
    print(json.dumps({"model": str(args.out), "operators": sorted(operators),
                      "labels": {name: dict(sorted(Counter(labels).items())) for name, (_, labels) in labelled.items()},
                      "steps": trainer.state.global_step, "train_loss": losses[-1] if losses else None,
                      "model_fingerprint": next(iter(operators.values())).fingerprint}))


def _operators_and_request(args):
    from .attributes import default_method, load_latent_attributes, operators_of_method, parse_request

    try:
        request = parse_request(args.attribute)
        model, processor = load_optimus(args.model, args.trust_remote_code, **model_loading_settings(args))
        operators = load_latent_attributes(args.operators or args.model, model)
        args.method = args.method or default_method(operators, request)
        of_method = operators_of_method(operators, request, args.method)
        if args.method == "gaussian":
            for operator in of_method.values():
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
