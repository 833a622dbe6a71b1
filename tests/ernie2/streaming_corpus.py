"""A generated ERNIE 2.0 corpus in JSON-lines shards whose every document is told apart by its own word, with the
tokenizer, tiny config and batch-recording collator that the streaming tests and their `torchrun` script share;
and `CORPUS`, a few documents on different topics for the data builders and the loss of every task."""

import json
from pathlib import Path

from transformers import BertTokenizer

from hf_ext.models.ernie2 import Ernie2PreTrainingConfig
from hf_ext.models.ernie2.data import Ernie2PreTrainingCollator

# a few documents on different topics, with entities and content-word phrases
CORPUS = [
    {"paragraphs": [["Marie Curie was born in Warsaw.", "She studied physics in Paris at the Sorbonne.",
                     "Her work on radioactive decay won two Nobel prizes."],
                    ["In New York the Bank of America opened a branch.", "The red ball rolled under the old table."]],
     "entities": ["Nobel prizes"]},
    {"paragraphs": [["Albert Einstein developed the theory of relativity.", "He won the Nobel Prize.",
                     "Later he moved to Princeton."],
                    ["The theory changed physics forever.", "Students in Princeton still study it."]]},
    {"paragraphs": [["The Amazon river flows through Brazil.", "Many strange fish live in the river."],
                    ["Brazil is a large country.", "Its capital is Brasilia.", "People in Brazil speak Portuguese."]]},
    {"paragraphs": [["Ada Lovelace wrote the first computer program.", "She worked with Charles Babbage in London."],
                    ["The analytical engine was never built.", "Her notes describe how it would compute numbers."]]},
]

COMMON_WORDS = ["the", "river", "flows", "past", "old", "town", "people", "live", "near", "it", "."]


def document(number: int) -> dict:
    """Two paragraphs; `word<number>` in every sentence marks the document."""
    word = f"word{number}"
    return {"paragraphs": [[f"The river flows past {word} town.", f"People live near {word}."],
                           [f"The old {word} flows.", f"It flows past the {word} river."]]}


def write_corpus(folder: Path, shards: int = 4, documents_per_shard: int = 6) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        rows = [document(shard * documents_per_shard + i) for i in range(documents_per_shard)]
        (folder / f"shard-{shard:02d}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def tokenizer(documents: int = 100) -> BertTokenizer:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *COMMON_WORDS, *(f"word{i}" for i in range(documents))]
    return BertTokenizer(vocab={token: i for i, token in enumerate(tokens)}, do_lower_case=True)


def tiny_config(vocab_size: int) -> Ernie2PreTrainingConfig:
    return Ernie2PreTrainingConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=37, max_position_embeddings=64)


class RecordingCollator(Ernie2PreTrainingCollator):
    """Keeps the (task, input ids) of every example it batches, in order."""

    def __init__(self, config):
        super().__init__(config.task_ids, config.pad_token_id or 0)
        self.seen = []

    def __call__(self, features):
        self.seen += [[feature["task"], list(feature["input_ids"])] for feature in features]
        return super().__call__(features)
