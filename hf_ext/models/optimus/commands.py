"""`hf-ext optimus ...`: latent-space operations, training and evaluation on an Optimus model folder or Hub repo
id."""

import argparse
import json

import torch
from transformers.utils import logging

from ...arguments import (
    existing_folder,
    fraction,
    nonnegative_float,
    number_in,
    positive_float,
    positive_int,
    probability,
    sentence,
)
from ...cli_utils import (
    add_device_arguments,
    add_lora_arguments,
    add_model_argument,
    add_run_reporting_arguments,
    check_lora_arguments,
    model_commands,
    model_loading_settings,
    model_source,
    run_reporting_settings,
    training_device_settings,
)
from ...errors import require
from . import conversion
from .attribute_commands import register_attribute_commands
from .configuration_optimus import ENCODER_POOLINGS
from .demo import add_demo_command
from .loading import load_optimus
from .quantization import QUANTIZATIONS, quantize_decoder

logger = logging.get_logger(__name__)

CHECKPOINTS_SUFFIX = "-checkpoints"  # OUTPUT_DIR-checkpoints/: the run's Trainer checkpoints, until it ends


def register(commands: argparse._SubParsersAction) -> None:
    """The `hf-ext optimus` commands."""
    tools = model_commands(commands, conversion.CONVERT_NAME, "Optimus latent-space tools and training",
                           "Work with an Optimus model (a folder or a Hub repo id).")

    def tool(name, help_text, handler, decodes=True):
        parser = tools.add_parser(name, help=help_text, description=help_text)
        add_model_argument(parser, "model folder or Hub repo id")
        if decodes:
            parser.add_argument("--quantize", choices=QUANTIZATIONS,
                                help="int8 (PyTorch) or nf4 (bitsandbytes, the quantize extra) weights in the "
                                "decoder's projections and LM head: faster decoding on the CPU, slightly different "
                                "logits (docs/export.md)")
        parser.add_argument("--max-new-tokens", type=positive_int, default=32, help="tokens to generate (default 32)")
        parser.add_argument("--num-beams", type=positive_int, default=1, help="beam search width (default 1: greedy)")
        parser.add_argument("--sample", action="store_true", help="sample instead of greedy/beam decoding")
        # no defaults here: a sampling option given without --sample is refused, not silently ignored
        parser.add_argument("--top-k", type=number_in(int, 0), help="top-k sampling (with --sample; default 0: off)")
        parser.add_argument("--top-p", type=probability, help="nucleus sampling (with --sample; default 1.0: off)")
        parser.add_argument("--temperature", type=positive_float,
                            help="sampling temperature (with --sample; default 1.0)")
        parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
        add_device_arguments(parser)
        parser.set_defaults(handler=lambda args: handler(args, _latent_space(args)))
        return parser

    tool("encode", "print each sentence's posterior mean and log-variance as JSON", _encode,
         decodes=False).add_argument("texts", nargs="+", type=sentence, help="sentences")
    tool("reconstruct", "encode sentences and decode them from their posterior means", _reconstruct).add_argument(
        "texts", nargs="+", type=sentence, help="sentences")
    tool("sample", "decode latents drawn from the prior", _sample).add_argument(
        "--num", type=positive_int, default=5, help="how many sentences (default 5)")
    parser = tool("interpolate", "decode points on the line between two sentences' latents", _interpolate)
    parser.add_argument("start", type=sentence, help="first sentence")
    parser.add_argument("end", type=sentence, help="last sentence")
    parser.add_argument("--steps", type=number_in(int, 2), default=5, help="points including both ends (default 5)")
    parser = tool("analogy", "a : b :: c : ? in latent space (z_c + (z_b - z_a) * degree)", _analogy)
    for name in ("a", "b", "c"):
        parser.add_argument(name, type=sentence, help=f"sentence {name}")
    parser.add_argument("--degree", type=float, default=1.0, help="how far to move (default 1.0)")
    register_attribute_commands(tools)
    _register_init(tools)
    _register_training_tools(tools)
    add_demo_command(tools)
    add_demo_command(commands)  # the shortcut `hf-ext demo`


