"""ERNIE 2.0 continual multi-task pre-training (Sun et al., AAAI 2020) on transformers' `Trainer`, and GLUE
fine-tuning of the result through transformers' own `ErnieForSequenceClassification`.

The continual schedule is a list of stages; each names the tasks it trains and how many optimizer steps each gets
(`ContinualSchedule`, `PAPER_SCHEDULE` in `schedule.py`). `continual_pretraining` runs one `Ernie2PreTrainer` per
stage, each starting from the weights the previous stage ended with, with its own optimizer and learning-rate
schedule (the paper restarts the warm-up for every task). Within a stage every batch holds one task;
`StageBatchSampler` gives the rule.

Layout of `args.output_dir`: `schedule.json` (the run's schedule; a resumed run must have the same), and per stage
`stage-<k>/` (the stage's `Trainer` output: `checkpoint-<step>/` folders) with `stage-<k>/model/` (the weights at the
end of the stage and `log_history.json`, written atomically: it marks the stage as done). Running again on the same
folder skips finished stages, resumes the current one from its last checkpoint (weights, optimizer, scheduler, RNG
states, step, and the sampler's position) and goes on.
"""

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader, Sampler
from transformers import (
    DataCollatorWithPadding,
    EvalPrediction,
    PreTrainedTokenizerBase,
    ProcessorMixin,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import ModelOutput, logging

from ...errors import HfExtError
from ...glue import GLUE_LAYOUTS, glue_task, glue_task_spec, read_glue_tsv
from ...metrics import load_metric
from ...output import atomic_output_dir
from ...streaming import StreamReadError, split_for_process, train_keeping_progress
from ...trainer import TermLoggingTrainer, last_complete_checkpoint, replace_arguments, send_logs_to_stderr
from . import PRETRAINING_TASKS, Ernie2ForPreTraining, Ernie2PreTrainingConfig
from .configuration_ernie2 import validate_ernie_encoder
from .data import Ernie2PreTrainingCollator, stage_mixture
from .schedule import ContinualSchedule

if TYPE_CHECKING:  # datasets is imported only when data is read
    from datasets import Dataset, IterableDataset

logger = logging.get_logger(__name__)

SCHEDULE_FILE = "schedule.json"
STAGE_MODEL = "model"
LOG_HISTORY = "log_history.json"


# ----- batches -----------------------------------------------------------------------------------------------------

class StageBatchSampler(Sampler):
    """The batches of one stage, each of a single task.

    Sampling rule: the task of each batch is drawn with probability proportional to the batches the task has left
    in the stage (its steps times `batches_per_step`). Every task thus gets exactly its budget, spread evenly in
    expectation; drawing that way is the same as taking a uniformly random order of the multiset of batches, which
    is how it is computed. A task's rows are visited in reshuffled passes (a new permutation each time the previous
    one is used up), `batch_size` rows at a time.

    Everything follows from `seed`, so the order is the same in a resumed run (Trainer skips the batches already
    trained). Under distributed training the rows of every batch are split over the processes (each trains the same
    task at each step): `batch_size` is the global batch and must divide by `world_size`.

    Args:
        task_rows (`dict[str, list[int]]`): the dataset indices of each task's rows.
        steps (`dict[str, int]`): optimizer steps of each task in the stage.
        batch_size (`int`): rows per batch, over all processes.
        batches_per_step (`int`, defaults to 1): batches per optimizer step (gradient accumulation).
        seed: anything `numpy.random.default_rng` takes.
    """

    def __init__(self, task_rows, steps, batch_size, batches_per_step=1, seed=0, rank=0, world_size=1):
        missing = [task for task in steps if not len(task_rows.get(task, ()))]
        if missing:
            raise HfExtError(f"no examples for task(s) {', '.join(missing)} of the stage")
        if batch_size < 1 or batch_size % world_size:
            raise ValueError(f"the batch of {batch_size} rows does not split over {world_size} processes")
        self.task_rows = {task: np.asarray(task_rows[task]) for task in steps}
        self.steps = dict(steps)
        self.batch_size = batch_size
        self.batches_per_step = batches_per_step
        self.seed = seed
        self.rank = rank
        self.world_size = world_size

    def task_order(self, rng: np.random.Generator) -> list[str]:
        tasks = list(self.steps)
        counts = [self.steps[task] * self.batches_per_step for task in tasks]
        return [tasks[i] for i in rng.permutation(np.repeat(np.arange(len(tasks)), counts))]

    def __len__(self):
        return sum(self.steps.values()) * self.batches_per_step

    def __iter__(self):
        rng = np.random.default_rng(self.seed)
        order = self.task_order(rng)
        pending = {task: [] for task in self.steps}
        share = self.batch_size // self.world_size
        for task in order:
            rows = pending[task]
            while len(rows) < self.batch_size:
                rows.extend(rng.permutation(self.task_rows[task]).tolist())
            batch, pending[task] = rows[:self.batch_size], rows[self.batch_size:]
            yield batch[self.rank * share:(self.rank + 1) * share]


# ----- one stage ---------------------------------------------------------------------------------------------------

class Ernie2PreTrainer(TermLoggingTrainer):
    """`Trainer` for one stage of ERNIE 2.0 pre-training (an `Ernie2ForPreTraining`).

    - `train_dataset`: `{task: dataset}` with the examples of `Ernie2DataBuilder` (a `DatasetDict` works); batches
      come from `StageBatchSampler` over `stage.steps`, seeded by (`args.data_seed` or `args.seed`, `stage_index`);
      `args.max_steps` is the stage's total. Or a `datasets.IterableDataset`: this process's part of the stage's
      examples (`data.stage_mixture`), read `per_device_train_batch_size` rows at a time by `self.stream`
      (`TermLoggingTrainer`), which keeps the stream's position for checkpoints (`hf_ext.streaming`).
    - `data_collator` defaults to `Ernie2PreTrainingCollator` with the model's task ids.
    - Training logs add `loss_<task>` (each task's mean loss over the logging window, over all processes) and
      `stage` (1-based).
    - Under DDP the heads of tasks absent from a step are unused: `ddp_find_unused_parameters` unset becomes True.
    """

    def __init__(self, model=None, args=None, stage=None, train_dataset=None, data_collator=None, stage_index=0,
                 **kwargs):
        from datasets import IterableDataset, concatenate_datasets

        if stage is None or train_dataset is None:
            raise ValueError("Ernie2PreTrainer needs the stage and a train_dataset {task: examples}")
        streamed = isinstance(train_dataset, IterableDataset)
        if not streamed:
            missing = [task for task in stage.steps if task not in train_dataset]
            if missing:
                raise HfExtError(f"no examples for task(s) {', '.join(missing)} of the stage")
            tasks = list(stage.steps)
            sizes = [len(train_dataset[task]) for task in tasks]
            offsets = np.cumsum([0, *sizes]).tolist()
            self.task_rows = {task: range(offsets[i], offsets[i + 1]) for i, task in enumerate(tasks)}
            train_dataset = concatenate_datasets([train_dataset[t] for t in tasks])
        if args is not None:
            args = replace_arguments(args, max_steps=stage.total_steps, ddp_find_unused_parameters=True
                                     if args.ddp_find_unused_parameters is None else args.ddp_find_unused_parameters)
        if data_collator is None:
            data_collator = Ernie2PreTrainingCollator(model.config.task_ids, model.config.pad_token_id or 0)
        super().__init__(model=model, args=args, train_dataset=train_dataset, data_collator=data_collator,
                         logged_terms=[f"loss_{task}" for task in PRETRAINING_TASKS], **kwargs)
        self.stage = stage
        self.stage_index = stage_index

    def get_train_dataloader(self) -> DataLoader:
        args = self.args
        if self.stream is not None:  # TermLoggingTrainer reads it
            return super().get_train_dataloader()
        seed = args.data_seed if args.data_seed is not None else args.seed
        sampler = StageBatchSampler(self.task_rows, self.stage.steps, self._train_batch_size * args.world_size,
                                    args.gradient_accumulation_steps, seed=(seed, self.stage_index),
                                    rank=args.process_index, world_size=args.world_size)
        assert self.train_dataset is not None  # __init__ requires it (the stage's tasks, concatenated)
        loader = DataLoader(self.train_dataset, batch_sampler=sampler, collate_fn=self.data_collator,
                            num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory)
        # the sampler already gives each process its share of the batch: accelerate must not shard it again
        return prepare_data_loader(loader, device=args.device, num_processes=1, process_index=0, put_on_device=True)

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None,
                     ) -> torch.Tensor | tuple[torch.Tensor, ModelOutput]:
        outputs = model(**inputs)
        if model.training:
            for task in PRETRAINING_TASKS:
                if outputs.get(f"{task}_loss") is not None:
                    self.record_term(model, f"loss_{task}", outputs[f"{task}_loss"])
        return (outputs.loss, outputs) if return_outputs else outputs.loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            logs["stage"] = self.stage_index + 1
        super().log(logs, start_time)


