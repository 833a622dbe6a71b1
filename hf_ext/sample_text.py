"""Small self-made text material shared by the models' samples, demo and tests: the sentences bundled with the
package and tokenizers trained on them in BERT's and GPT-2's file layouts."""

import json
from collections import Counter
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def bundled_sentences() -> list[str]:
    """The sentences shipped with the package (simple captions, written for this project)."""
    text = resources.files("hf_ext").joinpath("data/sentences.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def train_bert_vocab(sentences: list[str], folder: str | Path, vocab_size: int = 200, lowercase: bool = True) -> Path:
    """A WordPiece `vocab.txt` as BERT ships it (pad id 0, as the original Optimus assumes): the special tokens, every
    character of the sentences alone and as a `##` continuation (so that any word of them can be spelled), then
    their most frequent words whole, up to `vocab_size` entries. Built in Python rather than with the `tokenizers`
    WordPiece trainer, whose choice among equally frequent merges changes from run to run."""
    normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    counts = Counter(word for sentence in sentences
                     for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(sentence)))
    characters = sorted({character for word in counts for character in word})
    vocab = [*BERT_SPECIAL_TOKENS, *characters, *(f"##{character}" for character in characters)]
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} cannot hold the {len(vocab)} special tokens and characters")
    known = set(vocab)
    words = [word for word, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])) if word not in known]
    vocab += words[:vocab_size - len(vocab)]
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / "vocab.txt"
    path.write_text("".join(f"{token}\n" for token in vocab), encoding="utf-8")
    return path


def train_gpt2_bpe(sentences: list[str], folder: str | Path, vocab_size: int = 300) -> int:
    """Byte-level BPE `vocab.json` + `merges.txt` in GPT-2's layout, with `<|endoftext|>` as its last base token."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(sentences, trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False, special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.add_special_tokens(["<|endoftext|>"])
    Path(folder).mkdir(parents=True, exist_ok=True)
    tokenizer.model.save(str(folder))
    vocab = json.loads((Path(folder) / "vocab.json").read_text())
    vocab["<|endoftext|>"] = len(vocab)
    (Path(folder) / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    return len(vocab)


__all__ = ["BERT_SPECIAL_TOKENS", "bundled_sentences", "train_bert_vocab", "train_gpt2_bpe"]
