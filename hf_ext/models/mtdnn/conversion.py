"""Conversion of original MT-DNN checkpoints (namisan/mt-dnn `MTDNNModel.save`) into an `MTDNNModel` folder.

The checkpoint is `torch.save({"state": network.state_dict(), "optimizer": ..., "config": opt})`, where `opt` holds
train.py's options, the encoder's config (flat: BERT's, RoBERTa's, DeBERTa's or ELECTRA's, by `encoder_type`) and
`task_def_list`: pickled `experiments.exp_def.TaskDef` objects with the original's enums and `Vocabulary` label maps.
It is read by torch's weights-only unpickler with those classes mapped to inert stand-ins (plain enums and attribute
holders), so nothing in the pickle is executed.

Task names are the `--train_datasets` prefixes (train.py's task ids follow their order); the task definitions come from
the checkpoint or from the original's task-definition YAML (`--task-def`).
"""

import argparse
import collections
import enum
import pickle
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import (
    AutoTokenizer,
    BertConfig,
    DebertaConfig,
    ElectraConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    RobertaConfig,
)
from transformers.utils import logging

from ...checkpoints import safe_torch_load
from ...conversion import (
    Compared,
    ParityCheck,
    Tolerance,
    add_output_arguments,
    compare_with_reference,
    exact_check,
    load_reference,
    print_parity,
    require_parity,
)
from ...errors import HfExtError, one_line
from ...export import file_record, write_model_folder
from . import ENTRY, MTDNNConfig, MTDNNModel
from .configuration_mtdnn import SPAN_TASK_TYPES, TOKEN_TASK_TYPES
from .task_defs import config_from_task_def_yaml

logger = logging.get_logger(__name__)

BERT_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                    "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id",
                    "position_embedding_type")
REQUIRED_BERT_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
DEBERTA_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                       "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                       "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id", "relative_attention",
                       "max_relative_positions", "position_biased_input", "pos_att_type", "embedding_size")
# buffers and the encoder's pooler (BERT's, RoBERTa's): rebuilt by the encoder, or never read by the original (its
# heads have their own pooler)
DROPPED_ENCODER_KEYS = re.compile(r"^bert\.(embeddings\.(position_ids|token_type_ids)|pooler\..*)$")
HEAD_KEY = re.compile(r"^scoring_list\.(\d+)\.(.+)$")
# original SANClassifier parameter -> MTDNNSANHead parameter
SAN_KEYS = {"1.query_wsum.att.linear.": "hypothesis_attn.", "1.attn.score_func.linear.": "premise_attn.",
            "1.rnn.": "rnn.", "1.classifier.proj.": "classifier."}
LINEAR_KEYS = {"0.dense.": "dense.", "1.": "out_proj."}
# the original's token heads (SeqenceLabeling, SpanClassification[YN]): nn.Sequential(Dropout, Linear) when the
# task's dropout_p > 0, a bare nn.Linear when it is 0
TOKEN_HEAD_LAYOUTS = {"1.": "nn.Sequential(nn.Dropout(dropout_p), nn.Linear), dropout_p > 0",
                      "": "nn.Linear, dropout_p = 0"}
UNUSED_SAN_KEYS = re.compile(r"^(0\.dense\.(weight|bias)|1\.alpha)$")  # the SAN task's unread Pooler, a constant


# Stand-ins for the original's enums (data_utils.task_def, data_utils.metrics, mt_dnn.loss at HEAD 3228e7c): the same
# names and values, nothing else. Pickles refer to members by value (`TaskType(1)`) or, from some Python 3.11
# releases, by name (`getattr(TaskType, "Classification")`).
class OriginalTaskType(enum.IntEnum):
    Classification = 1
    Regression = 2
    Ranking = 3
    SpanClassification = 4
    SpanClassificationYN = 5
    SeqenceLabeling = 6
    MaskLM = 7
    SpanSeqenceLabeling = 8
    SeqenceGeneration = 9
    SeqenceGenerationMRC = 10
    EncSeqenceGeneration = 11
    ClozeChoice = 12