# ----- the continual run -------------------------------------------------------------------------------------------

def continual_pretraining(model: Ernie2ForPreTraining, schedule: ContinualSchedule,
                          datasets: Mapping[str, "Dataset"] | Mapping[str, "IterableDataset"], args: TrainingArguments,
                          processing_class: PreTrainedTokenizerBase | ProcessorMixin | None = None,
                          data_collator: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]] | None = None,
                          callbacks: list[TrainerCallback] | None = None, log_to_stderr: bool = False,
                          ) -> tuple[Ernie2ForPreTraining, list[list[dict[str, float]]]]:
    """Run (or resume) `schedule` on `model` (an `Ernie2ForPreTraining`) from the `datasets` `{task: examples}`.

    `args` (`TrainingArguments`) apply to every stage; `output_dir` is the run's folder (layout in the module
    docstring) and `max_steps` is set per stage. A resumed run must get the same datasets and arguments.
    `log_to_stderr` writes the logs as JSON lines on stderr instead of printing them. Returns the model after the
    last stage (a freshly loaded one when finished stages were skipped) and the log history of each stage.

    With streams (`data.task_streams`), each process reads its own part of every task's stream
    (`split_dataset_by_node`) and a stage mixes its tasks' examples with the stage's shares of steps as
    probabilities (`data.stage_mixture`, seeded by `args.data_seed` or `args.seed` plus the stage's index). Every
    checkpoint also holds each process's stream position, from which a resumed stage reads on without re-reading
    what it trained; a stream that fails to read keeps the steps trained in a checkpoint (`StreamReadError`).
    """
    from datasets import IterableDataset

    streamed = any(isinstance(dataset, IterableDataset) for dataset in datasets.values())
    missing = [task for task in schedule.tasks if task not in datasets
               or (not streamed and not len(cast("Dataset", datasets[task])))]
    if missing:
        raise HfExtError(f"the schedule trains {', '.join(missing)}, but there are no examples for it")
    assert args.output_dir is not None  # TrainingArguments sets its default ("trainer_output") when given none
    out = Path(args.output_dir)
    _record_schedule(out, schedule)
    histories, finished = [], None
    for index, stage in enumerate(schedule.stages):
        stage_dir = out / f"stage-{index + 1}"
        final = stage_dir / STAGE_MODEL
        if (final / LOG_HISTORY).is_file():
            histories.append(json.loads((final / LOG_HISTORY).read_text()))
            finished = final
            continue
        if finished is not None:  # the stage starts from the weights the previous one ended with
            model = type(model).from_pretrained(finished)
            finished = None
        checkpoint = last_complete_checkpoint(stage_dir)
        steps = ", ".join(f"{task} {count}" for task, count in stage.steps.items())
        logger.info(f"stage {index + 1}/{len(schedule.stages)}{f' ({stage.name})' if stage.name else ''}: {steps} steps"
            + (f", resuming from {checkpoint}" if checkpoint else ""))
        stage_args = replace_arguments(args, output_dir=str(stage_dir))
        train_dataset: Any = datasets
        if streamed:
            seed = args.data_seed if args.data_seed is not None else args.seed
            try:  # mixing reads each stream's first examples: this process's part may fail there
                train_dataset = stage_mixture({task: split_for_process(cast("IterableDataset", stream), args)
                                               for task, stream in datasets.items()}, stage, seed=seed + index)
            except HfExtError:
                raise
            except Exception as error:
                raise StreamReadError(error) from error
        trainer = Ernie2PreTrainer(model=model, args=stage_args, stage=stage, train_dataset=train_dataset,
                                   data_collator=data_collator, stage_index=index, processing_class=processing_class,
                                   callbacks=callbacks)
        if log_to_stderr:
            send_logs_to_stderr(trainer)
        train_keeping_progress(trainer, resume_from_checkpoint=checkpoint)
        model = cast(Ernie2ForPreTraining, trainer.model)  # the model it was given (Trainer trains it in place)
        # every process takes part: under FSDP the weights are gathered from their shards (a collective)
        weights = trainer.accelerator.get_state_dict(trainer.model_wrapped)
        for tied in model.all_tied_weights_keys:  # gathered as copies, which saving cannot tell to be tied
            weights.pop(tied, None)
        if trainer.is_world_process_zero():
            with atomic_output_dir(final, overwrite=True) as staging:
                model.save_pretrained(staging, state_dict=weights)
                if processing_class is not None:
                    processing_class.save_pretrained(staging)
                (staging / LOG_HISTORY).write_text(json.dumps(trainer.state.log_history, indent=1))
        trainer.accelerator.wait_for_everyone()
        histories.append(trainer.state.log_history)
    if finished is not None:
        model = type(model).from_pretrained(finished)
    return model, histories


