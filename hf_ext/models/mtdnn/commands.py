"""`hf-ext mtdnn ...`: multi-task fine-tuning of MT-DNN models with the original's task mixing, per-task
evaluation and best-checkpoint selection, LoRA, SMART adversarial training, and distillation from teacher ensembles
(MT-DNN-KD)."""

import argparse
import dataclasses
import math

from ...arguments import fraction, nonnegative_float, number_in, positive_float, positive_int
from ...cli_utils import (
    add_device_arguments,
    add_lora_arguments,
    add_model_argument,
    add_run_reporting_arguments,
    check_lora_arguments,
    model_commands,
    run_reporting_settings,
    training_device_settings,
)
from ...errors import HfExtError, require
from . import conversion
from .configuration_mtdnn import SPAN_TASK_TYPES, max_input_length
from .smart import SMART_TASK_TYPES, SmartSettings

# the original train.py's defaults (--epochs, --batch_size, --learning_rate, --warmup, --global_grad_clipping, --seed,
# --max_seq_len)
DEFAULT_EPOCHS = 5
DEFAULT_BATCH_SIZE = 8
DEFAULT_LEARNING_RATE = 5e-5
DEFAULT_WARMUP = 0.1
DEFAULT_MAX_GRAD_NORM = 1.0
DEFAULT_SEED = 2018
DEFAULT_MAX_LENGTH = 512
DEFAULT_SAVE_STEPS = 500  # --streaming
CHECKPOINTS_SUFFIX = "-checkpoints"  # OUTPUT_DIR-checkpoints/: a streamed run's Trainer checkpoints, until it ends


def register(commands: argparse._SubParsersAction) -> None:
    """The `hf-ext mtdnn` commands."""
    tools = model_commands(commands, conversion.CONVERT_NAME, "MT-DNN multi-task training and distillation",
                           "Fine-tune an MT-DNN model on several tasks at once (a folder or a Hub "
                           "repo id), or distil teacher models into it.")
    parser = tools.add_parser("train", help="multi-task fine-tuning with the original's task mixing",
                              description="Multi-task fine-tuning: every step trains one task's batch, tasks mixed as "
                              "the original's sampler does; per-task metrics (GLUE's, entity F1, SQuAD's) on the "
                              "--eval data; saves the model (or the LoRA adapter with the heads) and the tokenizer.")
    _add_training_arguments(parser)
    _add_streaming_arguments(parser)
    parser.set_defaults(handler=_train)
    parser = tools.add_parser("distill", help="train a student on hard labels plus the teachers' soft targets",
                              description="Knowledge distillation (MT-DNN-KD): the soft target of every training row "
                              "is the mean of the teachers' class probabilities; the student trains on the hard "
                              "labels plus the distillation term. Otherwise as `train`.")
    _add_training_arguments(parser)
    parser.add_argument("--teacher", action="append", required=True, metavar="MODEL",
                        help="teacher model folder or Hub repo id holding the trained tasks (repeat for an ensemble)")
    parser.add_argument("--kd-loss", choices=("soft_ce", "mse"), default="soft_ce",
                        help="distillation term: soft cross-entropy (the paper's, default) or the original's MSE "
                        "between the head's output and the soft targets")
    parser.add_argument("--kd-weight", type=positive_float, default=1.0,
                        help="weight of the distillation term added to the task loss (default 1.0)")
    parser.set_defaults(handler=_distill, streaming=False, task_probabilities=[], save_steps=None)


