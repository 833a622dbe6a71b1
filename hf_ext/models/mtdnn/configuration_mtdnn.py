"""Configuration of MT-DNN (Liu et al., ACL 2019): one encoder shared by an ordered list of task heads."""

import math
import numbers
import re
import reprlib
from collections.abc import Mapping
from typing import Any, NoReturn

from torch import nn
from transformers import AutoConfig, BertConfig, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

TASK_TYPES = ("classification", "regression", "ranking", "sequence_labeling", "span_classification",
              "span_classification_yn")
# tasks whose head reads every token (the others read the first token's vector)
TOKEN_TASK_TYPES = ("sequence_labeling", "span_classification", "span_classification_yn")
SPAN_TASK_TYPES = ("span_classification", "span_classification_yn")
HEAD_TYPES = ("linear", "san")
# the original's DataFormat names: sentence-level formats, `Seqence` (words and their tags) and `CLUE_SPAN`
# (SQuAD-style question, context and answers)
DATA_FORMATS = ("PremiseOnly", "PremiseAndOneHypothesis", "PremiseAndMultiHypothesis", "Seqence", "CLUE_SPAN")
PAIR_FORMATS = ("PremiseAndOneHypothesis", "PremiseAndMultiHypothesis")
# the data format each task type reads (None: any sentence-level format but PremiseAndMultiHypothesis)
TYPE_DATA_FORMATS = {"ranking": "PremiseAndMultiHypothesis", "sequence_labeling": "Seqence",
                     "span_classification": "CLUE_SPAN", "span_classification_yn": "CLUE_SPAN"}
RNN_TYPES = ("gru", "lstm", "rnn")
# the original's data_utils.metrics.Metric names
METRICS = ("ACC", "F1", "MCC", "Pearson", "Spearman", "AUC", "SeqEval", "EmF1", "F1MAC", "F1MIC", "CMAT", "EmF12",
           "SeqEvalList")
DEFAULT_METRICS = {"classification": ["ACC"], "regression": ["Pearson", "Spearman"], "ranking": ["ACC"],
                   "sequence_labeling": ["SeqEval"], "span_classification": ["EmF1"],
                   "span_classification_yn": ["EmF12"]}
# the metrics each token-level task type can report (sentence-level types report the GLUE metrics)
TOKEN_TASK_METRICS = {"sequence_labeling": ("SeqEval",), "span_classification": ("EmF1",),
                      "span_classification_yn": ("EmF12",)}
DEFAULT_MAX_ANSWER_LENGTH = 30  # tokens of a predicted answer span (the original's postprocess_qa_predictions')
# the original's train.py defaults for the SAN answer module (--answer_num_turn, --answer_mem_type, ...)
DEFAULT_SAN = {"num_turns": 5, "memory_type": 1, "memory_dropout": 0.1, "merge_opt": 1, "rnn_type": "gru"}
DEFAULT_DROPOUT = 0.1  # train.py --dropout_p, for task definitions without dropout_p
DEFAULT_GROUP_SIZE = 2  # candidates per ranking group when not given: pairwise, like QNLI-as-ranking and COPA

# the original's task-definition YAML (experiments/*/..._task_def.yml): what each key means here
ORIGINAL_TASK_TYPES = {"Classification": "classification", "Regression": "regression", "Ranking": "ranking",
                       "SeqenceLabeling": "sequence_labeling", "SpanClassification": "span_classification",
                       "SpanClassificationYN": "span_classification_yn"}
# SpanClassificationYN trains with SpanCeCriterion in the original's squad_task_def.yml: its SpanYNCeCriterion needs
# a third (yes/no) output that the task's forward never returns
ORIGINAL_LOSSES = {"classification": "CeCriterion", "regression": "MseCriterion", "ranking": "RankCeCriterion",
                   "sequence_labeling": "SeqCeCriterion", "span_classification": "SpanCeCriterion",
                   "span_classification_yn": "SpanCeCriterion"}
ORIGINAL_TASK_KEYS = ("task_type", "n_class", "data_format", "enable_san", "dropout_p", "labels", "metric_meta",
                      "loss", "kd_loss", "adv_loss", "split_names", "actf")
TASK_KEYS = ("name", "type", "num_labels", "head", "dropout", "data_format", "labels", "group_size", "metrics",
             "kd_loss", "split_names", "san", "max_answer_length", "null_score_diff_threshold")
TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
# checked where the encoder's config has them (type_vocab_size is not: DeBERTa's 0 means "no segment embeddings")
ENCODER_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings")
ENCODER_EPSILONS = ("layer_norm_eps", "norm_eps")  # BERT's family and ModernBERT's names of the LayerNorm epsilon
# encoders whose position ids start after the padding id (RoBERTa's family: padding_idx + 1), so a row holds
# max_position_embeddings - pad_token_id - 1 tokens
OFFSET_POSITION_TYPES = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm",
                         "data2vec-text", "xmod")

# the constants of `quoted`, copied from hf_ext.errors (remote code imports only torch, transformers and its own
# folder; tests/test_security.py keeps them equal)
MAX_QUOTED_CHARS = 60  # of a user value quoted in an error message
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxstring, _SHORT_REPR.maxother = 3, MAX_QUOTED_CHARS, MAX_QUOTED_CHARS


class MTDNNConfig(PretrainedConfig):
    r"""
    Configuration of an MT-DNN model: an encoder and an ordered list of tasks, each with its own head.

    Args:
        encoder (`PretrainedConfig` or `dict`, *optional*): the shared encoder: the config of any bidirectional
            transformers encoder (a model type with a masked-LM head: BERT, RoBERTa, XLM-RoBERTa, DeBERTa,
            DeBERTa-v2/v3, ELECTRA, ModernBERT, ...); a dict holds its `model_type` (BERT when it has none, as in
            folders written before other encoders were supported). A BERT encoder by default.
        tasks (`list[dict]`): the tasks in the original's order (task id = position). Each task has
            - `name` (`str`): letters, digits, `-` and `_`;
            - `type` (`str`): `"classification"`, `"regression"`, `"ranking"`, `"sequence_labeling"` (a tag per
              token, e.g. NER), `"span_classification"` (extractive question answering: the answer's start and
              end token, SQuAD v1.1) or `"span_classification_yn"` (the same where a question may have no answer
              in the text, SQuAD v2.0: the answer is then the first token);
            - `num_labels` (`int`): classes of a classification task, tags of a sequence-labeling task; 1 for
              regression and ranking (one score per row); 2 for span tasks (a start and an end score per token);
            - `head` (`str`, defaults to `"linear"`): `"linear"` (dense on the [CLS] vector, then a linear layer; for
              token-level tasks a linear layer on every token) or `"san"` (stochastic answer network,
              classification of sentence pairs only);
            - `dropout` (`float`, defaults to 0.1): the task's `dropout_p`, on the [CLS] vector (linear head), on
              every token (token-level tasks) or throughout the SAN head;
            - `data_format` (`str`): the original's `PremiseOnly`, `PremiseAndOneHypothesis`,
              `PremiseAndMultiHypothesis` (ranking), `Seqence` (sequence labeling) or `CLUE_SPAN` (span tasks);
            - `labels` (`list[str]`, *optional*): label names (classification: one per class; sequence labeling,
              where they are required: the tag names, e.g. `O`, `B-PER`, `I-PER`, ...);
            - `group_size` (`int`, ranking only, defaults to 2): candidates per group K; rows come candidate-major
              within a group (row g*K+k = premise g with candidate k);
            - `metrics` (`list[str]`): the original's metric names for evaluation (ACC, F1, MCC, Pearson, ...);
            - `kd_loss` (`str`, *optional*): the original's distillation criterion name, recorded for training;
            - `split_names` (`list[str]`): the data splits of the task;
            - `san` (`dict`, SAN heads only): `num_turns` (5), `memory_type` (1: log of the turn-averaged
              probabilities, 0: the last turn's logits), `memory_dropout` (0.1, stochastic prediction dropout),
              `merge_opt` (1: the classifier reads [x, h, |x-h|, x*h]; 0: [x, h]), `rnn_type` (`gru`, `lstm`, `rnn`);
            - `max_answer_length` (`int`, span tasks only, defaults to 30): the longest answer span (in tokens) an
              evaluation predicts;
            - `null_score_diff_threshold` (`float`, `span_classification_yn` only, defaults to 0.0): an answer is
              predicted only where its score beats the no-answer score by more than this.
        default_task (`str`, *optional*): the task `MTDNNForSequenceClassification` exposes (and `MTDNNModel` runs
            when no `task` is given); the first task when unset.
    """

    model_type = "mt-dnn"
    sub_configs = {"encoder": AutoConfig}

    def __init__(self, encoder=None, tasks=None, default_task=None, tie_word_embeddings=False, **kwargs):
        if isinstance(encoder, dict):
            encoder = encoder_config_from_dict(encoder)
        self.encoder = encoder if encoder is not None else BertConfig()
        self.tasks = [normalize_task(task) for task in (tasks or [])]
        self.default_task = default_task
        self.tie_word_embeddings = tie_word_embeddings
        super().__init__(**kwargs)
        self.validate_mtdnn()

    def validate_mtdnn(self) -> None:
        """Raise `ValueError` with one clear line for a configuration the model cannot run."""
        check_encoder(self.encoder)
        names = [task["name"] for task in self.tasks]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"task names must be unique, {', '.join(duplicates)} appear more than once")
        if self.default_task is not None and self.default_task not in names:
            raise ValueError(f"default_task {quoted(self.default_task)} is not one of the tasks ({', '.join(names)})")

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> PretrainedConfig:
        """The encoder's config, for both ends: it holds the vocabulary, so that `resize_token_embeddings`
        updates the `vocab_size` the encoder is rebuilt from."""
        return self.encoder

    @property
    def task_names(self) -> list[str]:
        return [task["name"] for task in self.tasks]

    def task_index(self, task: str | int) -> int:
        """Index of a task given by name or index; `ValueError` for an unknown one."""
        if isinstance(task, bool) or not isinstance(task, (numbers.Integral, str)):
            raise ValueError(f"task must be a task name or index, got {type(task).__name__}")
        if isinstance(task, numbers.Integral):
            if not 0 <= task < len(self.tasks):
                raise ValueError(f"task index {task} is out of range: the model has {len(self.tasks)} tasks")
            return int(task)
        if task not in self.task_names:
            raise ValueError(f"unknown task {quoted(task)}; the model's tasks are "
                             f"{', '.join(self.task_names) or 'none'}")
        return self.task_names.index(task)

    def task(self, task: str | int) -> dict[str, Any]:
        """The task's settings (a dict, see the class docstring) by name or index."""
        return self.tasks[self.task_index(task)]

    @classmethod
    def from_task_defs(cls, task_defs: dict[str, dict[str, Any]], encoder_config: PretrainedConfig | dict[str, Any],
                       task_names: list[str] | None = None, san: dict[str, Any] | None = None,
                       group_sizes: Mapping[str, int] | None = None, **kwargs: Any) -> "MTDNNConfig":
        r"""
        Build the config from task definitions in the original's format (`{name: {task_type, n_class, data_format,
        enable_san, dropout_p, labels, metric_meta, loss, kd_loss, ...}}`, i.e. a parsed `glue_task_def.yml`).

        Args:
            task_defs (`dict`): the task definitions.
            encoder_config (`PretrainedConfig` or `dict`): the encoder (see the class docstring).
            task_names (`list[str]`, *optional*): which tasks, in which order (the original's `--train_datasets`
                prefixes); all of `task_defs`, in their order, when unset.
            san (`dict`, *optional*): SAN settings for every SAN head (keys of `san` in the class docstring).
            group_sizes (`dict[str, int]`, *optional*): candidates per group of ranking tasks.
        """
        if not isinstance(task_defs, dict) or not task_defs:
            raise ValueError("the task definitions must map task names to their settings")
        names = list(task_defs) if task_names is None else list(task_names)
        undefined = [name for name in names if name not in task_defs]
        if undefined:
            raise ValueError(f"task(s) {', '.join(map(str, undefined))} are not defined in the task definitions "
                             f"(defined: {', '.join(map(str, task_defs))})")
        group_sizes = dict(group_sizes or {})
        unknown = sorted(set(group_sizes) - set(names))
        if unknown:
            raise ValueError(f"group sizes given for unknown task(s) {', '.join(unknown)}")
        tasks = [task_from_original(name, task_defs[name], san, group_sizes.get(name)) for name in names]
        return cls(encoder=encoder_config, tasks=tasks, **kwargs)