def _record_schedule(out, schedule):
    path = out / SCHEDULE_FILE
    if path.is_file():
        if json.loads(path.read_text()) != schedule.to_dict():
            raise HfExtError(f"{out} holds a run of another schedule ({path}); give a new output folder")
        return
    out.mkdir(parents=True, exist_ok=True)
    # written whole and renamed: other processes of a distributed run may read it at the same time
    partial = out / f".{SCHEDULE_FILE}.{os.getpid()}"
    partial.write_text(json.dumps(schedule.to_dict(), indent=2))
    os.replace(partial, path)


def load_pretraining_model(name_or_path: str | Path, config_kwargs: dict[str, Any] | None = None, **kwargs: Any,
                           ) -> Ernie2ForPreTraining:
    """An `Ernie2ForPreTraining` from an ERNIE 2.0 pre-training folder (`from_pretrained`), from a plain `ernie`
    folder or repo, such as `hf-ext convert ernie2` writes (`from_ernie_pretrained` with `config_kwargs`), or from
    another BERT-family encoder (BERT, MiniLM, ELECTRA, RoBERTa, XLM-RoBERTa, CamemBERT:
    `encoders.ernie_from_bert_family`)."""
    from transformers import AutoConfig

    from .encoders import ernie_from_bert_family

    try:
        config = AutoConfig.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError) as error:
        raise HfExtError(f"cannot load a model config from {name_or_path}: {str(error).splitlines()[0]}") from None
    if config.model_type == Ernie2PreTrainingConfig.model_type:
        if config_kwargs:
            raise HfExtError(f"{name_or_path} is already an ERNIE 2.0 pre-training model; its task settings stay")
        return Ernie2ForPreTraining.from_pretrained(name_or_path, **kwargs)
    try:
        if config.model_type != "ernie":
            return Ernie2ForPreTraining.from_ernie(ernie_from_bert_family(name_or_path, config, **kwargs),
                                                   **(config_kwargs or {}))
        return Ernie2ForPreTraining.from_ernie_pretrained(name_or_path, config_kwargs, **kwargs)
    except ValueError as error:
        raise HfExtError(f"{name_or_path}: {str(error).splitlines()[0]}") from None