class OriginalDataFormat(enum.IntEnum):
    PremiseOnly = 1
    PremiseAndOneHypothesis = 2
    PremiseAndMultiHypothesis = 3
    Seqence = 4
    MLM = 5
    CLUE_CLASSIFICATION = 6
    CLUE_SPAN = 7
    CLUE_SEQ = 8
    CLUE_GEN = 9
    ClozeChoice = 10


class OriginalEncoderModelType(enum.IntEnum):
    BERT = 1
    ROBERTA = 2
    XLNET = 3
    SAN = 4
    XLM = 5
    DEBERTA = 6
    ELECTRA = 7
    T5 = 8
    T5G = 9
    MSRT5G = 10
    MSRT5 = 11
    MSRLONGT5G = 12
    MSRLONGT5 = 13


class OriginalMetric(enum.Enum):
    ACC = 0
    F1 = 1
    MCC = 2
    Pearson = 3
    Spearman = 4
    AUC = 5
    SeqEval = 7
    EmF1 = 8
    F1MAC = 9
    F1MIC = 10
    CMAT = 11
    EmF12 = 12
    SeqEvalList = 13


class OriginalLossCriterion(enum.IntEnum):
    CeCriterion = 0
    MseCriterion = 1
    RankCeCriterion = 2
    SpanCeCriterion = 3
    SeqCeCriterion = 4
    MlmCriterion = 5
    KlCriterion = 6
    SymKlCriterion = 7
    NsKlCriterion = 8
    NsSymKlCriterion = 9
    JSCriterion = 10
    HLCriterion = 11


ORIGINAL_ENUMS = {
    "data_utils.task_def.TaskType": OriginalTaskType,
    "data_utils.task_def.DataFormat": OriginalDataFormat,
    "data_utils.task_def.EncoderModelType": OriginalEncoderModelType,
    "data_utils.metrics.Metric": OriginalMetric,
    "mt_dnn.loss.LossCriterion": OriginalLossCriterion,
}


def original_enum_member(enum_class: type[enum.IntEnum], name: str) -> enum.IntEnum:
    """Stand-in for `builtins.getattr` in the pickle: only looks up members of the enum stand-ins by name."""
    if enum_class not in ORIGINAL_ENUMS.values():
        raise pickle.UnpicklingError(f"GLOBAL builtins.getattr on {type(enum_class).__name__} (only enum members "
                                     "of the original code are looked up)")
    if name not in enum_class.__members__:
        raise ValueError(f"{name!r} is not a member of the original's {enum_class.__name__[len('Original'):]}")
    return enum_class[name]


class OriginalTaskDef:
    """Stand-in for `experiments.exp_def.TaskDef`, a dict subclass whose items are repr strings and whose real values
    are attributes. The unpickler builds a plain `OrderedDict` instead (it fills in items and attributes of that type
    only); `vars()` of it gives the real values."""

    def __new__(cls, *args):
        return collections.OrderedDict()


class OriginalVocabulary:
    """Stand-in for `data_utils.vocab.Vocabulary`: only receives its attributes (`tok2ind`, `ind2tok`, `neat`)."""


def vocabulary_labels(vocabulary: OriginalVocabulary) -> list[str]:
    """The label names of an `OriginalVocabulary`, in id order."""
    index = vars(vocabulary).get("ind2tok")
    if not isinstance(index, dict) or not all(isinstance(k, int) and isinstance(v, str) for k, v in index.items()):
        raise TypeError("its label vocabulary has no id -> label map")
    return [label for _, label in sorted(index.items())]


def original_globals() -> list[tuple[Callable[..., object], str]]:
    """The stand-ins as `(object, "original.module.Name")` pairs for `safe_torch_load(extra_globals=...)`."""
    return [*((stand_in, path) for path, stand_in in ORIGINAL_ENUMS.items()),
            (original_enum_member, "builtins.getattr"),
            (OriginalTaskDef, "experiments.exp_def.TaskDef"),
            (OriginalVocabulary, "data_utils.vocab.Vocabulary")]