def encoder_config_from_dict(values: dict[str, Any]) -> PretrainedConfig:
    """The encoder's config from its dict (`model_type` picks the class; BERT without one)."""
    values = dict(values)
    model_type = values.pop("model_type", "bert")
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"encoder model_type {quoted(model_type)} is not a model type transformers knows")
    return CONFIG_MAPPING[model_type](**values)


def max_input_length(encoder: PretrainedConfig) -> int | None:
    """The most tokens a row may hold for the encoder: its positions, less RoBERTa's family's offset; None for
    encoders without a position limit in their config."""
    positions = getattr(encoder, "max_position_embeddings", None)
    if positions is None:
        return None
    if encoder.model_type in OFFSET_POSITION_TYPES:
        return positions - (encoder.pad_token_id or 0) - 1
    return positions


def check_encoder(config: PretrainedConfig) -> None:
    """`ValueError` with one line unless `config` is a bidirectional encoder the heads can read: a model type with a
    masked-LM head (what sets BERT's family apart from causal language models, some of which have sequence or token
    classifiers too), not an encoder-decoder, not set up as a decoder, with sane sizes."""
    if not isinstance(config, PretrainedConfig):
        raise ValueError(f"the encoder must be a transformers config, got {type(config).__name__}")
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"the encoder must be an encoder model, but {config.model_type!r} is an encoder-decoder")
    if config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES or getattr(config, "is_decoder", False):
        raise ValueError(f"the encoder must be a bidirectional encoder (BERT, RoBERTa, DeBERTa, ELECTRA, ModernBERT, "
                         f"...), but {config.model_type!r} is not one (a causal language model?)")
    epsilons = [name for name in ENCODER_EPSILONS if hasattr(config, name)]
    if epsilons and hasattr(config, "num_attention_heads"):
        _check_sizes(config, "encoder", [name for name in ENCODER_SIZES if hasattr(config, name)], "hidden_size",
                     "num_attention_heads", epsilons[0])


