"""Multi-task training of MT-DNN with the transformers `Trainer`: per-task losses and metrics (GLUE's; entity F1 for
sequence labeling; SQuAD's exact match and F1 for span tasks), the original's
task mixing (`data.py`), knowledge distillation from teacher ensembles (MT-DNN-KD, `distillation.py`) and LoRA on
the encoder, and `train_mtdnn`, the run of `hf-ext mtdnn train` and `hf-ext mtdnn distill`.
"""

from collections.abc import Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader
from transformers import TrainingArguments
from transformers.trainer_utils import EvalLoopOutput
from transformers.utils import ModelOutput, logging

from ...errors import HfExtError
from ...lora import unwrap
from ...metrics import load_metric
from ...streaming import StreamReadError, is_stream, split_for_process, stream_dataloader, train_keeping_progress
from ...trainer import TermLoggingTrainer, last_complete_checkpoint, send_logs_to_stderr, training_arguments
from .configuration_mtdnn import SPAN_TASK_TYPES, TOKEN_TASK_TYPES
from .data import (
    MTDNNCollator,
    MultiTaskBatchSampler,
    MultiTaskDataset,
    StreamedBatchCollator,
    mixed_task_batches,
    stream_task_probabilities,
)
from .distillation import KD_LOSSES, add_soft_labels, distillation_loss
from .modeling_mtdnn import MTDNNModel
from .smart import SMART_TASK_TYPES, SmartSettings, adversarial_loss
from .token_tasks import sequence_labeling_references, span_answers

if TYPE_CHECKING:  # datasets and peft are imported only when used
    from datasets import Dataset, IterableDataset
    from peft import PeftModel

logger = logging.get_logger(__name__)

OPTIMIZERS = ("adamw", "adamax")  # Trainer's default, and the original's (train.py --optimizer adamax)
# what evaluation reads of a span task's windows besides the model's inputs (`token_tasks.encode_squad_examples`)
SPAN_COLUMNS = ("example_id", "offset_mapping", "context", "answers")
SEQUENCE_LABELING_METRICS = ("precision", "recall", "f1", "accuracy")
SPAN_METRICS = ("exact_match", "f1")


@cache
def _metric(name, config_name=None):
    return load_metric(name, config_name=config_name)


def task_metric_names(spec: dict[str, Any]) -> list[str]:
    """The metric names a task's evaluation reports: GLUE's (`accuracy`, `f1`, ...) from its `metrics` (the
    original's names); entity `precision`, `recall`, `f1` and token `accuracy` for sequence labeling; `exact_match`
    and `f1` (percent) for span tasks (SQuAD v2.0 adds them over the answerable and unanswerable questions)."""
    from ...metrics.glue.glue import metric_names  # plain functions; the evaluate module is loaded by path

    if spec["type"] == "sequence_labeling":
        return list(SEQUENCE_LABELING_METRICS)
    if spec["type"] in SPAN_TASK_TYPES:
        return list(SPAN_METRICS)
    try:
        return metric_names(spec["metrics"])
    except ValueError as error:
        raise ValueError(f"task {spec['name']}: {error}") from None