def looks_original(path: Path) -> bool:
    """Whether `path` may be what the original's `MTDNNModel.save` writes, by its name: a .pt file (what it holds is
    checked when it is read)."""
    return path.is_file() and path.suffix == ".pt"


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The original checkpoint's `(state, opt)`, read without executing anything."""
    logger.info(f"reading {path}")
    checkpoint = safe_torch_load(path, "checkpoint", extra_globals=original_globals())
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state"), dict):
        raise HfExtError(f"checkpoint {path} is not an MT-DNN checkpoint (no 'state' dict of weights)")
    state, opt = checkpoint["state"], checkpoint.get("config")
    if not isinstance(opt, dict):
        raise HfExtError(f"checkpoint {path} is not an MT-DNN checkpoint (no 'config' dict of options)")
    if not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise HfExtError(f"checkpoint {path}: 'state' holds something other than tensors")
    if "bert.embeddings.word_embeddings.weight" not in state:
        raise HfExtError(f"checkpoint {path}: no bert.embeddings.word_embeddings.weight in 'state' (the encoder's "
                         "weights, SANBertNetwork.bert)")
    return state, opt


def head_indices(state: dict[str, torch.Tensor], path: str | Path) -> list[int]:
    """The task ids that have weights (`scoring_list.<i>.*`), checked to be 0..n-1."""
    indices = sorted({int(m.group(1)) for m in map(HEAD_KEY.match, state) if m})
    if not indices:
        raise HfExtError(f"checkpoint {path} holds no task heads (scoring_list.*): an encoder-only checkpoint?")
    if indices != list(range(len(indices))):
        raise HfExtError(f"checkpoint {path}: task heads {indices} are not numbered 0..{len(indices) - 1}")
    return indices


def _enum_name(value):
    return value.name if isinstance(value, enum.Enum) else value


def task_defs_from_checkpoint(opt: dict[str, Any], names: list[str], path: str | Path,
                              ) -> dict[str, dict[str, Any]]:
    """`opt["task_def_list"]` as task definitions in the YAML format, keyed by task name."""
    entries = opt.get("task_def_list")
    if not isinstance(entries, list) or not entries:
        raise HfExtError(f"checkpoint {path} holds no task definitions (config['task_def_list']); pass --task-def "
                         "with the task_def.yml used for training")
    if len(entries) != len(names):
        raise HfExtError(f"checkpoint {path}: {len(entries)} task definitions for {len(names)} tasks "
                         f"({', '.join(names)})")
    task_defs = {}
    for name, entry in zip(names, entries, strict=True):
        fields = getattr(entry, "__dict__", None) or entry
        if not isinstance(fields, dict):
            raise HfExtError(f"checkpoint {path}: the task definition of {name} is a {type(entry).__name__}, "
                             "not a TaskDef")
        vocabulary = fields.get("label_vocab")
        try:
            definition = {
                "task_type": _enum_name(fields.get("task_type")),
                "n_class": fields.get("n_class"),
                "data_format": _enum_name(fields.get("data_type")),
                "enable_san": fields.get("enable_san"),
                "dropout_p": fields.get("dropout_p"),
                "labels": vocabulary_labels(vocabulary) if isinstance(vocabulary, OriginalVocabulary) else None,
                "metric_meta": [_enum_name(metric) for metric in fields.get("metric_meta") or ()],
                "loss": _enum_name(fields.get("loss")),
                "kd_loss": _enum_name(fields.get("kd_loss")),
                "split_names": list(fields["split_names"]) if fields.get("split_names") else None,
            }
        except TypeError as error:
            raise HfExtError(f"checkpoint {path}: the task definition of {name} is malformed ({error})") from None
        task_defs[name] = {key: value for key, value in definition.items() if value not in (None, [])}
    return task_defs


def train_task_names(opt: dict[str, Any]) -> list[str] | None:
    """The tasks' names in task-id order: the prefixes of train.py's `--train_datasets`, as train.py derives them;
    None when the options do not list them."""
    datasets = opt.get("train_datasets")
    if not isinstance(datasets, list) or not datasets:
        return None
    return list(dict.fromkeys(str(dataset).split("_")[0] for dataset in datasets))


class EncoderFormat(NamedTuple):
    """How one of the original's `--encoder_type`s is read: its name, transformers config class (the encoder model
    the original builds is `AutoModel`'s for it: BertModel, RobertaModel, DebertaModel, ElectraModel) and the keys of
    that config train.py merged flat into `opt`."""

    name: str
    config_class: type[PretrainedConfig]
    keys: tuple[str, ...]
    # the pair layout its tokenizer writes, for the model card (prepro_std.py keeps the tokenizer's segment ids)
    pair_inputs: str