def _latent_space(args):
    from ...errors import HfExtError
    from . import OptimusLatentSpace

    sampling = {"top_k": (args.top_k, 0), "top_p": (args.top_p, 1.0), "temperature": (args.temperature, 1.0)}
    given = [f"--{name.replace('_', '-')}" for name, (value, _) in sampling.items() if value is not None]
    require(args.sample or not given, f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with "
            "--sample")
    torch.manual_seed(args.seed)
    generation = {"max_new_tokens": args.max_new_tokens, "num_beams": args.num_beams, "do_sample": args.sample}
    if args.sample:
        generation.update({name: default if value is None else value for name, (value, default) in sampling.items()})
    model, processor = load_optimus(args.model, args.trust_remote_code, **model_loading_settings(args))
    if getattr(args, "quantize", None) is not None:
        quantize_decoder(model, args.quantize)
    try:
        return OptimusLatentSpace(model, processor, **generation)
    except ValueError as error:  # generation settings the model cannot follow
        raise HfExtError(str(error)) from None


def _encode(args, space):
    mean, logvar = space.encode(args.texts)
    for text, m, lv in zip(args.texts, mean.tolist(), logvar.tolist(), strict=True):
        print(json.dumps({"text": text, "mean": m, "logvar": lv}))


def _reconstruct(args, space):
    for text, output in zip(args.texts, space.reconstruct(args.texts), strict=True):
        print(f"{text}\t->\t{output}")


def _sample(args, space):
    for text in space.sample(args.num, generator=torch.Generator().manual_seed(args.seed)):
        print(text)


def _interpolate(args, space):
    for weight, text in space.interpolate(args.start, args.end, args.steps):
        print(f"{weight:.2f}\t{text}")


def _analogy(args, space):
    print(space.analogy(args.a, args.b, args.c, args.degree))


# ----- building from pretrained backbones ----------------------------------------------------------------------------