def task_from_original(name: str, definition: dict[str, Any], san: dict[str, Any] | None = None,
                       group_size: int | None = None) -> dict[str, Any]:
    """One task of the original's task-definition format, as a task of `MTDNNConfig.tasks`."""
    if not isinstance(definition, dict):
        raise ValueError(f"task {name}: the definition must be a mapping, got {type(definition).__name__}")
    unknown = sorted(set(definition) - set(ORIGINAL_TASK_KEYS))
    if unknown:
        raise ValueError(f"task {name}: unknown key(s) {', '.join(map(str, unknown))} in the task definition")
    missing = [key for key in ("task_type", "n_class") if key not in definition]
    if missing:
        raise ValueError(f"task {name}: the task definition lacks {' and '.join(missing)}")
    original_type = definition["task_type"]
    if original_type not in ORIGINAL_TASK_TYPES:
        raise ValueError(f"task {name}: task_type {quoted(original_type)} is not supported "
                         f"(supported: {', '.join(ORIGINAL_TASK_TYPES)})")
    task_type = ORIGINAL_TASK_TYPES[original_type]
    loss = definition.get("loss")
    if loss is not None and loss != ORIGINAL_LOSSES[task_type]:
        why = " (the original's SpanYNCeCriterion reads a yes/no output its task never returns)" \
            if loss == "SpanYNCeCriterion" else ""
        raise ValueError(f"task {name}: loss {loss} is not supported for {original_type} tasks "
                         f"(the port computes {ORIGINAL_LOSSES[task_type]}){why}")
    enable_san = definition.get("enable_san", False)
    if not isinstance(enable_san, bool):
        raise ValueError(f"task {name}: enable_san must be true or false, got {quoted(enable_san)}")
    task = {
        "name": name,
        "type": task_type,
        "num_labels": definition["n_class"],
        "head": "san" if enable_san else "linear",
        "dropout": definition.get("dropout_p") if definition.get("dropout_p") is not None else DEFAULT_DROPOUT,
        "labels": definition.get("labels"),
        "metrics": list(definition["metric_meta"]) if definition.get("metric_meta") else None,
        "kd_loss": definition.get("kd_loss"),
        "split_names": definition.get("split_names"),
    }
    if "data_format" in definition:
        task["data_format"] = definition["data_format"]
    if task_type == "ranking" and group_size is not None:
        task["group_size"] = group_size
    if enable_san and san:
        task["san"] = dict(san)
    return normalize_task({k: v for k, v in task.items() if v is not None})