def _add_training_arguments(parser):
    add_model_argument(parser, "MT-DNN model folder or Hub repo id; with --task-def, an encoder (BERT, RoBERTa, "
                       "DeBERTa, ELECTRA, ModernBERT, ...)")
    add_device_arguments(parser, training=True)
    parser.add_argument("--train", action="append", required=True, metavar="TASK=PATH",
                        help="training data of a task: a GLUE .tsv file or the original's preprocessed .json lines; "
                        "for sequence labeling a CoNLL file (.conll, .txt, .bio, .iob) or the original's Seqence .tsv; "
                        "for span tasks SQuAD .json or .jsonl (repeat per task; the first task is the main task of "
                        "--mix-opt 1 and --ratio)")
    parser.add_argument("--eval", action="append", default=[], metavar="TASK[:NAME]=PATH",
                        help="evaluation data of a task, reported as eval_TASK[_NAME]_<metric> (repeat, e.g. "
                        "mnli:matched=... and mnli:mismatched=...)")
    parser.add_argument("--output-dir", required=True, help="folder for the trained model (written atomically)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output-dir")
    parser.add_argument("--task-def", help="the original's task-definition YAML: start from the encoder MODEL with "
                        "new heads for the --train and --eval tasks")
    parser.add_argument("--layout", action="append", default=[], metavar="TASK=GLUE_TASK",
                        help="GLUE TSV layout of a task not named after a GLUE task (e.g. snli=mnli)")
    parser.add_argument("--tokenizer", help="tokenizer folder or Hub repo id for text data (default: MODEL's)")
    parser.add_argument("--max-length", type=number_in(int, 2), default=DEFAULT_MAX_LENGTH,
                        help=f"truncate tokenized text rows (span tasks: windows) to this many tokens (default "
                        f"{DEFAULT_MAX_LENGTH}, capped at what the model's positions hold)")
    parser.add_argument("--doc-stride", type=number_in(int, 0),
                        help="span tasks: tokens shared by two windows of a long context (default 128, or half "
                        "--max-length where that is less)")
    parser.add_argument("--epochs", type=positive_float, default=DEFAULT_EPOCHS,
                        help=f"training epochs (default {DEFAULT_EPOCHS})")
    parser.add_argument("--max-steps", type=positive_int, help="optimizer steps (overrides --epochs)")
    parser.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE,
                        help=f"rows per training batch and process (default {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--eval-batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE,
                        help=f"rows per evaluation batch (default {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--learning-rate", type=positive_float, default=DEFAULT_LEARNING_RATE,
                        help=f"peak learning rate (default {DEFAULT_LEARNING_RATE})")
    parser.add_argument("--optimizer", choices=("adamw", "adamax"), default="adamw",
                        help="adamw (Trainer's, default) or adamax (the original's, as the paper trains)")
    parser.add_argument("--warmup", type=fraction, default=DEFAULT_WARMUP,
                        help=f"share of the steps warming the learning rate up (default {DEFAULT_WARMUP})")
    parser.add_argument("--max-grad-norm", type=nonnegative_float, default=DEFAULT_MAX_GRAD_NORM,
                        help=f"gradient clipping norm (default {DEFAULT_MAX_GRAD_NORM})")
    parser.add_argument("--mix-opt", type=int, choices=(0, 1), default=0,
                        help="0: shuffle all tasks' batches; 1: the other tasks first, the main task last")
    parser.add_argument("--ratio", type=nonnegative_float, default=0.0,
                        help="> 0: per epoch, all main-task batches plus this ratio of them drawn from the other "
                        "tasks (default 0: every batch of every task)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help=f"random seed of the task mixing and training (default {DEFAULT_SEED})")
    parser.add_argument("--eval-steps", type=positive_int, help="evaluate every N steps (default: after each epoch)")
    parser.add_argument("--metric-for-best-model", metavar="NAME",
                        help="keep the checkpoint best on this evaluation metric, e.g. mnli_matched_accuracy or "
                        "stsb_pearson (higher is better, lower for *_loss)")
    add_lora_arguments(parser, "train LoRA adapters of this rank on the encoder instead of all weights; the heads "
                       "are trained in full and saved with the adapter")
    parser.add_argument("--logging-steps", type=positive_int, default=50, help="steps per logged average (default 50)")
    smart = parser.add_argument_group("SMART adversarial training (the original's --adv_* options and defaults)")
    smart.add_argument("--adv-train", action="store_true",
                       help="add the adversarial loss of a perturbation of the embedding output to every step")
    defaults = {field.name: field.default for field in dataclasses.fields(SmartSettings)}
    for name, kind, help_text in SMART_OPTIONS:
        smart.add_argument(f"--adv-{name.replace('_', '-')}", type=kind,
                           help=f"{help_text} (default {defaults[name]}; needs --adv-train)")
    add_run_reporting_arguments(parser)


def _add_streaming_arguments(parser):
    streaming = parser.add_argument_group("streamed training data, for data larger than memory (docs/scale.md)")
    streaming.add_argument("--streaming", action="store_true",
                           help="read each --train PATH as a stream while training, tokenizing text as it is read: "
                           "a file, a folder of shards or a glob in one of --train's formats (GLUE .tsv, CoNLL, "
                           "Seqence .tsv, SQuAD .json/.jsonl, the original's preprocessed .json lines; JSON also "
                           "gzipped), or a Hub dataset id; each process reads its own part; every batch holds one "
                           "task, the task drawn by --task-probabilities (or --ratio); needs --max-steps")
    streaming.add_argument("--task-probabilities", action="append", default=[], metavar="TASK=P",
                           help="with --streaming: the share of each task's batches (name every --train task once; "
                           "normalised to sum to 1). Default: proportional to the tasks' sizes where every source "
                           "records them (a Hub dataset's split sizes), else equal shares; --ratio R instead gives "
                           "the first task 1/(1+R) and the others the rest")
    streaming.add_argument("--save-steps", type=positive_int,
                           help=f"with --streaming: checkpoint every N steps (default {DEFAULT_SAVE_STEPS}), with "
                           f"each process's stream position, into OUTPUT_DIR{CHECKPOINTS_SUFFIX}/; running the same "
                           "command again resumes from the newest complete checkpoint there and reads on where it "
                           "stopped; the folder is removed when the run ends")


# SmartSettings' fields as the original train.py's --adv_* options (defaults are the fields'): field, type, help
SMART_OPTIONS = (
    ("alpha", nonnegative_float, "weight of the adversarial loss"),
    ("k", positive_int, "ascent steps on the noise"),
    ("step_size", nonnegative_float, "size of each ascent step"),
    ("noise_var", nonnegative_float, "scale of the initial Gaussian noise"),
    ("epsilon", nonnegative_float, "added to the norm when normalising the noise"),
    ("p_norm", str, "noise normalisation: inf, l2 or l1"),
    ("norm_level", int, "0: normalise per token; 1: per sentence"),
)


def _smart_settings(args):
    """`SmartSettings` from --adv-train and the --adv-* options (None without --adv-train)."""
    given = {name: getattr(args, f"adv_{name}") for name, *_ in SMART_OPTIONS
             if getattr(args, f"adv_{name}") is not None}
    if not args.adv_train:
        require(not given, f"--adv-{next(iter(given), '').replace('_', '-')} needs --adv-train")
        return None
    try:
        return SmartSettings(**given)
    except ValueError as error:
        name, _, rest = str(error).partition(" ")  # "adv_p_norm must be ..." -> "--adv-p-norm must be ..."
        raise HfExtError(f"--{name.replace('_', '-')} {rest}") from None


def _pairs(values, option):
    """`KEY=VALUE` arguments as (key, value) pairs."""
    pairs = []
    for value in values:
        key, sep, rest = value.partition("=")
        require(sep and key and rest, f"{option} takes KEY=VALUE, got {value!r}")
        pairs.append((key, rest))
    return pairs


def _check_arguments(args):
    check_lora_arguments(args)
    require(args.eval or not (args.metric_for_best_model or args.eval_steps),
             "--metric-for-best-model and --eval-steps need --eval data")
    train = _pairs(args.train, "--train")
    names = [task for task, _ in train]
    require(len(set(names)) == len(names), "--train names each task once")
    evaluation = []
    for key, path in _pairs(args.eval, "--eval"):
        task, _, split = key.partition(":")
        evaluation.append((task, f"{task}_{split}" if split else task, path))
    eval_names = [name for _, name, _ in evaluation]
    require(len(set(eval_names)) == len(eval_names), "--eval names each TASK[:NAME] once")
    return train, evaluation, dict(_pairs(args.layout, "--layout"))


def _task_probabilities(args, tasks):
    """`{task: weight}` of --task-probabilities (None without it), after the streaming options are checked against
    each other."""
    if not args.streaming:
        require(not args.task_probabilities, "--task-probabilities needs --streaming (map-style runs mix their tasks "
                "by --mix-opt and --ratio)")
        require(args.save_steps is None, "--save-steps needs --streaming (a map-style run keeps no checkpoints "
                "between runs)")
        return None
    require(args.max_steps, "--streaming needs --max-steps (a stream has no length)")
    require(args.mix_opt == 0, "--mix-opt 1 orders the batches of an epoch (the main task last), a stream has no "
            "epochs: give --ratio or --task-probabilities")
    require(not args.metric_for_best_model, "--metric-for-best-model keeps the best checkpoint of a map-style run, "
            "not of a --streaming one")
    if not args.task_probabilities:
        return None
    require(args.ratio == 0, "--task-probabilities and --ratio both set the tasks' shares: give one")
    pairs = _pairs(args.task_probabilities, "--task-probabilities")
    named = [task for task, _ in pairs]
    require(sorted(named) == sorted(tasks), f"--task-probabilities names each --train task once "
            f"({', '.join(tasks)}), got {', '.join(named)}")
    weights = {}
    for task, value in pairs:
        try:
            weights[task] = float(value)
        except ValueError:
            raise HfExtError(f"--task-probabilities {task}={value}: not a number") from None
        require(math.isfinite(weights[task]) and weights[task] > 0,
                f"--task-probabilities {task}={value}: must be a finite number > 0")
    return weights


def _load_model(args, tasks):
    """The model to train: an MT-DNN model, or (--task-def) an encoder of any type with new heads for `tasks`."""
    from transformers import AutoModel

    from ...loading import load_config, loading
    from . import MTDNNConfig, MTDNNModel
    from .configuration_mtdnn import check_encoder
    from .task_defs import config_from_task_def_yaml

    trust = args.trust_remote_code
    if args.task_def is None:
        load_config(args.model, MTDNNConfig.model_type, "an MT-DNN model", trust,
                    hint=" (pass --task-def to put new heads on an encoder)")
        with loading("a model", args.model):
            return AutoModel.from_pretrained(args.model, trust_remote_code=trust)
    config = load_config(args.model, trust_remote_code=trust)
    require(config.model_type != MTDNNConfig.model_type, f"{args.model} is an MT-DNN model already: train it "
            "without --task-def (its heads are its tasks)")
    try:
        check_encoder(config)
    except ValueError as error:
        raise HfExtError(f"{args.model}: {error}") from None
    try:
        mtdnn = config_from_task_def_yaml(args.task_def, config, task_names=tasks)
    except ValueError as error:
        raise HfExtError(str(error)) from None
    with loading("a model", args.model):
        return MTDNNModel.from_pretrained_encoder(args.model, mtdnn, trust_remote_code=trust)


def _load_tokenizer(args):
    from transformers import AutoTokenizer

    source = args.tokenizer or args.model
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError):
        hint = "" if args.tokenizer else " (pass --tokenizer)"
        raise HfExtError(f"text data needs a tokenizer, none loads from {source}{hint}") from None