# ----- GLUE fine-tuning --------------------------------------------------------------------------------------------

def load_glue_dataset(path: str | Path, task: str, tokenizer: PreTrainedTokenizerBase, max_length: int = 128,
                      ) -> "Dataset":
    """A GLUE TSV file in the task's own layout as a tokenized `datasets.Dataset` (`input_ids`, `token_type_ids`,
    `attention_mask`, and `labels` when the file has them: class ids in the order of the layout's label names, or
    float scores for STS-B)."""
    return read_glue_tsv(path, glue_task_spec(task), tokenizer, max_length)


class TaskIdCollator(DataCollatorWithPadding):
    """`DataCollatorWithPadding` that also gives every token the task id `task_id` (`task_type_ids`)."""

    def __init__(self, tokenizer, task_id=0, **kwargs):
        super().__init__(tokenizer, **kwargs)
        self.task_id = task_id

    def __call__(self, features):
        batch = super().__call__(features)
        batch["task_type_ids"] = torch.full_like(batch["input_ids"], self.task_id)
        return batch


def glue_metrics(task: str) -> Callable[[EvalPrediction], dict[str, float]]:
    """`compute_metrics` for `Trainer`: the task's GLUE metrics (the offline `glue` evaluate module) of the
    predictions (argmax of the logits, or the score for STS-B)."""
    key = glue_task(task)
    metric = load_metric("glue", config_name=key)
    regression = GLUE_LAYOUTS[key].num_labels == 1

    def compute(prediction):
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        predictions = logits[:, 0] if regression else logits.argmax(-1)
        return metric.compute(predictions=predictions, references=prediction.label_ids)

    return compute