def normalize_task(task: dict[str, Any]) -> dict[str, Any]:
    """A task of `MTDNNConfig.tasks` with its defaults filled in; `ValueError` naming the task for a bad setting."""
    if not isinstance(task, dict):
        raise ValueError(f"each task must be a dict, got {type(task).__name__}")
    name = task.get("name")
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name) or hasattr(nn.ModuleDict, name):
        raise ValueError(f"task name {quoted(name)} is not valid (letters, digits, '-' and '_', not a Python attribute "
                         "of nn.ModuleDict)")
    unknown = sorted(set(task) - set(TASK_KEYS))
    if unknown:
        raise ValueError(f"task {name}: unknown setting(s) {', '.join(map(str, unknown))}")

    def fail(message: str) -> NoReturn:
        raise ValueError(f"task {name}: {message}")

    task_type = task.get("type")
    if task_type not in TASK_TYPES:
        fail(f"type {quoted(task_type)} is not supported (supported: {', '.join(TASK_TYPES)})")
    num_labels = task.get("num_labels")
    if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
        fail(f"num_labels must be a positive integer, got {quoted(num_labels)}")
    if task_type in ("classification", "sequence_labeling") and num_labels < 2:
        fail(f"a {task_type.replace('_', ' ')} task needs at least 2 labels, got {num_labels}")
    if task_type in SPAN_TASK_TYPES and num_labels != 2:
        fail(f"a {task_type} task scores each token as the answer's start and end, so num_labels must be 2, "
             f"got {num_labels}")
    if task_type in ("regression", "ranking") and num_labels != 1:
        fail(f"a {task_type} task scores each row with one number, so num_labels must be 1, got {num_labels}")
    head = task.get("head", "linear")
    if head not in HEAD_TYPES:
        fail(f"head {quoted(head)} is not supported (supported: {', '.join(HEAD_TYPES)})")
    dropout = task.get("dropout", DEFAULT_DROPOUT)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        fail(f"dropout must be a number in [0, 1), got {quoted(dropout)}")
    data_format = task.get("data_format", TYPE_DATA_FORMATS.get(task_type, "PremiseAndOneHypothesis"))
    if data_format not in DATA_FORMATS:
        fail(f"data_format {quoted(data_format)} is not supported (supported: {', '.join(DATA_FORMATS)})")
    if data_format != TYPE_DATA_FORMATS.get(task_type, data_format) or (
            task_type not in TYPE_DATA_FORMATS and data_format in TYPE_DATA_FORMATS.values()):
        fail(f"data_format {data_format} does not fit a {task_type} task (ranking reads PremiseAndMultiHypothesis, "
             "sequence labeling Seqence, span tasks CLUE_SPAN, the others PremiseOnly or PremiseAndOneHypothesis)")
    if head == "san" and (task_type != "classification" or data_format not in PAIR_FORMATS):
        fail("a SAN head classifies sentence pairs: it needs type classification and a pair data_format")
    labels = task.get("labels")
    if labels is not None:
        if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
            fail(f"labels must be a list of strings, got {quoted(labels)}")
        if task_type in ("classification", "sequence_labeling") and len(labels) != num_labels:
            fail(f"{len(labels)} label names for {num_labels} labels")
        if len(set(labels)) != len(labels):
            fail("label names must be unique")
    elif task_type == "sequence_labeling":
        fail("a sequence labeling task needs its tag names (labels), e.g. [O, B-PER, I-PER]")
    metrics = task.get("metrics", DEFAULT_METRICS[task_type])
    if not isinstance(metrics, list) or any(metric not in METRICS for metric in metrics):
        fail(f"metrics must be a list of {', '.join(METRICS)}; got {quoted(metrics)}")
    allowed = TOKEN_TASK_METRICS.get(task_type)
    if allowed is not None and any(metric not in allowed for metric in metrics):
        fail(f"a {task_type} task reports {' or '.join(allowed)}, not {', '.join(metrics)}")
    split_names = task.get("split_names", ["train", "dev", "test"])
    if not isinstance(split_names, list) or not all(isinstance(split, str) for split in split_names):
        fail(f"split_names must be a list of strings, got {quoted(split_names)}")
    kd_loss = task.get("kd_loss")
    if kd_loss is not None and not isinstance(kd_loss, str):
        fail(f"kd_loss must be a criterion name, got {quoted(kd_loss)}")
    normalized = {"name": name, "type": task_type, "num_labels": num_labels, "head": head, "dropout": float(dropout),
                  "data_format": data_format, "labels": labels, "metrics": list(metrics), "kd_loss": kd_loss,
                  "split_names": split_names}
    if task_type == "ranking":
        group_size = task.get("group_size", DEFAULT_GROUP_SIZE)
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
            fail(f"group_size must be an integer >= 2, got {quoted(group_size)}")
        normalized["group_size"] = group_size
    elif "group_size" in task:
        fail("group_size applies to ranking tasks only")
    if head == "san":
        normalized["san"] = _normalize_san(task.get("san") or {}, fail)
    elif task.get("san"):
        fail("SAN settings given for a linear head")
    if task_type in SPAN_TASK_TYPES:
        longest = task.get("max_answer_length", DEFAULT_MAX_ANSWER_LENGTH)
        if isinstance(longest, bool) or not isinstance(longest, int) or longest < 1:
            fail(f"max_answer_length must be a positive integer, got {quoted(longest)}")
        normalized["max_answer_length"] = longest
    elif "max_answer_length" in task:
        fail("max_answer_length applies to span tasks only")
    if task_type == "span_classification_yn":
        threshold = task.get("null_score_diff_threshold", 0.0)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
            fail(f"null_score_diff_threshold must be a finite number, got {quoted(threshold)}")
        normalized["null_score_diff_threshold"] = float(threshold)
    elif "null_score_diff_threshold" in task:
        fail("null_score_diff_threshold applies to span_classification_yn tasks only")
    return normalized