def task_predictions(spec: dict[str, Any], predictions: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """A task's predictions from the gathered head outputs of an evaluation: class ids, scores, or for ranking the
    index of the best candidate of each group."""
    outputs = predictions if isinstance(predictions, (tuple, list)) else (predictions,)
    if spec["type"] == "ranking":
        return np.asarray(outputs[1]).argmax(-1)  # group_logits, after logits
    logits = np.asarray(outputs[0])
    return logits[:, 0] if spec["type"] == "regression" else logits.argmax(-1)


def evaluate_task(spec: dict[str, Any], predictions: np.ndarray | Sequence[np.ndarray],
                  references: np.ndarray | Sequence[np.ndarray], windows: Any = None) -> dict[str, float]:
    """The task's metrics (`task_metric_names`) of gathered predictions (the head outputs; `logits` first) against
    the references: GLUE's, seqeval's entity scores of the labelled words (`token_tasks.sequence_labeling_references`)
    or SQuAD's over the questions (`token_tasks.span_answers`; `windows` holds the evaluated windows' `example_id`,
    `offset_mapping`, `context` and `answers`, in order)."""
    outputs = predictions if isinstance(predictions, (tuple, list)) else (predictions,)
    if spec["type"] == "sequence_labeling":
        predicted, gold = sequence_labeling_references(spec, outputs[0], np.asarray(references))
        scores = _metric("seqeval").compute(predictions=predicted, references=gold)
        return {name: scores[f"overall_{name}"] for name in SEQUENCE_LABELING_METRICS}
    if spec["type"] in SPAN_TASK_TYPES:
        if windows is None:
            raise ValueError(f"span task {spec['name']}: evaluation needs the windows' {', '.join(SPAN_COLUMNS)}")
        answers, gold_answers = span_answers(spec, outputs[0], windows)
        version = "v2" if spec["type"] == "span_classification_yn" else "v1"
        return _metric("squad", version).compute(predictions=list(answers.values()),
                                                 references=[gold_answers[key] for key in answers])
    config_name = "regression" if spec["type"] == "regression" else "classification"
    return _metric("glue", config_name).compute(predictions=task_predictions(spec, predictions),
                                                references=np.asarray(references), metrics=task_metric_names(spec))


def _mtdnn_model(model: torch.nn.Module) -> MTDNNModel:
    """The `MTDNNModel` inside the model Trainer trains (out of DDP, compile and PEFT wrappers). A cast, not an
    isinstance check: a model loaded as remote code is an `MTDNNModel` of another module."""
    return cast(MTDNNModel, unwrap(model))


class MTDNNTrainer(TermLoggingTrainer):
    """`Trainer` for MT-DNN multi-task fine-tuning (an `MTDNNModel`, or a PEFT wrapper of it).

    - `train_dataset`: a `MultiTaskDataset` or the dict/list of task datasets it takes. Batches come from
      `MultiTaskBatchSampler` (one task each, mixed by `mix_opt` and `ratio`, seeded by `args.data_seed` or
      `args.seed`, split over the processes).
    - Or a dict of task streams (`datasets.IterableDataset`s, `data.read_task_stream`; `args.max_steps` gives the
      length): each process reads its own part of every task's stream (`split_dataset_by_node`), cut into batches of
      `per_device_train_batch_size` rows of one task, the task of each batch drawn with `task_probabilities`
      (`data.stream_task_probabilities`: the given weights, else the tasks' sizes where known, else equal shares;
      `ratio > 0` gives the first task `1 / (1 + ratio)`) by the same seeded draws on every process
      (`data.mixed_task_batches`). `mix_opt=1`, an order within an epoch, has no stream counterpart. Train with
      `hf_ext.streaming.train_keeping_progress` so that checkpoints hold the streams' position.
    - Training logs add `loss_<task>`: each task's mean loss over the logging window, over all processes.
    - `eval_dataset`: a dict `{name: dataset of one task}`; each gives `eval_<name>_loss` and the task's GLUE metrics
      `eval_<name>_<metric>` (`accuracy`, `f1`, `matthews_correlation`, `pearson`, `spearmanr`), so
      `metric_for_best_model="mnli_accuracy"` picks the best checkpoint on one task.
    - Rows with `soft_labels` add `kd_weight` times the distillation term (`kd_loss`: `"soft_ce"` or `"mse"`, see
      `distillation_loss`) to the task loss.
    - Under DDP, heads unused in a step are left to DDP's unused-parameter search: `args.ddp_find_unused_parameters`
      unset becomes True; False is refused.
    - `smart` (`SmartSettings`): SMART adversarial training as the original's `--adv_train` (`smart.py`): every
      training step adds `smart.alpha` times the adversarial loss to the task loss, logged as `adv_loss`.
    - `optimizer_name="adamax"` trains with the original's optimizer (`torch.optim.Adamax` with the arguments'
      learning rate, betas, epsilon and weight decay, under the arguments' schedule, e.g. linear decay after a 0.1
      warm-up as the paper); the default `"adamw"` is Trainer's own (`args.optim`).
    """

    def __init__(self, model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None, *,
                 mix_opt=0, ratio=0.0, kd_loss="soft_ce", kd_weight=1.0, optimizer_name="adamw",
                 smart: SmartSettings | None = None, task_probabilities: Mapping[str, float] | None = None,
                 **kwargs):
        if optimizer_name not in OPTIMIZERS:
            raise ValueError(f"optimizer_name must be one of {', '.join(OPTIMIZERS)}, got {optimizer_name!r}")
        if optimizer_name == "adamax" and args is not None:
            kwargs["optimizer_cls_and_kwargs"] = (torch.optim.Adamax, {
                "lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon,
                "weight_decay": args.weight_decay})
        if mix_opt not in (0, 1):
            raise ValueError(f"mix_opt must be 0 or 1, got {mix_opt!r}")
        if not ratio >= 0:
            raise ValueError(f"ratio must be >= 0, got {ratio!r}")
        if kd_loss not in KD_LOSSES:
            raise ValueError(f"kd_loss must be one of {', '.join(KD_LOSSES)}, got {kd_loss!r}")
        if not kd_weight >= 0:
            raise ValueError(f"kd_weight must be >= 0, got {kd_weight!r}")
        if args is not None:
            if args.ddp_find_unused_parameters is False:
                raise ValueError("MT-DNN steps leave the other tasks' heads unused: DDP needs "
                                 "ddp_find_unused_parameters=True (or unset)")
            args.ddp_find_unused_parameters = True  # read when the accelerator is built, in Trainer.__init__
        streamed = isinstance(train_dataset, Mapping) and any(map(is_stream, train_dataset.values()))
        probabilities = None
        if streamed:
            if not all(map(is_stream, train_dataset.values())):
                raise ValueError("give every task's training data as a stream, or none")
            if args is None or args.max_steps <= 0:
                raise ValueError("streamed task data has no length: give args with max_steps")
            if mix_opt:
                raise ValueError("mix_opt=1 orders the batches of an epoch (the main task last); a stream has no "
                                 "epochs: give ratio or task_probabilities")
            probabilities = stream_task_probabilities(train_dataset, task_probabilities, ratio)
            train_dataset = mixed_task_batches(
                _process_parts(train_dataset, args), args.per_device_train_batch_size, probabilities,
                seed=args.data_seed if args.data_seed is not None else args.seed)
        elif task_probabilities is not None:
            raise ValueError("task_probabilities mix task streams; map-style task datasets are mixed by mix_opt "
                             "and ratio")
        elif train_dataset is not None and not isinstance(train_dataset, MultiTaskDataset):
            train_dataset = MultiTaskDataset(train_dataset)
        self.mtdnn_config = unwrap(model).config
        if smart is not None and isinstance(train_dataset, MultiTaskDataset):
            for dataset in train_dataset.datasets:
                spec = self.mtdnn_config.task(int(dataset[0]["task"]))
                if spec["type"] not in SMART_TASK_TYPES:
                    raise ValueError(f"SMART adversarial training covers {', '.join(SMART_TASK_TYPES)} tasks, as the "
                                     f"original's SmartPerturbation; task {spec['name']} is {spec['type']}")
        if data_collator is None:
            data_collator = MTDNNCollator(pad_token_id=self.mtdnn_config.encoder.pad_token_id or 0)
        super().__init__(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, logged_terms=[f"loss_{name}" for name in
                                                                  self.mtdnn_config.task_names]
                         + (["adv_loss"] if smart is not None else []), **kwargs)
        self.task_probabilities = probabilities
        if self.stream is not None:
            self.stream.batch_size = 1  # a row of the mixed stream is a whole batch (`data.mixed_task_batches`)
        self.smart = smart
        self.mix_opt = mix_opt
        self.ratio = ratio
        self.kd_loss = kd_loss
        self.kd_weight = kd_weight

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        # soft targets for distillation, and what a span task's evaluation reads (the collator leaves them out)
        for column in ("soft_labels", *SPAN_COLUMNS):
            if column not in self._signature_columns:
                self._signature_columns.append(column)

    def get_train_dataloader(self) -> DataLoader:
        if self.stream is not None:
            return stream_dataloader(self.stream, 1, StreamedBatchCollator(self.data_collator), self.args)
        if self.train_dataset is None:
            raise ValueError("MTDNNTrainer: training requires a train_dataset")
        assert isinstance(self.train_dataset, MultiTaskDataset)  # __init__ wraps the task datasets in one
        args = self.args
        collator = self.data_collator
        if args.remove_unused_columns:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        sampler = MultiTaskBatchSampler(
            self.train_dataset.task_sizes, self._train_batch_size * args.world_size, self.mix_opt, self.ratio,
            seed=args.data_seed if args.data_seed is not None else args.seed, rank=args.process_index,
            world_size=args.world_size)
        loader = DataLoader(self.train_dataset, batch_sampler=sampler, collate_fn=collator,
                            num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory,
                            persistent_workers=args.dataloader_persistent_workers and args.dataloader_num_workers > 0)
        # the sampler already gives each process its share of the batch; accelerate must not shard it again, and
        # Trainer's `set_epoch` must reach it through `skip_first_batches` on resume
        return prepare_data_loader(loader, device=args.device, num_processes=1, process_index=0, put_on_device=True)

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None,
                     ) -> torch.Tensor | tuple[torch.Tensor, ModelOutput]:
        soft_labels = inputs.pop("soft_labels", None)
        outputs = model(**inputs)
        loss = outputs.loss
        spec = _mtdnn_model(model).resolve_task(inputs.get("task"))
        if soft_labels is not None and self.kd_weight > 0:
            distillation = self.kd_weight * distillation_loss(spec, outputs, soft_labels, self.kd_loss)
            loss = distillation if loss is None else loss + distillation
            outputs["loss"] = loss
        if model.training and loss is not None:
            self.record_term(model, f"loss_{spec['name']}", loss)
            if self.smart is not None:  # the task's logged loss is without the adversarial term, logged on its own
                adversarial = adversarial_loss(_mtdnn_model(model), spec, outputs.logits, inputs, self.smart)
                if adversarial is not None:
                    self.record_term(model, "adv_loss", adversarial)
                    loss = loss + self.smart.alpha * adversarial
                    outputs["loss"] = loss
        return (loss, outputs) if return_outputs else loss

    def evaluation_loop(self, dataloader: DataLoader, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput:
        dataset = dataloader.dataset
        tasks = dataset.unique("task") if hasattr(dataset, "unique") and hasattr(dataset, "column_names") \
            and "task" in dataset.column_names else []
        spec = self.mtdnn_config.task(int(tasks[0])) if len(tasks) == 1 else None
        if spec is not None and not self.args.prediction_loss_only:
            prediction_loss_only = False  # `evaluate` asks for the loss alone when there is no compute_metrics
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                         metric_key_prefix)
        if spec is not None and output.predictions is not None and output.label_ids is not None:
            assert output.metrics is not None  # Trainer.evaluation_loop always returns its metrics
            windows = dataset if spec["type"] in SPAN_TASK_TYPES else None
            for name, value in evaluate_task(spec, output.predictions, output.label_ids, windows).items():
                output.metrics[f"{metric_key_prefix}_{name}"] = value
        return output