def _register_init(tools):
    help_text = ("build an Optimus from a pretrained encoder and a pretrained causal language model (their weights "
                 "and tokenizers; the latent parts freshly initialised, to be trained with `train`)")
    parser = tools.add_parser("init", help=help_text, description=help_text)
    parser.add_argument("encoder", type=model_source, help="the encoder: folder or Hub repo id of a bidirectional "
                        "encoder (BERT, RoBERTa, DeBERTa-v2, ModernBERT, a sentence-transformers model, ...)")
    parser.add_argument("decoder", type=model_source, help="the decoder: folder or Hub repo id of a decoder-only "
                        "causal language model with a key/value cache (GPT-2, Llama, Qwen, Mistral, Gemma, ...)")
    parser.add_argument("out", help="folder to write (must not exist unless --overwrite)")
    parser.add_argument("--adapter", type=existing_folder,
                        help="a trained adapter folder (`save_backbones_adapter`: LoRA weights and latent parts) to "
                        "build the model it trained from these backbones, instead of untrained latent parts")
    # no defaults in the parser: an adapter fixes these, and giving one beside it is refused
    parser.add_argument("--latent-size", type=positive_int, help="size of the latent code (default 32)")
    parser.add_argument("--latent-as-gpt-memory", type=int, choices=(0, 1),
                        help="1: the latent enters every decoder layer as a key/value memory slot (default 1)")
    parser.add_argument("--latent-as-gpt-emb", type=int, choices=(0, 1),
                        help="1: the latent is added to every token embedding of the decoder (default 1)")
    parser.add_argument("--encoder-pooling", choices=ENCODER_POOLINGS,
                        help="the encoder's sentence feature (default: a sentence-transformers model's own mean or "
                        "CLS pooling, else the encoder's pooler where its checkpoint has one, else mean)")
    parser.add_argument("--seed", type=int, default=0,
                        help="random seed of the latent projections and the added token embeddings (default 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    # ENCODER and DECODER may be Hub repo ids: the command may reach the Hub for them (hf_ext.cli_utils.needs_the_hub)
    parser.set_defaults(handler=_init, model_arguments=("encoder", "decoder"))


def _init(args):
    from ...output import atomic_output_dir, check_output_dir
    from ...registration import add_custom_pipelines
    from . import ENTRY
    from .backbones import optimus_from_backbones, optimus_from_backbones_and_adapter, write_backbones_card

    # the settings given (the others keep optimus_from_backbones' defaults); 0/1 flags as booleans
    given = {name: bool(value) if name.startswith("latent_as_") else value
             for name in ("latent_size", "latent_as_gpt_memory", "latent_as_gpt_emb", "encoder_pooling")
             if (value := getattr(args, name)) is not None}
    require(args.adapter is None or not given, f"{', '.join('--' + name.replace('_', '-') for name in given)} with "
            "--adapter: the adapter's model fixes the latent size, injection and pooling it was trained with")
    check_output_dir(args.out, args.overwrite)
    if args.adapter is not None:
        model, processor = optimus_from_backbones_and_adapter(args.adapter, args.encoder, args.decoder)
    else:
        model, processor = optimus_from_backbones(args.encoder, args.decoder, seed=args.seed, **given)
    with atomic_output_dir(args.out, args.overwrite) as staging:
        add_custom_pipelines(staging, model.config, ENTRY.pipelines, type(model))
        model.save_pretrained(staging)
        processor.save_pretrained(staging)
        write_backbones_card(staging, args.out, model, processor, args.encoder, args.decoder, args.adapter)
    decoder_tokenizer = processor.decoder_tokenizer
    print(json.dumps({"output_dir": str(args.out), "parameters": model.num_parameters(),
                      "encoder_pooling": model.config.encoder_pooling,
                      **{name: getattr(decoder_tokenizer, name) for name in ("pad_token", "bos_token", "eos_token")}}))


# ----- training and evaluation --------------------------------------------------------------------------------------

def _register_training_tools(tools):
    # the training modules (transformers.Trainer) are imported only when a tool runs, to keep `hf-ext` quick to start
    def model_tool(name, help_text, handler, training):
        parser = tools.add_parser(name, help=help_text, description=help_text)
        add_model_argument(parser, "model folder or Hub repo id")
        add_device_arguments(parser, training=training)
        parser.add_argument("--batch-size", type=positive_int, default=8, help="sentences per batch (default 8)")
        parser.add_argument("--max-length", type=number_in(int, 3, description="at least 3 (<BOS>, a token, <EOS>)"),
                            help="truncate each side to this many tokens (default: what the model's positions allow)")
        parser.add_argument("--seed", type=int, default=42, help="random seed (default 42)")
        parser.set_defaults(handler=handler)
        return parser

    parser = model_tool("train", "fine-tune an Optimus VAE on a text file (one sentence per line) with the "
                        "original's cyclical KL schedule; saves the model and processor", _train, training=True)
    parser.add_argument("--train-file", required=True, help="text file, one sentence per line (or a folder of "
                        ".txt shards, a glob, a Hub dataset id with a text column)")
    parser.add_argument("--streaming", action="store_true",
                        help="read --train-file as a stream while training, for corpora larger than memory")
    parser.add_argument("--output-dir", required=True, help="folder for the trained model (written atomically)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output-dir")
    parser.add_argument("--max-steps", type=positive_int, default=1000, help="optimizer steps (default 1000)")
    parser.add_argument("--learning-rate", type=positive_float, default=5e-5, help="peak learning rate (default 5e-5)")
    parser.add_argument("--beta", type=nonnegative_float, help="maximum KL weight (default: the model's config.beta)")
    parser.add_argument("--n-cycles", type=positive_int, default=1, help="cycles of the KL schedule (default 1)")
    parser.add_argument("--ratio-zero", type=fraction,
                        help="share of each cycle with beta 0 (default: the original's training default, 0.25)")
    parser.add_argument("--ratio-increase", type=probability,
                        help="share of each cycle ramping beta up (default: the original's training default, 0.25)")
    parser.add_argument("--dim-target-kl", type=nonnegative_float,
                        help="free-bits threshold per latent dimension (fb-mode 1)")
    parser.add_argument("--fb-mode", type=int, choices=(0, 1, 2),
                        help="KL mode: 0 plain, 1 per-dimension threshold, 2 deterministic")
    parser.add_argument("--length-weighted-loss", action=argparse.BooleanOptionalAction,
                        help="divide each reconstruction loss by the sentence length (default: the model's setting)")
    parser.add_argument("--logging-steps", type=positive_int, default=50, help="steps per logged average (default 50)")
    add_run_reporting_arguments(parser)
    parser.add_argument("--save-steps", type=positive_int, default=500,
                        help=f"checkpoint every N steps into OUTPUT_DIR{CHECKPOINTS_SUFFIX}/ (default 500); running "
                        "the same command again resumes from the newest complete checkpoint there; the folder is "
                        "removed when the run ends")
    parser.add_argument("--plot", action="store_true", help="also write training_curves.png (needs matplotlib)")
    backbones = parser.add_argument_group("frozen and LoRA backbones (the latent projections always train)")
    backbones.add_argument("--freeze-encoder", action="store_true", help="do not train the encoder's weights")
    backbones.add_argument("--freeze-decoder", action="store_true",
                           help="do not train the decoder's weights (its LM head and token embeddings included)")
    add_lora_arguments(backbones, "train only LoRA adapters of this rank on the attention of the chosen backbones, "
                       "the latent projections and the embeddings of the decoder's added <PAD>/<BOS>/<EOS>; the "
                       "adapters are merged into the saved model")
    backbones.add_argument("--lora-on", choices=("encoder", "decoder", "both"),
                           help="the backbones LoRA adapts (default both); a backbone without adapters is frozen")

    evaluation = parser.add_argument_group("evaluation of the trained model (the metrics of `evaluate`, printed and "
                                           "recorded in its model card)")
    _add_evaluation_arguments(evaluation, eval_file_help="text file, one sentence per line, to evaluate the trained "
                              "model on (default: no evaluation)")

    parser = model_tool("evaluate", "the paper's language-modelling metrics on a text file, as JSON: perplexity "
                        "(importance-weighted), -ELBO, KL, mutual information, active units", _evaluate, training=False)
    _add_evaluation_arguments(parser, eval_file_help="text file, one sentence per line", required=True)


def _add_evaluation_arguments(parser, eval_file_help, required=False):
    parser.add_argument("--eval-file", required=required, help=eval_file_help)
    parser.add_argument("--num-samples", type=positive_int, default=100,
                        help="posterior samples of the importance-weighted likelihood (default 100)")
    parser.add_argument("--samples-per-pass", type=positive_int, default=5, help="samples decoded at once (default 5)")
    parser.add_argument("--au-threshold", type=nonnegative_float, default=0.01,
                        help="posterior-mean variance that makes a latent dimension active (default 0.01)")


def _evaluation_texts(args):
    """The sentences of `--eval-file`, checked with the evaluation's settings before any model is loaded."""
    from .training import load_text_dataset

    require(args.num_samples % args.samples_per_pass == 0,
             "--num-samples must be a multiple of --samples-per-pass")
    texts = load_text_dataset(args.eval_file)["text"]
    require(len(texts) >= 2, f"{args.eval_file} needs at least 2 sentences (active units use a variance)")
    return texts


def _evaluation(args, model, processor, texts):
    from .metrics import evaluate_optimus_lm

    return evaluate_optimus_lm(model, processor, texts, au_threshold=args.au_threshold,
                               batch_size=args.batch_size, num_samples=args.num_samples,
                               samples_per_pass=args.samples_per_pass, max_length=_max_length(args, model.config),
                               generator=torch.Generator().manual_seed(args.seed))


def _max_length(args, config):
    # the decoder's latent memory takes position slot 0, so a sentence may use one position less than it has
    limit = min(config.max_encoder_tokens or config.max_decoder_tokens,
                config.decoder.max_position_embeddings - 1)
    require(args.max_length is None or args.max_length <= limit,
             f"--max-length {args.max_length} exceeds what the model's positions allow ({limit})")
    return args.max_length or limit


def _train(args):
    import shutil
    from pathlib import Path

    from accelerate.utils import parse_flag_from_env
    from peft import PeftModel

    from ...hub import Evaluation, write_training_card
    from ...output import check_output_dir
    from ...plots import require_matplotlib
    from ...trainer import print_summary, training_run_output
    from .plots import plot_training_curves
    from .training import (
        DEFAULT_RATIO_INCREASE,
        DEFAULT_RATIO_ZERO,
        finetune_optimus,
        freeze_or_adapt,
        load_text_dataset,
        read_text_lines,
    )

    ratio_zero = DEFAULT_RATIO_ZERO if args.ratio_zero is None else args.ratio_zero
    ratio_increase = DEFAULT_RATIO_INCREASE if args.ratio_increase is None else args.ratio_increase
    check_lora_arguments(args)
    require(args.lora_r is not None or args.lora_on is None, "--lora-on needs --lora-r")
    # refused before training, from the flag `accelerate launch` sets, from which accelerate builds its FSDP plugin
    require(args.lora_r is None or not parse_flag_from_env("ACCELERATE_USE_FSDP"),
            "--lora-r under FSDP: the adapters cannot be merged into sharded weights; train LoRA without FSDP (DDP), "
            "or train the weights in full under FSDP")
    device_settings = training_device_settings(args)
    check_output_dir(args.output_dir, args.overwrite)
    if args.plot:
        require_matplotlib()
    dataset = read_text_lines(args.train_file, args.streaming) if args.streaming or \
        not Path(args.train_file).is_file() else load_text_dataset(args.train_file)
    eval_texts = _evaluation_texts(args) if args.eval_file else None
    model, processor = load_optimus(args.model, args.trust_remote_code)  # float32 weights: Trainer places them
    config = model.config
    for name in ("beta", "dim_target_kl", "fb_mode", "length_weighted_loss"):
        if getattr(args, name) is not None:
            setattr(config, name, getattr(args, name))
    model.beta = config.beta
    max_length = _max_length(args, config)
    freeze = [backbone for backbone in ("encoder", "decoder") if getattr(args, f"freeze_{backbone}")]
    lora_on = [] if args.lora_r is None else [args.lora_on] if args.lora_on in ("encoder", "decoder") \
        else ["encoder", "decoder"]
    trained, trainable = freeze_or_adapt(model, processor, freeze, lora_on, lora_r=args.lora_r or 0,
                                         lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout)
    logger.info(f"training {trainable.trainable:,} of {trainable.total:,} parameters ({trainable.fraction:.2%}): "
                f"{trainable.what}")

    checkpoints = Path(f"{args.output_dir}{CHECKPOINTS_SUFFIX}")
    trainer = finetune_optimus(
        trained, processor, dataset, checkpoints, max_steps=args.max_steps, batch_size=args.batch_size,
        learning_rate=args.learning_rate, n_cycles=args.n_cycles, ratio_zero=ratio_zero,
        ratio_increase=ratio_increase, logging_steps=args.logging_steps, seed=args.seed,
        max_length=max_length, log_to_stderr=True, save_steps=args.save_steps,
        **run_reporting_settings(args), **device_settings,
    )
    if isinstance(trained, PeftModel):
        saved = trained.merge_and_unload()  # the folder holds a plain Optimus model, as without LoRA
    else:
        saved = trained
    # every process evaluates alike: under FSDP each forward pass gathers the shards, a collective
    measured = _evaluation(args, saved.eval(), processor, eval_texts) if eval_texts else {}
    with training_run_output(args.output_dir, trainer, processor, model=saved, overwrite=args.overwrite) as staging:
        if staging is None:  # another process of a distributed run: the main one writes the output
            return
        write_training_card(staging, args.output_dir, args, "hf-ext optimus train", args.model,
                            trainer.state.log_history,
                            [Evaluation("text-generation", Path(args.eval_file).name, measured)] if measured else [],
                            trainable=trainable.as_dict())
        if args.plot:
            plot_training_curves(trainer.state.log_history, staging / "training_curves.png",
                                 title=f"Optimus fine-tuning on {args.train_file}")
    shutil.rmtree(checkpoints, ignore_errors=True)
    print_summary(args.output_dir, trainer, **trainable.as_dict(), **({"eval": measured} if measured else {}))


def _evaluate(args):
    texts = _evaluation_texts(args)
    model, processor = load_optimus(args.model, args.trust_remote_code, **model_loading_settings(args))
    print(json.dumps(_evaluation(args, model, processor, texts)))