BERT_PAIRS = "`[CLS] premise [SEP] hypothesis [SEP]` with segment ids 0 then 1"
# the original's encoder types (`data_utils.task_def.EncoderModelType`) that convert; the others are refused
ENCODER_FORMATS = {
    OriginalEncoderModelType.BERT: EncoderFormat("BERT", BertConfig, BERT_CONFIG_KEYS, BERT_PAIRS),
    OriginalEncoderModelType.ROBERTA: EncoderFormat(
        "RoBERTa", RobertaConfig, (*BERT_CONFIG_KEYS, "bos_token_id", "eos_token_id"),
        "`<s> premise </s></s> hypothesis </s>` with segment ids 0 throughout as the original's data hold them "
        "(RoBERTa's tokenizer returns none; a SAN head needs segment id 1 on the hypothesis to find it)"),
    OriginalEncoderModelType.DEBERTA: EncoderFormat("DeBERTa", DebertaConfig, DEBERTA_CONFIG_KEYS, BERT_PAIRS),
    OriginalEncoderModelType.ELECTRA: EncoderFormat("ELECTRA", ElectraConfig, (*BERT_CONFIG_KEYS, "embedding_size"),
                                                    BERT_PAIRS),
}


def encoder_format(opt: dict[str, Any], path: str | Path) -> EncoderFormat:
    """The format of the checkpoint's `encoder_type` (train.py's `--encoder_type`: an int, or the enum when left at
    its default); refuses the types that do not convert."""
    encoder_type = opt.get("encoder_type", OriginalEncoderModelType.BERT)
    if isinstance(encoder_type, bool) or not isinstance(encoder_type, int):
        raise HfExtError(f"checkpoint {path}: encoder_type {encoder_type!r} is not one of the original's encoder "
                         "types (an int or EncoderModelType)")
    supported = ", ".join(member.name for member in ENCODER_FORMATS)
    known = OriginalEncoderModelType._value2member_map_.get(int(encoder_type))
    if known is None:
        raise HfExtError(f"checkpoint {path}: encoder_type {int(encoder_type)} is not one of the original's encoder "
                         f"types (supported: {supported})")
    if known not in ENCODER_FORMATS:
        raise HfExtError(f"checkpoint {path}: encoder_type {known.name} is not supported (supported: {supported})")
    return ENCODER_FORMATS[known]


def encoder_config(opt: dict[str, Any], path: str | Path) -> PretrainedConfig:
    """The encoder config train.py merged flat into `opt` (BertConfig, RobertaConfig, DebertaConfig or ElectraConfig
    by `encoder_type`)."""
    encoder = encoder_format(opt, path)
    model_type = opt.get("model_type")
    if model_type is not None and model_type != encoder.config_class.model_type:
        raise HfExtError(f"checkpoint {path}: encoder_type {encoder.name} but the config's model_type is "
                         f"{model_type!r}")
    missing = [key for key in REQUIRED_BERT_KEYS if key not in opt]
    if missing:
        raise HfExtError(f"checkpoint {path}: the config lacks the {encoder.name} settings {', '.join(missing)}")
    try:
        config = encoder.config_class(**{key: opt[key] for key in encoder.keys if key in opt})
        MTDNNConfig(encoder=config)  # the config's own checks of the encoder, before any task is read
    except (ValueError, TypeError, StrictDataclassError) as error:
        raise HfExtError(f"checkpoint {path}: invalid {encoder.name} settings: {one_line(error)}") from None
    return config


def san_settings(opt: dict[str, Any]) -> dict[str, Any]:
    """train.py's `answer_*` options as `MTDNNConfig` SAN settings (its defaults where absent)."""
    return {"num_turns": opt.get("answer_num_turn", 5), "memory_type": opt.get("answer_mem_type", 1),
            "memory_dropout": opt.get("answer_mem_drop_p", 0.1), "merge_opt": opt.get("answer_merge_opt", 1),
            "rnn_type": opt.get("answer_rnn_type", "gru")}


