"""`hf-ext ernie2 ...`: ERNIE 2.0 continual multi-task pre-training, export of its encoder to a plain `ernie` folder,
and GLUE fine-tuning."""

import argparse
import json

from ...arguments import nonnegative_int, number_in, positive_float, positive_int
from ...cli_utils import (
    add_device_arguments,
    add_model_argument,
    add_run_reporting_arguments,
    model_commands,
    run_reporting_settings,
    training_device_settings,
)
from ...errors import require
from . import conversion


def register(commands: argparse._SubParsersAction) -> None:
    """The `hf-ext ernie2` commands."""
    tools = model_commands(commands, conversion.CONVERT_NAME, "ERNIE 2.0 continual pre-training and GLUE fine-tuning",
                           "Continue ERNIE 2.0 pre-training stage by stage, export the result, "
                           "fine-tune it on GLUE tasks.")
    # the training modules (transformers.Trainer, datasets) are imported only when a tool runs

    parser = tools.add_parser(
        "pretrain", help="continual multi-task pre-training from raw documents",
        description="Pre-train MODEL (a converted ERNIE folder, an ERNIE 2.0 pre-training folder, or a BERT, MiniLM, "
        "ELECTRA, RoBERTa, XLM-RoBERTa or CamemBERT encoder, whose weights start ERNIE's) stage by stage on "
        "the tasks of the schedule. OUTPUT_DIR holds one folder per stage; running the same command again resumes "
        "where it stopped. At the end OUTPUT_DIR/ernie is a plain transformers ernie folder for fine-tuning.")
    add_model_argument(parser, "converted ERNIE folder, ERNIE 2.0 pre-training folder, or Hub repo id")
    parser.add_argument("--documents", required=True, help="raw documents: .jsonl ({\"paragraphs\": [[sentence, ...], "
                        "...], \"entities\": [...], \"phrases\": [...]}) or text (a sentence per line, a blank line "
                        "between paragraphs, two between documents); or JSON-lines shards: a folder, a glob or a Hub "
                        "dataset id")
    parser.add_argument("--streaming", action="store_true",
                        help="read --documents (JSON lines: a file, a folder of shards, a glob or a Hub dataset id) "
                        "as a stream while training, for corpora larger than memory; without it a folder, glob or "
                        "Hub id is read memory-mapped")
    parser.add_argument("--stages", help="schedule YAML/JSON (default: the paper's four stages, see "
                        "`hf-ext ernie2 schedule`)")
    parser.add_argument("--output-dir", required=True, help="the run's folder (resumed if it holds this run)")
    parser.add_argument("--discourse-pairs", help="discourse-relation pairs, JSON lines {sentence1, sentence2, label}")
    parser.add_argument("--ir-pairs", help="IR-relevance pairs, JSON lines {sentence1 (query), sentence2 (title), "
                        "label: 0 strong, 1 weak, 2 irrelevant}")
    parser.add_argument("--entity-lexicon", help="entities to mask whole, one per line")
    parser.add_argument("--phrase-lexicon", help="phrases to mask whole, one per line")
    parser.add_argument("--no-span-heuristics", action="store_true",
                        help="mask only lexicon and document spans, not capitalised runs and content-word runs")
    parser.add_argument("--mask-probability", type=number_in(float, 0, 1, low_open=True, high_open=True), default=0.15,
                        help="share of tokens to predict (0.15)")
    parser.add_argument("--max-length", type=number_in(int, 8), default=128, help="tokens per example (default 128)")
    parser.add_argument("--max-reorder-segments", type=int,
                        help="m of sentence reordering, when MODEL is a plain ERNIE folder (default 3: 9 classes)")
    parser.add_argument("--num-discourse-relations", type=int,
                        help="discourse-relation classes, when MODEL is a plain ERNIE folder (default 3)")
    _training_arguments(parser, batch_size=8, learning_rate=5e-5)
    parser.add_argument("--warmup-steps", type=nonnegative_int, default=0,
                        help="warm-up steps of every stage (default 0)")
    parser.add_argument("--save-steps", type=positive_int, default=1000, help="checkpoint every N steps (default 1000)")
    parser.add_argument("--save-total-limit", type=positive_int, default=2,
                        help="checkpoints kept per stage (default 2)")
    parser.set_defaults(handler=_pretrain)

    parser = tools.add_parser("schedule", help="print the paper's continual schedule as YAML",
                              description="Print the default schedule (the paper's four stages) as YAML, to edit "
                              "and pass to `hf-ext ernie2 pretrain --stages`.")
    parser.set_defaults(handler=_schedule)

    parser = tools.add_parser("export", help="save the encoder of a pre-training folder as a plain ernie folder",
                              description="Write the encoder (with task embeddings) and MLM head of an ERNIE 2.0 "
                              "pre-training folder (a stage's model/) as a transformers ernie folder.")
    add_model_argument(parser, "ERNIE 2.0 pre-training folder or Hub repo id")
    parser.add_argument("out", help="folder to write (must not exist unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    parser.set_defaults(handler=_export)

    parser = tools.add_parser(
        "finetune", help="fine-tune an ernie folder on a GLUE task and print its metrics",
        description="Fine-tune a plain ernie folder with transformers' ErnieForSequenceClassification on GLUE TSV "
        "files (the task's own layout), feeding --task-id as the task id; print the GLUE metrics of --eval-file as "
        "JSON.")
    add_model_argument(parser, "ernie folder (converted, or OUTPUT_DIR/ernie of pretrain) or Hub repo id")
    parser.add_argument("--task", required=True, help="GLUE task: CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI")
    parser.add_argument("--train-file", required=True, help="the task's train.tsv")
    parser.add_argument("--eval-file", help="the task's dev.tsv (dev_matched.tsv for MNLI)")
    parser.add_argument("--output-dir", required=True, help="folder for the fine-tuned model (written atomically)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output-dir")
    parser.add_argument("--task-id", type=nonnegative_int, default=0,
                        help="task id of every token (default 0, as the original)")
    parser.add_argument("--max-length", type=number_in(int, 8), default=128, help="tokens per pair (default 128)")
    parser.add_argument("--epochs", type=positive_float, default=3.0, help="training epochs (default 3)")
    parser.add_argument("--max-steps", type=positive_int, help="optimizer steps (overrides --epochs)")
    _training_arguments(parser, batch_size=32, learning_rate=2e-5)
    parser.set_defaults(handler=_finetune)


def _training_arguments(parser, batch_size, learning_rate):
    parser.add_argument("--batch-size", type=positive_int, default=batch_size,
                        help=f"rows per batch (default {batch_size})")
    parser.add_argument("--gradient-accumulation-steps", type=positive_int, default=1,
                        help="batches per step (default 1)")
    parser.add_argument("--learning-rate", type=positive_float, default=learning_rate,
                        help=f"peak learning rate (default {learning_rate:g})")
    parser.add_argument("--logging-steps", type=positive_int, default=50, help="steps per logged average (default 50)")
    parser.add_argument("--seed", type=int, default=42, help="random seed (default 42)")
    add_run_reporting_arguments(parser)
    add_device_arguments(parser, training=True)



def _training_args(args, output_dir, **settings):
    from ...trainer import training_arguments

    return training_arguments(
        output_dir, per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps, learning_rate=args.learning_rate,
        logging_steps=args.logging_steps, seed=args.seed, **run_reporting_settings(args),
        **training_device_settings(args), **settings)


def _pretrain(args):
    from pathlib import Path

    from ...hub import write_training_card
    from ...loading import load_tokenizer
    from ...output import atomic_output_dir
    from ...streaming import StreamReadError, corpus_error, data_files
    from .data import PAIR_TASKS, load_documents, pretraining_datasets, read_documents, task_streams
    from .schedule import PAPER_SCHEDULE, ContinualSchedule
    from .training import continual_pretraining, load_pretraining_model

    out = Path(args.output_dir)
    require(not out.exists() or out.is_dir(), f"output {out} exists and is not a folder")
    # first: a --device or --dtype Trainer cannot use is refused before the model loads
    training_args = _training_args(args, out, warmup_steps=args.warmup_steps, save_steps=args.save_steps,
                                   save_total_limit=args.save_total_limit, save_strategy="steps")
    schedule = ContinualSchedule.from_file(args.stages) if args.stages else PAPER_SCHEDULE
    pair_files = {"discourse_relation": args.discourse_pairs, "ir_relevance": args.ir_pairs}
    for task in PAIR_TASKS:
        require(task not in schedule.tasks or pair_files[task], f"the schedule trains {task}: give its labelled "
                 f"pairs with --{'discourse-pairs' if task == 'discourse_relation' else 'ir-pairs'}")
    if args.streaming or not Path(args.documents).is_file():
        documents = read_documents(args.documents, streaming=args.streaming)
    else:
        documents = load_documents(args.documents)
    settings = {"max_reorder_segments": args.max_reorder_segments,
                "num_discourse_relations": args.num_discourse_relations}
    model = load_pretraining_model(args.model, {k: v for k, v in settings.items() if v is not None},
                                   trust_remote_code=args.trust_remote_code)
    config = model.config
    require(args.max_length <= config.max_position_embeddings,
            f"--max-length {args.max_length} exceeds the model's {config.max_position_embeddings} positions")
    tokenizer = load_tokenizer(args.model, trust_remote_code=args.trust_remote_code)
    try:
        datasets = (task_streams if args.streaming else pretraining_datasets)(
            tokenizer, config, schedule, documents, pair_files, entity_lexicon=args.entity_lexicon,
            phrase_lexicon=args.phrase_lexicon, span_heuristics=not args.no_span_heuristics,
            max_length=args.max_length,
            mask_probability=args.mask_probability, seed=args.seed)
        model, histories = continual_pretraining(model, schedule, datasets, training_args,
                                                 processing_class=tokenizer, log_to_stderr=True)
    except StreamReadError as error:  # name the shard and line that failed
        files = data_files(args.documents, "documents")
        raise (StreamReadError(corpus_error(files, "documents", error.error), error.kept) if files else error) \
            from None
    if not training_args.should_save:  # another process of a distributed run: the main one writes the result
        return
    with atomic_output_dir(out / "ernie", overwrite=True) as staging:
        model.save_ernie_pretrained(staging)
        tokenizer.save_pretrained(staging)
        write_training_card(staging, out / "ernie", args, "hf-ext ernie2 pretrain", args.model,
                            [logged for history in histories for logged in history])
    final = {key: value for key, value in histories[-1][-1].items() if key in ("train_loss", "step")}
    print(json.dumps({"output_dir": str(out), "ernie": str(out / "ernie"),
                      "stage_models": [str(out / f"stage-{k + 1}" / "model") for k in range(len(histories))],
                      **final}))


def _schedule(args):
    import yaml

    from .schedule import PAPER_SCHEDULE

    print(yaml.safe_dump(PAPER_SCHEDULE.to_dict(), sort_keys=False), end="")


def _export(args):
    from ...errors import HfExtError
    from ...loading import load_config, load_tokenizer, loading
    from ...output import atomic_output_dir, check_output_dir
    from . import Ernie2ForPreTraining

    check_output_dir(args.out, args.overwrite)
    load_config(args.model, Ernie2ForPreTraining.config_class.model_type, "an ERNIE 2.0 pre-training model",
                args.trust_remote_code)
    with loading("an ERNIE 2.0 pre-training model", args.model):
        model = Ernie2ForPreTraining.from_pretrained(args.model)
    with atomic_output_dir(args.out, args.overwrite) as staging:
        model.save_ernie_pretrained(staging)
        try:
            load_tokenizer(args.model, trust_remote_code=args.trust_remote_code).save_pretrained(staging)
        except HfExtError:
            pass  # a folder saved without its tokenizer: the encoder alone is still useful
    print(args.out)


def _finetune(args):
    import tempfile
    from pathlib import Path

    from ...glue import glue_benchmark
    from ...hub import Evaluation, trainer_metrics, write_training_card
    from ...output import check_output_dir
    from ...trainer import print_summary, training_run_output
    from .training import finetune_glue

    check_output_dir(args.output_dir, args.overwrite)
    with tempfile.TemporaryDirectory() as scratch:
        training_args = _training_args(args, scratch, num_train_epochs=args.epochs, max_steps=args.max_steps or -1,
                                       eval_strategy="no")
        trainer, metrics = finetune_glue(args.model, args.task, args.train_file, training_args,
                                         eval_file=args.eval_file, task_id=args.task_id, max_length=args.max_length,
                                         log_to_stderr=True, trust_remote_code=args.trust_remote_code)
        # under torchrun, every process gathers the weights and the main one alone writes the folder
        with training_run_output(args.output_dir, trainer, trainer.processing_class,
                                 overwrite=args.overwrite) as staging:
            if staging is None:
                return
            evaluations = [Evaluation("text-classification", f"{args.task} ({Path(args.eval_file).name})",
                                      trainer_metrics(metrics), glue_benchmark(args.task))] if metrics else []
            write_training_card(staging, args.output_dir, args, "hf-ext ernie2 finetune", args.model,
                                trainer.state.log_history, evaluations)
    print_summary(args.output_dir, **metrics)