def finetune_glue(model_name_or_path: str | Path, task: str, train_file: str | Path, args: TrainingArguments,
                  eval_file: str | Path | None = None, task_id: int = 0, max_length: int = 128,
                  callbacks: list[TrainerCallback] | None = None, log_to_stderr: bool = False,
                  trust_remote_code: bool = False, model_kwargs: dict[str, Any] | None = None,
                  ) -> tuple[Trainer, dict[str, float]]:
    """Fine-tune a plain `ernie` folder (converted, or exported from pre-training) on a GLUE task with `Trainer` and
    transformers' `ErnieForSequenceClassification`, feeding `task_id` as every token's task id. Returns the trainer
    (`trainer.save_model(folder)` saves the model and tokenizer) and the metrics of `eval_file` (`eval_<metric>`)
    when given. `model_kwargs` go to the model's `from_pretrained` (`revision`, `dtype`, ...); `args` choose the
    device and mixed precision (`use_cpu`, `bf16`, `fp16`).
    """
    from transformers import AutoConfig, AutoTokenizer, ErnieForSequenceClassification, set_seed

    key = glue_task(task)
    layout = GLUE_LAYOUTS[key]
    try:
        config = AutoConfig.from_pretrained(model_name_or_path, trust_remote_code=trust_remote_code)
        if config.model_type == "ernie":
            validate_ernie_encoder(config)  # transformers' ErnieConfig checks the types of its sizes only
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise HfExtError(f"cannot load {model_name_or_path}: {str(error).splitlines()[0]}") from None
    if config.model_type == Ernie2PreTrainingConfig.model_type:
        raise HfExtError(f"{model_name_or_path} is an ERNIE 2.0 pre-training folder: export its encoder to a plain "
                         "ernie folder first (hf-ext ernie2 export, or Ernie2ForPreTraining.save_ernie_pretrained)")
    if config.model_type != "ernie":
        raise HfExtError(f"{model_name_or_path} holds a {config.model_type} model, not ERNIE")
    if not 0 <= task_id < (config.task_type_vocab_size if config.use_task_id else 1):
        raise HfExtError(f"task id {task_id} is not available: the model has "
                         + (f"{config.task_type_vocab_size} task ids" if config.use_task_id
                            else "no task embedding (use_task_id is false), so only task id 0"))
    labels: dict[str, Any] = {"num_labels": layout.num_labels}
    if layout.labels:
        labels.update(id2label=dict(enumerate(layout.labels)), label2id={n: i for i, n in enumerate(layout.labels)})
    # the classification head starts from random weights: drawn after seeding, as `Trainer` seeds before a
    # `model_init`, so that `args.seed` decides them, not what ran before in the process (which the launch changes)
    set_seed(args.seed)
    model = ErnieForSequenceClassification.from_pretrained(
        model_name_or_path, problem_type="regression" if layout.num_labels == 1 else "single_label_classification",
        **labels, **(model_kwargs or {}))
    train = load_glue_dataset(train_file, key, tokenizer, max_length)
    evaluation = load_glue_dataset(eval_file, key, tokenizer, max_length) if eval_file else None
    for name, dataset in (("training", train), ("evaluation", evaluation)):
        if dataset is not None and "labels" not in dataset.column_names:
            raise HfExtError(f"the {name} file has no labels (a GLUE test file?)")
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation,
                      data_collator=TaskIdCollator(tokenizer, task_id), processing_class=tokenizer,
                      compute_metrics=glue_metrics(key), callbacks=callbacks)
    if log_to_stderr:
        send_logs_to_stderr(trainer)
    trainer.train()
    metrics = trainer.evaluate() if evaluation is not None else {}
    return trainer, metrics


__all__ = ["Ernie2PreTrainer", "StageBatchSampler", "TaskIdCollator", "continual_pretraining", "finetune_glue",
           "glue_metrics", "load_glue_dataset", "load_pretraining_model"]