def check_san_options(opt: dict[str, Any], path: str | Path) -> None:
    """Refuse SAN variants the port does not implement (their weights differ, or the original crashes on them)."""
    unsupported = [(name, opt.get(name), ok) for name, ok in (("answer_att_type", "bilinear"),
                                                               ("answer_weight_norm_on", False))
                   if opt.get(name, ok) != ok]
    if opt.get("mem_cum_type") == "mlp":
        unsupported.append(("mem_cum_type", "mlp", "simple"))
    if unsupported:
        raise HfExtError(f"checkpoint {path}: unsupported SAN option(s) " + ", ".join(
            f"{name}={value!r} (supported: {ok!r})" for name, value, ok in unsupported))


def build_config(state: dict[str, torch.Tensor], opt: dict[str, Any], path: str | Path,
                 task_def: str | Path | None = None, group_sizes: Mapping[str, int] | None = None,
                 default_task: str | None = None) -> MTDNNConfig:
    """The `MTDNNConfig` of an original checkpoint; the task definitions from `task_def` (YAML) when given."""
    count = len(head_indices(state, path))
    names = train_task_names(opt)
    if names is None and task_def is None:
        raise HfExtError(f"checkpoint {path} does not list its train_datasets, so its tasks have no names: pass "
                         f"--task-def with exactly its {count} tasks in training order")
    if names is not None and len(names) != count:
        raise HfExtError(f"checkpoint {path} has {count} task heads but {len(names)} training tasks "
                         f"({', '.join(names)})")
    encoder = encoder_config(opt, path)
    kwargs: dict[str, Any] = {"task_names": names, "san": san_settings(opt), "group_sizes": group_sizes,
              "default_task": default_task}
    try:
        if task_def is not None:
            config = config_from_task_def_yaml(Path(task_def), encoder, **kwargs)
        else:
            assert names is not None  # without task definitions the checkpoint names its tasks (checked above)
            config = MTDNNConfig.from_task_defs(task_defs_from_checkpoint(opt, names, path), encoder, **kwargs)
    except ValueError as error:
        source = task_def if task_def is not None else f"{path} (config['task_def_list'])"
        raise HfExtError(f"task definitions of {source}: {error}") from None
    if len(config.tasks) != count:
        raise HfExtError(f"{task_def} defines {len(config.tasks)} tasks, the checkpoint has {count} task heads")
    if any(task["head"] == "san" for task in config.tasks):
        check_san_options(opt, path)
    return config