def _load_teachers(args, tasks):
    from transformers import AutoModel

    from ...loading import loading

    teachers = []
    for source in args.teacher:
        with loading("a teacher model", source):
            # on the training's device, where their soft targets are computed (in float32, as the student trains)
            teacher = AutoModel.from_pretrained(source, trust_remote_code=args.trust_remote_code,
                                                device_map=args.device)
        missing = [task for task in tasks if task not in getattr(teacher.config, "task_names", [])]
        require(not missing, f"teacher {source} has no task {', '.join(missing)}")
        teachers.append(teacher)
    return teachers


def _train(args):
    _run(args)


def _distill(args):
    _run(args, distill=True)


# the Hub's task of each MT-DNN task type, as a card's evaluation results name it
HUB_TASKS = {"sequence_labeling": "token-classification", "span_classification": "question-answering",
             "span_classification_yn": "question-answering"}


def _evaluations(config, eval_files, metrics):
    """What a card records of a run's evaluation: each `--eval` file's metrics, on GLUE's Hub dataset where the task
    is a GLUE task."""
    from pathlib import Path

    from ...glue import glue_benchmark
    from ...hub import Evaluation
    from .training import task_metric_names

    evaluations = []
    for task, name, path in eval_files:
        spec = config.task(task)
        measured = {metric: metrics[f"eval_{name}_{metric}"] for metric in task_metric_names(spec)
                    if f"eval_{name}_{metric}" in metrics}
        evaluations.append(Evaluation(HUB_TASKS.get(spec["type"], "text-classification"),
                                      f"{name} ({Path(path).name})", measured, glue_benchmark(task),
                                      split=name.removeprefix(f"{task}_") if name != task else None))
    return evaluations