def _process_parts(streams: Mapping[str, "IterableDataset"], args: TrainingArguments) -> dict[str, "IterableDataset"]:
    """This process's part of every task stream; a part without rows (more processes than the task has shards and
    rows) is refused, as training would wait for its first batch forever."""
    parts = {task: split_for_process(stream, args) for task, stream in streams.items()}
    for task, part in parts.items():
        try:
            first = next(iter(part.take(1)), None)
        except HfExtError:
            raise
        except Exception as error:  # the reader's own, as in training (`hf_ext.streaming.PositionedStream`)
            raise StreamReadError(error) from error
        if first is None:
            raise HfExtError(f"the training data of task {task} gives process {args.process_index} of "
                             f"{args.world_size} no rows")
    return parts


def train_mtdnn(model: "MTDNNModel | PeftModel", train_dataset: "Mapping[str, Dataset | IterableDataset]",
                eval_dataset: dict[str, "Dataset"] | None = None, args: TrainingArguments | None = None,
                teachers: Sequence["MTDNNModel | PeftModel"] = (), teacher_batch_size: int = 32,
                log_to_stderr: bool = False, **settings: Any) -> MTDNNTrainer:
    """Multi-task fine-tuning of `model` (an `MTDNNModel`, or a PEFT wrapper of it) on `train_dataset` (`{task:
    dataset}`), with per-task evaluation on `eval_dataset` (`{name: dataset}`). With `teachers` (models holding the
    training tasks), every training row first gets the mean of their class probabilities as soft target
    (`add_soft_labels`) and the run is distillation (MT-DNN-KD).

    Task streams (`data.read_task_stream`) train as `MTDNNTrainer` describes; when the arguments save checkpoints,
    a run on the same output folder resumes from the newest complete one and reads on from the streams' saved
    position, and a stream that fails to read keeps the steps trained in a checkpoint (`StreamReadError`).

    `args` are the `TrainingArguments`; without them they are built from the `TrainingArguments` fields among
    `settings` (`hf_ext.trainer.training_arguments`). The other `settings` go to `MTDNNTrainer` (`mix_opt`, `ratio`,
    `kd_loss`, `kd_weight`, `optimizer_name`, `smart`, `task_probabilities`, `callbacks`, `data_collator`). Returns
    the trainer after training."""
    trainer_settings = {key: settings.pop(key) for key in TRAINER_SETTINGS if key in settings}
    args = args if args is not None else training_arguments(**settings)
    if teachers and any(map(is_stream, train_dataset.values())):
        raise ValueError("distillation adds the teachers' soft targets to map-style task datasets, not to streams")
    if teachers:  # token-level tasks train on their labels alone (see `teacher_soft_labels`)
        train_dataset = {task: dataset if unwrap(model).config.task(task)["type"] in TOKEN_TASK_TYPES
                         else add_soft_labels(dataset, teachers, task, batch_size=teacher_batch_size)
                         for task, dataset in train_dataset.items()}
    trainer = MTDNNTrainer(model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset or None,
                           **trainer_settings)
    if log_to_stderr:
        send_logs_to_stderr(trainer)
    if trainer.stream is None:
        trainer.train()
        return trainer
    assert args.output_dir is not None  # TrainingArguments sets its default ("trainer_output") when given none
    checkpoint = last_complete_checkpoint(args.output_dir) if args.save_strategy != "no" else None
    if checkpoint is not None:
        logger.warning(f"resuming from {checkpoint}")
    train_keeping_progress(trainer, resume_from_checkpoint=checkpoint)
    return trainer


TRAINER_SETTINGS = ("mix_opt", "ratio", "kd_loss", "kd_weight", "optimizer_name", "smart", "task_probabilities",
                    "callbacks", "data_collator")


__all__ = ["MTDNNTrainer", "OPTIMIZERS", "evaluate_task", "task_metric_names", "task_predictions", "train_mtdnn"]