def convert_state_dict(state: dict[str, torch.Tensor], config: MTDNNConfig,
                       ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Original keys -> `MTDNNModel` keys; returns `(state_dict, dropped_keys)`. Checks each head against its task's
    head type and label count first."""
    converted, dropped = {}, []
    heads: collections.defaultdict[int, dict[str, torch.Tensor]] = collections.defaultdict(dict)
    for key, tensor in state.items():
        match = HEAD_KEY.match(key)
        if match:
            heads[int(match.group(1))][match.group(2)] = tensor
        elif DROPPED_ENCODER_KEYS.match(key):
            dropped.append(key)
        else:
            converted[key] = tensor
    problems = []
    hidden_size = config.encoder.hidden_size
    for index, task in enumerate(config.tasks):
        weights = heads[index]
        where = f"task {task['name']} (scoring_list.{index})"
        if task["type"] in TOKEN_TASK_TYPES:
            problems += convert_token_head(weights, task, index, hidden_size, converted)
            continue
        if "weight" in weights:
            raise HfExtError(f"{where}: the checkpoint has the pre-2021 head layout for a {task['type']} task "
                             "(shared tanh BERT pooler, scoring_list.<i>.weight), which is not supported")
        is_san = any(key.startswith("1.query_wsum.") for key in weights)
        if is_san != (task["head"] == "san"):
            raise HfExtError(f"{where}: the task definition says a {task['head']} head, the checkpoint holds a "
                             f"{'SAN' if is_san else 'linear'} head")
        label_key = "1.classifier.proj.weight" if is_san else "1.weight"
        if label_key in weights and weights[label_key].shape[0] != task["num_labels"]:
            raise HfExtError(f"{where}: the task definition says {task['num_labels']} label(s), the weights "
                             f"scoring_list.{index}.{label_key} have {weights[label_key].shape[0]}")
        renames = SAN_KEYS if is_san else LINEAR_KEYS
        for key, tensor in weights.items():
            if is_san and UNUSED_SAN_KEYS.match(key):
                dropped.append(f"scoring_list.{index}.{key}")
                continue
            prefix = next((p for p in renames if key.startswith(p)), None)
            # unknown keys keep their original name, so that the key check reports them
            new_key = f"heads.{task['name']}.{renames[prefix]}{key[len(prefix):]}" if prefix else \
                f"scoring_list.{index}.{key}"
            converted[new_key] = tensor
    if problems:
        raise HfExtError("; ".join(problems))
    return converted, dropped


def convert_token_head(weights: dict[str, torch.Tensor], task: dict[str, Any], index: int, hidden_size: int,
                       converted: dict[str, torch.Tensor]) -> list[str]:
    """Put a token head's weights (either layout of TOKEN_HEAD_LAYOUTS) into `converted` as `heads.<task>.out_proj`;
    returns its problems, one clause each (nothing is converted then; the caller joins them into one error line)."""
    where = f"task {task['name']} (scoring_list.{index}, {task['type']})"
    prefix = next((p for p in TOKEN_HEAD_LAYOUTS if {f"{p}weight", f"{p}bias"} <= set(weights)), None)
    if prefix is None or set(weights) != {f"{prefix}weight", f"{prefix}bias"}:
        found = ", ".join(f"scoring_list.{index}.{key}" for key in sorted(weights)) or "no weights"
        what = "a sentence-level head" if any(key.startswith("0.dense.") or key.startswith("1.query_wsum.")
                                              for key in weights) else "other weights"
        return [f"{where}: the task definition says a token head (a linear layer on every token, "
                f"scoring_list.{index}.[1.]weight and .bias), the checkpoint holds {what} ({found})"]
    weight, bias = weights[f"{prefix}weight"], weights[f"{prefix}bias"]
    name = f"scoring_list.{index}.{prefix}weight"
    problems = []
    if weight.dim() != 2 or bias.dim() != 1 or weight.shape[0] != bias.shape[0]:
        return [f"{where}: {name} {tuple(weight.shape)} and its bias {tuple(bias.shape)} are not a linear layer"]
    if weight.shape[0] != task["num_labels"]:
        wanted = "2 (start, end)" if task["type"] in SPAN_TASK_TYPES else str(task["num_labels"])
        problems.append(f"{where}: the task definition says {wanted} output(s) (n_class), the weights {name} have "
                        f"{weight.shape[0]}")
    if weight.shape[1] != hidden_size:
        problems.append(f"{where}: {name} reads {weight.shape[1]} features, the encoder's hidden size is "
                        f"{hidden_size}")
    if not problems:
        converted[f"heads.{task['name']}.out_proj.weight"] = weight
        converted[f"heads.{task['name']}.out_proj.bias"] = bias
    return problems


def tokenizer_note(encoder: EncoderFormat, opt: dict[str, Any]) -> str:
    """The card's note when no tokenizer is saved: which one the checkpoint's encoder was trained with, as far as the
    options say (train.py's `--bert_model_type` is BERT's and stays at its default for other encoders, whose
    tokenizer is the one of `--init_checkpoint`)."""
    if encoder.name == "BERT":
        return f"no tokenizer in the folder: use the one of {opt.get('bert_model_type', 'the BERT encoder')}"
    source = opt.get("init_checkpoint")
    origin = f" (train.py's --init_checkpoint was {source!r})" if isinstance(source, str) and source else ""
    return f"no tokenizer in the folder: use the {encoder.name} tokenizer of the encoder it was trained from{origin}"


def load_tokenizer(name_or_path: str | Path, vocab_size: int) -> PreTrainedTokenizerBase:
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise HfExtError(f"cannot load the tokenizer {name_or_path}: {str(error).splitlines()[0]}") from None
    if len(tokenizer) > vocab_size:
        raise HfExtError(f"the tokenizer {name_or_path} has {len(tokenizer)} tokens, the encoder's vocabulary "
                         f"{vocab_size}")
    return tokenizer


# the original's outputs a `--reference` file may hold per task, each with its tolerance (the fixture's: atol 5e-5,
# rtol 1e-4); masked attention scores are -inf and must be -inf at the same places
REFERENCE_TOLERANCE = Tolerance(atol=5e-5, rtol=1e-4)
REFERENCE_TOLERANCES = {
    **{name: REFERENCE_TOLERANCE for name in ("logits", "start_logits", "end_logits", "all_hidden_states",
                                              "group_scores", "san_h0", "san_x_sum", "san_h_state", "san_gru_out",
                                              "san_turn_scores")},
    "san_att_scores": Tolerance(atol=5e-5, rtol=1e-4, infinities=True),
}

# encoders whose hidden states at padded positions differ between the original's transformers (4.20) and this one,
# while every real token's agree: DeBERTa (v1) 4.20 zeroes the attention of padded queries, transformers 5 lets them
# attend to the real tokens. No head reads a padded position, so these compare at real tokens only.
PADDED_POSITIONS_DIFFER = frozenset({"deberta"})


def reference_outputs(model: MTDNNModel, reference: dict[str, torch.Tensor]) -> dict[str, Compared]:
    """The converted model's outputs beside the original's, per task found in `reference` (tensors named
    `<task>.input_ids`, `.token_type_ids`, `.attention_mask`, optionally `.premise_mask` and `.hypothesis_mask`, and
    outputs `.logits` (sequence labeling: `(B, L, C)`), `.start_logits` and `.end_logits` (span tasks, `(B, L)`),
    `.all_hidden_states`, `.group_scores`, `.san_*`)."""
    model.eval()
    compared = {}
    for task in model.config.task_names:
        if f"{task}.input_ids" not in reference:
            continue
        inputs = {name: reference[f"{task}.{name}"] for name in ("input_ids", "token_type_ids", "attention_mask",
                                                                 "premise_mask", "hypothesis_mask")
                  if f"{task}.{name}" in reference}
        with torch.no_grad():
            out = model(**inputs, task=task, output_hidden_states=True, output_san_states=True)
        # token tasks: logits (B, L, C) of sequence labeling; spans' start and end logits (B, L) each (their
        # logits are the two stacked, which the original's span output is not)
        span = model.config.task(task)["type"] in SPAN_TASK_TYPES
        ours = {"logits": None if span else out.logits, "start_logits": out.start_logits,
                "end_logits": out.end_logits, "all_hidden_states": torch.stack(out.hidden_states),
                "group_scores": out.group_logits}
        if out.san_states is not None:
            states = out.san_states
            ours.update(san_h0=states.initial_state, san_att_scores=states.attention_scores,
                        san_x_sum=states.premise_summaries, san_h_state=states.states,
                        san_gru_out=states.rnn_outputs, san_turn_scores=states.turn_logits)
        for name, value in ours.items():
            expected = reference.get(f"{task}.{name}")
            if value is None or expected is None:
                continue
            shown = name
            if (name == "all_hidden_states" and "attention_mask" in inputs
                    and model.config.encoder.model_type in PADDED_POSITIONS_DIFFER
                    and expected.shape[1:3] == inputs["attention_mask"].shape):
                real = inputs["attention_mask"].bool()
                value, expected, shown = value[:, real], expected[:, real], f"{name} (real tokens)"
            compared[f"{task} {shown}"] = Compared(value, expected, REFERENCE_TOLERANCES[name])
    return compared


def convert_mtdnn_checkpoint(checkpoint: str | Path, out: str | Path, *, task_def: str | Path | None = None,
                             group_sizes: Mapping[str, int] | None = None, default_task: str | None = None,
                             tokenizer: str | Path | None = None, reference: str | Path | None = None,
                             overwrite: bool = False, push_to_hub: str | None = None, private: bool = False,
                             token: str | None = None) -> list[ParityCheck]:
    """Convert an original MT-DNN checkpoint into a model folder at `out` (written atomically), with a model card
    that records the source, the tasks and the parity measured; optionally push it. Returns the parity checks; a
    check beyond its tolerance fails the conversion (`HfExtError`, nothing written)."""
    from ... import __version__
    from ...hub import card_data, push_folder, write_model_card
    from ...output import atomic_output_dir, check_output_dir

    check_output_dir(out, overwrite)
    reference_tensors = load_reference(reference) if reference is not None else None
    checkpoint = Path(checkpoint)
    state, opt = read_checkpoint(checkpoint)
    config = build_config(state, opt, checkpoint, task_def, group_sizes, default_task)
    weights, dropped = convert_state_dict(state, config)
    processor = load_tokenizer(tokenizer, config.encoder.vocab_size) if tokenizer is not None else None
    notes = [f"not converted (rebuilt or never read by the original): {', '.join(dropped)}"] if dropped else []
    ranking = [f"{t['name']}: {t['group_size']}" for t in config.tasks if t["type"] == "ranking"]
    if ranking and not group_sizes:
        notes.append(f"ranking group sizes (candidates per group) are not stored in the checkpoint; set to "
                     f"{', '.join(ranking)} (change with --group-size or config.tasks[i]['group_size'])")
    encoder = encoder_format(opt, checkpoint)
    if processor is None:
        notes.append(tokenizer_note(encoder, opt))
    with atomic_output_dir(out, overwrite) as staging:
        logger.info(f"writing {len(weights)} tensors")
        write_model_folder(staging, MTDNNModel, config, weights, ENTRY.auto_map, processor=processor,
                           source=str(checkpoint))
        logger.info("checking the written folder")
        model = MTDNNModel.from_pretrained(staging).eval()
        loaded = model.state_dict()
        parity = [exact_check("weights (round trip)",
                              max((loaded[k] - v).abs().max().item() for k, v in weights.items()))]
        if reference is not None:
            assert reference_tensors is not None  # loaded with the reference above
            logger.info(f"comparing with the original's outputs in {reference}")
            parity += compare_with_reference(model, reference_tensors, reference, reference_outputs)
        require_parity(parity, reference)
        write_model_card(
            staging, ENTRY.card_template,
            card_data(license="mit", tags=["mt-dnn", "multi-task", config.encoder.model_type, "text-classification"],
                      pipeline_tag="text-classification"),
            model_name=Path(out).name, repo_id=push_to_hub or Path(out).name, tasks=config.tasks,
            default_task=config.default_task or config.tasks[0]["name"],
            encoder_name=encoder.name, pair_inputs=encoder.pair_inputs,
            encoder_layers=config.encoder.num_hidden_layers, encoder_hidden=config.encoder.hidden_size,
            encoder_vocab=config.encoder.vocab_size,
            hf_ext_version=__version__, source_file=file_record(checkpoint),
            task_source=f"`{Path(task_def).name}`" if task_def is not None
            else "the checkpoint (config['task_def_list'])",
            parity=parity, notes=notes,
        )
    logger.info(f"wrote {out}")
    if push_to_hub:
        push_folder(out, push_to_hub, token=token, private=private)
    return parity


def _group_size(text):
    name, _, size = text.partition("=")
    if not name or not size.isdigit():
        raise argparse.ArgumentTypeError(f"expected TASK=K, got {text!r}")
    return name, int(size)


CONVERT_NAME = "mtdnn"  # hf-ext convert mtdnn
CONVERT_SUMMARY = "original MT-DNN checkpoints (namisan/mt-dnn)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`hf-ext convert mtdnn` arguments (also used by conversion/convert_mtdnn_original_checkpoint.py)."""
    parser.add_argument("checkpoint", type=Path, help="the original checkpoint (model_N.pt, saved by MTDNNModel.save)")
    parser.add_argument("out", help="folder to write (must not exist unless --overwrite)")
    parser.add_argument("--task-def", type=Path, help="the task-definition YAML used for training (glue_task_def.yml "
                        "format); default: the task definitions stored in the checkpoint")
    parser.add_argument("--group-size", type=_group_size, action="append", metavar="TASK=K",
                        help="candidates per group of a ranking task (default 2); repeatable")
    parser.add_argument("--default-task", help="the task AutoModelForSequenceClassification and pipelines use "
                        "(default: the first)")
    parser.add_argument("--tokenizer", help="tokenizer folder or Hub id to save with the model")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> None:
    parity = convert_mtdnn_checkpoint(
        args.checkpoint, args.out, task_def=args.task_def, group_sizes=dict(args.group_size or []),
        default_task=args.default_task, tokenizer=args.tokenizer, reference=args.reference, overwrite=args.overwrite,
        push_to_hub=args.push_to_hub, private=args.private, token=args.token,
    )
    print_parity(parity)