def _run(args, distill=False):
    import shutil
    from pathlib import Path

    from ...hub import write_training_card
    from ...lora import add_lora
    from ...output import check_output_dir
    from ...streaming import StreamReadError
    from ...trainer import print_summary, shared_temporary_dir, training_arguments, training_run_output
    from .data import load_task_files, read_task_stream, stream_corpus_error, stream_layout
    from .training import task_metric_names, train_mtdnn

    device_settings = training_device_settings(args)
    train_files, eval_files, layouts = _check_arguments(args)
    task_probabilities = _task_probabilities(args, [task for task, _ in train_files])
    smart = _smart_settings(args)
    check_output_dir(args.output_dir, args.overwrite)
    tasks = list(dict.fromkeys([task for task, _ in train_files] + [task for task, _, _ in eval_files]))
    model = _load_model(args, tasks)
    config = model.config
    unknown = sorted(set(layouts) - set(tasks))
    require(not unknown, f"--layout names task(s) {', '.join(unknown)} without --train or --eval data")
    try:
        types = {task: config.task(task)["type"] for task in tasks}
    except ValueError as error:
        raise HfExtError(str(error)) from None
    if smart is not None:
        unsupported = [f"{task} ({types[task]})" for task, _ in train_files if types[task] not in SMART_TASK_TYPES]
        require(not unsupported, f"--adv-train covers {', '.join(SMART_TASK_TYPES)} tasks (as the original's "
                f"SmartPerturbation), not {', '.join(unsupported)}")
    tokenizer = None
    # streams of the original's preprocessed JSON lines are tokenized already; any other stream is text
    streamed_text = args.streaming and any(stream_layout(path, config, task)[0] != "json" for task, path in train_files)
    files = ([] if args.streaming else list(train_files)) + [(task, path) for task, _, path in eval_files]
    if streamed_text or any(not path.lower().endswith((".json", ".jsonl")) or types[task] in SPAN_TASK_TYPES
                            for task, path in files):  # text to tokenize
        tokenizer = _load_tokenizer(args)
    max_length = min(args.max_length, max_input_length(config.encoder) or args.max_length)
    train, evaluation = load_task_files(config, [] if args.streaming else train_files, eval_files, tokenizer,
                                        max_length, layouts, args.doc_stride)
    if args.streaming:
        train = {task: read_task_stream(path, config, task, tokenizer, max_length, layouts.get(task), args.doc_stride)
                 for task, path in train_files}
    try:
        known = [f"{name}_{metric}" for task, name, _ in eval_files
                 for metric in ["loss", *task_metric_names(config.task(task))]]
    except ValueError as error:
        raise HfExtError(str(error)) from None
    require(args.metric_for_best_model in [None, *known], f"--metric-for-best-model {args.metric_for_best_model} "
            f"is not an evaluation metric of this run ({', '.join(known)})")
    teachers = _load_teachers(args, list(train)) if distill else ()
    if args.lora_r:
        model = add_lora(model, r=args.lora_r, lora_alpha=args.lora_alpha or 2 * args.lora_r,
                         lora_dropout=args.lora_dropout)

    # a stream has no epochs: evaluation every --eval-steps, and after training
    strategy = ("steps" if args.eval_steps else "no" if args.streaming else "epoch") if evaluation else "no"
    checkpoints = Path(f"{args.output_dir}{CHECKPOINTS_SUFFIX}")
    saving = {"save_strategy": "steps", "save_steps": args.save_steps or DEFAULT_SAVE_STEPS, "save_total_limit": 2} \
        if args.streaming else {"save_strategy": strategy if args.metric_for_best_model else "no",
                                "save_total_limit": 1}
    training_args = training_arguments(
        checkpoints, num_train_epochs=args.epochs, max_steps=args.max_steps or -1,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.eval_batch_size,
        learning_rate=args.learning_rate, warmup_steps=args.warmup, max_grad_norm=args.max_grad_norm,
        logging_steps=args.logging_steps, seed=args.seed, eval_strategy=strategy, eval_steps=args.eval_steps,
        load_best_model_at_end=bool(args.metric_for_best_model), metric_for_best_model=args.metric_for_best_model,
        **saving, **run_reporting_settings(args), **device_settings)
    # a map-style run keeps its checkpoints (for the best one) in a scratch folder that every process must share, as
    # only the main one saves weights and all load the best back; made once the arguments set up the processes
    with shared_temporary_dir() as scratch:
        if not args.streaming:
            training_args.output_dir = scratch
        try:
            trainer = train_mtdnn(model, train, evaluation, training_args, teachers=teachers,
                                  teacher_batch_size=args.eval_batch_size, log_to_stderr=True, mix_opt=args.mix_opt,
                                  ratio=args.ratio, optimizer_name=args.optimizer, smart=smart,
                                  task_probabilities=task_probabilities,
                                  **({"kd_loss": args.kd_loss, "kd_weight": args.kd_weight} if distill else {}))
        except StreamReadError as error:  # name the shard and line that failed
            raise StreamReadError(stream_corpus_error(train_files, config, error.error), error.kept) from None
        del teachers
        metrics = trainer.evaluate() if evaluation else {}  # every process: a collective
        # LoRA: the adapter and the heads
        with training_run_output(args.output_dir, trainer, tokenizer, metrics, model=model,
                                 overwrite=args.overwrite) as staging:
            if staging is None:  # another process of a distributed run: the main one writes the output
                return
            write_training_card(staging, args.output_dir, args, f"hf-ext mtdnn {'distill' if distill else 'train'}",
                                args.model, trainer.state.log_history, _evaluations(config, eval_files, metrics))
    if args.streaming:
        shutil.rmtree(checkpoints, ignore_errors=True)
    print_summary(args.output_dir, trainer, best_metric=trainer.state.best_metric,
                  eval={key: value for key, value in metrics.items() if not key.endswith(("_runtime", "_per_second"))})
