"""Configuration of ERNIE 2.0 continual multi-task pre-training (Sun et al., AAAI 2020): an `ErnieConfig` (the
encoder, unchanged) plus the seven pre-training tasks, each with its own task id and task embedding."""

import math

from transformers import ErnieConfig

# The paper's pre-training tasks, in the order of its task table (word-, structure-, semantic-aware); the default
# task id of each is its position here.
PRETRAINING_TASKS = (
    "knowledge_masking",
    "capitalization",
    "token_document_relation",
    "sentence_reordering",
    "sentence_distance",
    "discourse_relation",
    "ir_relevance",
)
# predicted at every token (the MLM over basic/phrase/entity spans, and the two binary word tasks); the others
# classify the whole input from the pooled [CLS] vector
TOKEN_LEVEL_TASKS = ("knowledge_masking", "capitalization", "token_document_relation")
SENTENCE_DISTANCE_CLASSES = 3  # 0 adjacent, 1 same document, 2 other document
IR_RELEVANCE_CLASSES = 3  # 0 strong (clicked), 1 weak (shown, not clicked), 2 irrelevant (random)
MAX_REORDER_SEGMENTS = 8  # 46,233 classes already
ENCODER_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size", "task_type_vocab_size")


def validate_ernie_encoder(config: ErnieConfig) -> None:
    """One `ValueError` line for an `ErnieConfig` the encoder cannot be built from (`_check_sizes`). transformers' own
    config checks only the types."""
    _check_sizes(config, "encoder", ENCODER_SIZES, "hidden_size", "num_attention_heads", "layer_norm_eps")


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


def sentence_reordering_classes(max_segments: int) -> int:
    """K = sum over n = 1..m of n!: every order of every split of a paragraph into 1..m segments."""
    return sum(math.factorial(n) for n in range(1, max_segments + 1))


class Ernie2PreTrainingConfig(ErnieConfig):
    r"""
    An ERNIE encoder (every `ErnieConfig` field, with `use_task_id=True`) and the heads of the seven ERNIE 2.0
    pre-training tasks.

    Args:
        task_ids (`dict[str, int]`, *optional*): the task id (row of the task embedding) of every task in
            `PRETRAINING_TASKS`; by default each task's position there (knowledge_masking 0 ... ir_relevance 6). Every
            id must be below `task_type_vocab_size`.
        max_reorder_segments (`int`, defaults to 3): m, the most segments a paragraph is split into for sentence
            reordering, which has sum_{n=1..m} n! classes (m=3: 9). The paper does not give m.
        num_discourse_relations (`int`, defaults to 3): classes of the discourse-relation task (the paper does not
            give its class count).
        task_type_vocab_size (`int`, defaults to 7): rows of the task embedding.
    """

    model_type = "ernie2-pretraining"
    use_task_id: bool = True
    task_type_vocab_size: int = len(PRETRAINING_TASKS)
    task_ids: dict | None = None
    max_reorder_segments: int = 3
    num_discourse_relations: int = 3

    def __post_init__(self, **kwargs):
        if self.task_ids is None:
            self.task_ids = {task: index for index, task in enumerate(PRETRAINING_TASKS)}
        super().__post_init__(**kwargs)
        self.validate_pretraining_tasks()

    def validate_pretraining_tasks(self) -> None:
        """One `ValueError` line for settings the pre-training heads cannot run with."""
        validate_ernie_encoder(self)
        if not self.use_task_id:
            raise ValueError("ERNIE 2.0 pre-training gives every task its own task embedding: use_task_id must be true")
        if not isinstance(self.task_ids, dict) or set(self.task_ids) != set(PRETRAINING_TASKS):
            given = sorted(self.task_ids) if isinstance(self.task_ids, dict) else self.task_ids
            raise ValueError(f"task_ids must give an id to each of {', '.join(PRETRAINING_TASKS)}; got {given}")
        for task, task_id in self.task_ids.items():
            if isinstance(task_id, bool) or not isinstance(task_id, int) \
                    or not 0 <= task_id < self.task_type_vocab_size:
                raise ValueError(f"task id {task_id!r} of {task} is not in [0, task_type_vocab_size="
                                 f"{self.task_type_vocab_size})")
        for name, low, high in (("max_reorder_segments", 1, MAX_REORDER_SEGMENTS),
                                ("num_discourse_relations", 2, None)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low \
                    or (high is not None and value > high):
                bound = f"in [{low}, {high}]" if high is not None else f"at least {low}"
                raise ValueError(f"{name} must be an integer {bound}, got {value!r}")

    @property
    def task_num_labels(self) -> dict[str, int]:
        """Classes of every task's head (the vocabulary for knowledge masking)."""
        return {"knowledge_masking": self.vocab_size, "capitalization": 2, "token_document_relation": 2,
                "sentence_reordering": sentence_reordering_classes(self.max_reorder_segments),
                "sentence_distance": SENTENCE_DISTANCE_CLASSES,
                "discourse_relation": self.num_discourse_relations, "ir_relevance": IR_RELEVANCE_CLASSES}


__all__ = ["Ernie2PreTrainingConfig", "IR_RELEVANCE_CLASSES", "PRETRAINING_TASKS", "SENTENCE_DISTANCE_CLASSES",
           "TOKEN_LEVEL_TASKS", "sentence_reordering_classes", "validate_ernie_encoder"]