def _normalize_san(san, fail):
    if not isinstance(san, dict):
        fail(f"san must be a dict, got {type(san).__name__}")
    unknown = sorted(set(san) - set(DEFAULT_SAN))
    if unknown:
        fail(f"unknown SAN setting(s) {', '.join(map(str, unknown))}")
    san = {**DEFAULT_SAN, **san}
    turns = san["num_turns"]
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        fail(f"san num_turns must be a positive integer, got {quoted(turns)}")
    if san["memory_type"] not in (0, 1):
        fail(f"san memory_type must be 0 (last turn) or 1 (average of turns), got {quoted(san['memory_type'])}")
    drop = san["memory_dropout"]
    if isinstance(drop, bool) or not isinstance(drop, (int, float)) or not 0 <= drop < 1:
        fail(f"san memory_dropout must be a number in [0, 1), got {quoted(drop)}")
    if san["merge_opt"] not in (0, 1):
        fail(f"san merge_opt must be 0 or 1, got {quoted(san['merge_opt'])}")
    if san["rnn_type"] not in RNN_TYPES:
        fail(f"san rnn_type {quoted(san['rnn_type'])} is not supported (supported: {', '.join(RNN_TYPES)})")
    return {**san, "memory_dropout": float(drop)}


# Copied from hf_ext.models.optimus.configuration_optimus._check_sizes
def _check_sizes(config, side, sizes, width, heads, epsilon):
    """Sizes must be positive integers (not strings or booleans, which a hand-edited config.json may hold), the
    width must split into the heads, and the LayerNorm epsilon must be a positive finite number."""
    for name in sizes:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{side} {name} must be a positive integer, got {value!r}")
    if getattr(config, width) % getattr(config, heads):
        raise ValueError(f"{side} {width} {getattr(config, width)} is not divisible by {heads} "
                         f"{getattr(config, heads)}")
    if epsilon is None:
        return
    value = getattr(config, epsilon)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{side} {epsilon} must be a positive finite number, got {value!r}")


# Copied from hf_ext.errors.quoted
def quoted(value: object) -> str:
    """`repr(value)` for an error message, cut to `MAX_QUOTED_CHARS` characters: a line that quotes user input stays
    short whatever the input, and building it costs little (reprlib shows a few items of each container and a few
    levels, so a structure that YAML aliases make enormous is never expanded)."""
    text = _SHORT_REPR.repr(value)
    return text if len(text) <= MAX_QUOTED_CHARS else text[:MAX_QUOTED_CHARS - 3] + "..."



__all__ = ["MTDNNConfig"]
