"""Examples of the ERNIE 2.0 pre-training tasks (Sun et al., AAAI 2020) built with `datasets` from raw documents.

A document is a list of paragraphs, a paragraph a list of sentences (cased text). Every builder returns a
`datasets.Dataset` with the columns `task` (a name of `PRETRAINING_TASKS`), `input_ids` (`[CLS] ... [SEP]`, at most
`max_length` tokens), `token_type_ids` and `labels` (one per token for token tasks, -100 where there is none; one
class id for sentence tasks); an example without any label is left out. `Ernie2PreTrainingCollator` pads them into
batches for `Ernie2ForPreTraining`.

What each task's examples are (the original data pipeline was never released; these are this port's rules):
- knowledge masking: windows of consecutive sentences of a paragraph; whole masking units (entities, phrases, else
  single words; see `SpanFinder`) are picked in random order until 15% of the tokens are chosen; each chosen token
  becomes [MASK] (80%), a random token (10%) or stays (10%), as in BERT and ERNIE 1.0; its label is the original id.
- capitalization: the same windows unmasked; the first word piece of each word is labelled 1 if the word starts
  with an upper-case letter in the cased text, 0 if with a lower-case one, -100 otherwise (numbers, punctuation).
  The task only makes sense with an uncased (lower-casing) tokenizer, as every released ERNIE vocabulary is.
- token-document relation: the segments of a document are its paragraphs (its sentences when it has one paragraph;
  a one-sentence document gives nothing); the first word piece of each word of a segment is labelled 1 if the word
  (lower-cased) also occurs in another segment of the document, else 0, and -100 for words without a letter or digit.
- sentence reordering: windows of consecutive sentences of a paragraph; n is drawn uniformly from 1..min(m, number
  of sentences), the window is cut at n-1 random sentence boundaries, the n segments are shuffled and joined as
  `[CLS] s_a [SEP] s_b [SEP] ...`; the label is `sentence_reordering_label(permutation)`.
- sentence distance: one pair per sentence A of a document, `[CLS] A [SEP] B [SEP]`, with a class drawn uniformly
  from those the document allows: 0, B is the sentence after A; 1, B is another sentence of the document, not next
  to A; 2, B is a sentence of another document.
- discourse relation and IR relevance: labelled sentence pairs from the user (`load_labelled_pairs`), as
  `[CLS] sentence1 [SEP] sentence2 [SEP]`.

Randomness is drawn from `numpy` generators seeded with (seed, task, document index), so the same inputs give the
same examples whatever the batching of `datasets.map`.
"""

import functools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from ...errors import HfExtError
from ...streaming import StreamReadError
from ...text_files import json_lines, read_lines
from . import IGNORE_INDEX, IR_RELEVANCE_CLASSES, PRETRAINING_TASKS, TOKEN_LEVEL_TASKS, sentence_reordering_label
from .configuration_ernie2 import Ernie2PreTrainingConfig
from .schedule import ContinualSchedule

if TYPE_CHECKING:  # datasets is imported only when data is built
    from datasets import Dataset, DatasetDict, Features, IterableDataset

    from .schedule import Stage

DOCUMENT_TASKS = ("knowledge_masking", "capitalization", "token_document_relation", "sentence_reordering",
                  "sentence_distance")
PAIR_TASKS = ("discourse_relation", "ir_relevance")
EXAMPLE_COLUMNS = ("task", "input_ids", "token_type_ids", "labels")
MASK_PROBABILITY = 0.15
STREAM_MAP_DOCUMENTS = 64  # documents a stream builds examples from at a time (and sentence distance draws from)
# ERNIE 1.0 / BERT replacement of a chosen token: [MASK], a random token, or the token itself
MASK_TOKEN_SHARE, RANDOM_TOKEN_SHARE = 0.8, 0.1
MAX_PHRASE_WORDS = 4
# function words: never part of a heuristic phrase, dropped from the start of a sentence-initial capitalised run
STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between both but by
can could did do does doing down during each few for from further had has have having he her here hers herself him
himself his how i if in into is it its itself just me more most my myself no nor not now of off on once only or other
our ours ourselves out over own same she should so some such than that the their theirs them themselves then there
these they this those through to too under until up very was we were what when where which while who whom why will
with would you your yours yourself yourselves
""".split())
# lower-case words allowed inside a capitalised entity run ("Bank of America", "Ludwig van Beethoven")
ENTITY_CONNECTORS = frozenset({"of", "de", "da", "del", "van", "von", "der", "la", "le", "du"})


# ----- documents ---------------------------------------------------------------------------------------------------

def _string_list(value, where, name):
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise HfExtError(f"{where}: {name} must be a list of strings")
    return [item.strip() for item in value if item.strip()]


def documents_from_records(records: Iterable[object], where: str = "documents") -> "Dataset":
    """A documents `datasets.Dataset` (columns `paragraphs`, `entities`, `phrases`) from dicts with `paragraphs`
    (a list of paragraphs, each a list of sentences) and optional `entities` / `phrases` (span texts to mask whole)."""
    from datasets import Dataset

    columns: dict[str, list[Any]] = {"paragraphs": [], "entities": [], "phrases": []}
    for number, record in enumerate(records, 1):
        here = f"{where}, document {number}"
        if not isinstance(record, dict) or "paragraphs" not in record:
            raise HfExtError(f"{here}: a document is an object with `paragraphs` (lists of sentences)")
        unknown = sorted(set(record) - set(columns))
        if unknown:
            raise HfExtError(f"{here}: unknown field(s) {', '.join(unknown)} (known: {', '.join(columns)})")
        if not isinstance(record["paragraphs"], list):
            raise HfExtError(f"{here}: paragraphs must be a list of lists of sentences")
        paragraphs = [_string_list(paragraph, here, "each paragraph") for paragraph in record["paragraphs"]]
        paragraphs = [paragraph for paragraph in paragraphs if paragraph]
        if not paragraphs:
            raise HfExtError(f"{here}: the document has no sentences")
        columns["paragraphs"].append(paragraphs)
        for name in ("entities", "phrases"):
            columns[name].append(_string_list(record.get(name, []), here, name))
    if not columns["paragraphs"]:
        raise HfExtError(f"{where} holds no documents")
    return Dataset.from_dict(columns)


def load_documents(path: str | Path) -> "Dataset":
    """Raw documents as a `datasets.Dataset` (see `documents_from_records`) from

    - a `.jsonl`/`.json` file: one JSON object per line, `{"paragraphs": [["First sentence.", "Second."], [...]],
      "entities": ["Marie Curie"], "phrases": ["radioactive decay"]}` (`entities` and `phrases` optional);
    - any other text file: one sentence per line, one blank line between paragraphs, two or more blank lines between
      documents (lines of white space count as blank).
    """
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".json"):
        return documents_from_records([record for _, record in json_lines(path, "documents file")], str(path))
    documents: list[dict[str, list[list[str]]]] = []
    paragraphs: list[list[str]] = []
    sentences: list[str] = []
    blank_run = 0
    for line in [*read_lines(path, "documents file"), "", ""]:
        if line.strip():
            if blank_run >= 2 and paragraphs:
                documents.append({"paragraphs": paragraphs})
                paragraphs = []
            sentences.append(line.strip())
            blank_run = 0
            continue
        blank_run += 1
        if sentences:
            paragraphs.append(sentences)
            sentences = []
    if paragraphs:
        documents.append({"paragraphs": paragraphs})
    return documents_from_records(documents, str(path))


def document_features() -> "Features":
    """The `datasets.Features` of a documents dataset (`documents_from_records`)."""
    from datasets import Features, List, Value

    return Features({"paragraphs": List(List(Value("string"))), "entities": List(Value("string")),
                     "phrases": List(Value("string"))})


def _clean_documents(rows):
    """A batch of read documents as `documents_from_records` keeps them: sentences stripped, empty ones and
    documents without sentences left out, absent span lists empty."""
    kept: dict[str, list[Any]] = {"paragraphs": [], "entities": [], "phrases": []}
    for paragraphs, entities, phrases in zip(rows["paragraphs"], rows["entities"], rows["phrases"], strict=True):
        paragraphs = [[s.strip() for s in paragraph if s and s.strip()] for paragraph in paragraphs or ()]
        paragraphs = [paragraph for paragraph in paragraphs if paragraph]
        if paragraphs:
            kept["paragraphs"].append(paragraphs)
            kept["entities"].append([e.strip() for e in entities or () if e and e.strip()])
            kept["phrases"].append([p.strip() for p in phrases or () if p and p.strip()])
    return kept


def read_documents(source: str | Path, streaming: bool = False) -> "Dataset | IterableDataset":
    """Raw documents through `datasets` from JSON lines (the `.jsonl` layout of `load_documents`): a file, a folder
    of shards, a glob or a Hub dataset id with those columns, memory-mapped (`datasets.Dataset`) or, with
    `streaming`, read as a `datasets.IterableDataset` that never holds the corpus in memory. Documents without
    sentences are left out."""
    from ...streaming import load_json_source

    features = document_features()
    documents = load_json_source(source, "documents", streaming, features=features)
    return documents.map(_clean_documents, batched=True, features=features, batch_size=STREAM_MAP_DOCUMENTS)


def load_labelled_pairs(path: str | Path, task: str, num_labels: int = IR_RELEVANCE_CLASSES) -> "Dataset":
    """Labelled sentence pairs of the discourse-relation or IR-relevance task from JSON lines
    `{"sentence1": "...", "sentence2": "...", "label": 0}`, as a `datasets.Dataset` with those columns. The label is a
    class id below `num_labels`; for IR relevance (sentence1 = query, sentence2 = title) 0 means strong relevance
    (the title was clicked), 1 weak (shown, not clicked), 2 irrelevant (a random title)."""
    from datasets import Dataset

    if task not in PAIR_TASKS:
        raise HfExtError(f"labelled pairs are the data of {' and '.join(PAIR_TASKS)}, not {task}")
    columns: dict[str, list[Any]] = {"sentence1": [], "sentence2": [], "label": []}
    for where, row in json_lines(path, f"{task} pairs file"):
        if not isinstance(row, dict) or not all(isinstance(row.get(key), str) and row[key].strip()
                                                for key in ("sentence1", "sentence2")):
            raise HfExtError(f"{where}: a pair is an object with non-empty sentence1, sentence2 and a label")
        label = row.get("label")
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < num_labels:
            raise HfExtError(f"{where}: label {label!r} is not a class id below {num_labels}")
        for key in columns:
            columns[key].append(row[key])
    if not columns["label"]:
        raise HfExtError(f"{task} pairs file {path} holds no pairs")
    return Dataset.from_dict(columns)


# ----- masking spans -----------------------------------------------------------------------------------------------

def words_and_pieces(tokenizer: PreTrainedTokenizerFast, texts: Sequence[str],
                     ) -> list[tuple[list[str], list[int], list[int]]]:
    """For each text: its words (the spans of the original text that the tokenizer's pre-tokenizer delimits, case
    kept), its pieces' ids, and the word of each piece. Read off the fast tokenizer's own encoding (`word_ids()`,
    `word_to_chars`), so that the words are those of any pre-tokenizer: BERT's (whitespace, punctuation apart),
    byte-level BPE's (RoBERTa: a word with its leading space, stripped here, since a tokenizer saved with
    `trim_offsets=False` counts it in the word's offsets), sentencepiece's (XLM-R, CamemBERT: white space only, so
    punctuation stays on its word)."""
    encoded = tokenizer(list(texts), add_special_tokens=False)
    split = []
    for index, text in enumerate(texts):
        word_ids = encoded.word_ids(index)
        number_of = {word: number for number, word in enumerate(dict.fromkeys(word_ids))}
        words = []
        for word in number_of:
            start, end = encoded.word_to_chars(index, word)
            words.append(text[start:end].strip())
        split.append((words, encoded["input_ids"][index], [number_of[word] for word in word_ids]))
    return split


def word_splitter(tokenizer: PreTrainedTokenizerFast) -> Callable[[str], list[str]]:
    """A function that splits a text into words as the tokenizer does (`words_and_pieces`), case kept."""
    return lambda text: words_and_pieces(tokenizer, [text])[0][0]


def read_lexicon(path: str | Path) -> list[str]:
    """The entries of a lexicon file: one entity or phrase per line."""
    entries = [line.strip() for line in read_lines(path, "lexicon") if line.strip()]
    if not entries:
        raise HfExtError(f"lexicon {path} is empty")
    return entries


class SpanFinder:
    """Finds the multi-word units that knowledge masking masks whole, in the words of one sentence.

    Sources, in order of precedence (a span overlapping an earlier one is dropped): the entities, then the phrases,
    given with the document or in the lexicons (matched case-insensitively as word sequences, longest first); then,
    with `heuristics`, which need no model:
    - entities: maximal runs of two or more capitalised words (lower-case connectors such as "of", "van" allowed
      inside: "Bank of America"); a run at the start of a sentence first loses its leading function words ("In
      New York" becomes "New York");
    - phrases: maximal runs of two or more lower-case content words (letters only, not function words), a cheap
      stand-in for noun chunks ("red ball", "machine learning model"), cut into pieces of at most four words.

    Args:
        entities, phrases (iterables of `str`): lexicon entries.
        split_words (callable): splits an entry into words the way documents are split (the tokenizer's
            pre-tokenizer); `str.split` by default.
        heuristics (`bool`, defaults to `True`): also find capitalised runs and content-word runs.
    """

    def __init__(self, entities=(), phrases=(), split_words=str.split, heuristics=True):
        self.split_words = split_words
        self.heuristics = heuristics
        self.entities = self._index(entities)
        self.phrases = self._index(phrases)

    def _index(self, entries):
        index = {}
        for entry in entries:
            words = tuple(word.lower() for word in self.split_words(entry))
            if words:
                index.setdefault(words[0], set()).add(words)
        return {first: sorted(found, key=len, reverse=True) for first, found in index.items()}

    def find(self, words: Sequence[str], entities: Iterable[str] = (), phrases: Iterable[str] = (),
             ) -> list[tuple[int, int]]:
        """Non-overlapping `(start, end)` word ranges of the units in `words`; `entities` and `phrases` are span
        texts given with this document."""
        lowered = [word.lower() for word in words]
        candidates = [*self._matches(lowered, self._merge(self.entities, entities)),
                      *self._matches(lowered, self._merge(self.phrases, phrases))]
        if self.heuristics:
            candidates += [*capitalised_runs(words), *content_word_runs(words)]
        taken = [False] * len(words)
        spans = []
        for start, end in candidates:
            if end - start > 1 and not any(taken[start:end]):
                taken[start:end] = [True] * (end - start)
                spans.append((start, end))
        return sorted(spans)

    def _merge(self, index, extra):
        if not extra:
            return index
        merged = {first: list(found) for first, found in index.items()}
        for first, found in self._index(extra).items():
            merged[first] = sorted({*merged.get(first, ()), *found}, key=len, reverse=True)
        return merged

    @staticmethod
    def _matches(lowered, index):
        position = 0
        while position < len(lowered):
            for entry in index.get(lowered[position], ()):
                if tuple(lowered[position:position + len(entry)]) == entry:
                    yield position, position + len(entry)
                    position += len(entry) - 1
                    break
            position += 1


def _capitalised(word):
    return word[:1].isupper()


def capitalised_runs(words: Sequence[str]) -> list[tuple[int, int]]:
    """`(start, end)` of the runs of two or more capitalised words that look like entities (see `SpanFinder`)."""
    runs, start = [], None
    for position in range(len(words) + 1):
        word = words[position] if position < len(words) else ""
        connector = word in ENTITY_CONNECTORS and position + 1 < len(words) and _capitalised(words[position + 1])
        if _capitalised(word) or (start is not None and connector):
            start = position if start is None else start
            continue
        if start is not None:
            if start == 0:  # a capital there proves nothing: "In New York" is "New York"
                while start < position and words[start].lower() in STOPWORDS:
                    start += 1
            if position - start >= 2:
                runs.append((start, position))
            start = None
    return runs


def content_word_runs(words: Sequence[str]) -> list[tuple[int, int]]:
    """`(start, end)` of runs of 2..4 lower-case content words (see `SpanFinder`)."""
    runs, start = [], None
    for position in range(len(words) + 1):
        word = words[position] if position < len(words) else ""
        if word.isalpha() and word.islower() and word not in STOPWORDS:
            start = position if start is None else start
            continue
        if start is not None:
            for begin in range(start, position, MAX_PHRASE_WORDS):
                if min(position, begin + MAX_PHRASE_WORDS) - begin >= 2:
                    runs.append((begin, min(position, begin + MAX_PHRASE_WORDS)))
            start = None
    return runs


# ----- examples ----------------------------------------------------------------------------------------------------

@dataclass
class Segment:
    """Consecutive words (cased) with their word pieces: `word_of_piece[i]` is the word of piece `ids[i]`;
    `spans` are the masking units' word ranges."""

    words: list
    ids: list
    word_of_piece: list
    spans: list = field(default_factory=list)

    def __add__(self, other):
        offset = len(self.words)
        return Segment(self.words + other.words, self.ids + other.ids,
                       self.word_of_piece + [w + offset for w in other.word_of_piece],
                       self.spans + [(start + offset, end + offset) for start, end in other.spans])

    def truncated(self, budget: int) -> "Segment":
        return Segment(self.words, self.ids[:budget], self.word_of_piece[:budget], self.spans)

    def first_pieces(self) -> dict[int, int]:
        """`{word index: position of its first piece}` for the words whose first piece is present."""
        first: dict[int, int] = {}
        for position, word in enumerate(self.word_of_piece):
            first.setdefault(word, position)
        return first


class Ernie2DataBuilder:
    """Builds the examples of the ERNIE 2.0 pre-training tasks (rules in the module docstring).

    Args:
        tokenizer: a fast tokenizer (every transformers 5 tokenizer is) with [CLS]/[SEP]/[MASK] tokens or their
            kin (BERT, ERNIE, RoBERTa's <s>, </s>, <mask>); documents are split into the words its encoding reports
            (`words_and_pieces`), so word boundaries and punctuation match its own.
        max_length (`int`, defaults to 128): tokens per example, [CLS] and [SEP] included.
        max_reorder_segments (`int`, defaults to 3): m of sentence reordering (the model's
            `config.max_reorder_segments`).
        span_finder (`SpanFinder`, *optional*): masking units; spans given with the documents and the heuristics when
            unset (give a `SpanFinder` with `split_words=word_splitter(tokenizer)` for lexicons).
        mask_probability (`float`, defaults to 0.15): share of each window's tokens that knowledge masking predicts.
        seed (`int`, defaults to 0): seed of every random choice.
    """

    def __init__(self, tokenizer, max_length=128, max_reorder_segments=3, span_finder=None,
                 mask_probability=MASK_PROBABILITY, seed=0):
        if max_length < 8:
            raise HfExtError(f"max_length must be at least 8 tokens, got {max_length}")
        if not 0 < mask_probability < 1:
            raise HfExtError(f"the masking probability must be in (0, 1), got {mask_probability}")
        for name in ("cls_token_id", "sep_token_id", "mask_token_id"):
            if getattr(tokenizer, name, None) is None:
                raise HfExtError(f"the tokenizer has no {name.removesuffix('_id').replace('_', ' ')}: not a BERT/ERNIE "
                                 "tokenizer")
        self.tokenizer = tokenizer
        self.split_words = word_splitter(tokenizer)
        self.max_length = max_length
        self.max_reorder_segments = max_reorder_segments
        self.span_finder = span_finder or SpanFinder(split_words=self.split_words)
        self.mask_probability = mask_probability
        self.seed = seed
        special = set(tokenizer.all_special_ids)
        self.replacement_ids = np.array([i for i in range(len(tokenizer)) if i not in special])

    def rng(self, task: str, index: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, PRETRAINING_TASKS.index(task), index])

    def encode(self, sentences: Sequence[str], spans: tuple[Iterable[str], Iterable[str]] | None = None,
               ) -> list[Segment]:
        """One `Segment` per sentence; with `spans` (the document's `(entities, phrases)`), its masking units too."""
        if not sentences:  # a fast tokenizer refuses an empty batch
            return []
        return [Segment(words, ids, word_of_piece, self.span_finder.find(words, *spans) if spans is not None else [])
                for words, ids, word_of_piece in words_and_pieces(self.tokenizer, sentences)]

    @staticmethod
    def sentence_windows(segments: Iterable[Segment], budget: int) -> list[list[Segment]]:
        """Consecutive sentences grouped into lists of at most `budget` pieces together (a longer sentence alone,
        cut to `budget`); sentences without pieces are left out."""
        windows: list[list[Segment]] = []
        current: list[Segment] = []
        size = 0
        for segment in segments:
            if not segment.ids:
                continue
            if current and size + len(segment.ids) > budget:
                windows.append(current)
                current, size = [], 0
            current.append(segment.truncated(budget))
            size += len(current[-1].ids)
        return windows + ([current] if current else [])

    def windows(self, segments: Iterable[Segment], budget: int) -> list[Segment]:
        """`sentence_windows` joined into one `Segment` each."""
        return [functools.reduce(operator.add, window) for window in self.sentence_windows(segments, budget)]

    def _example(self, task, ids, labels):
        ids = [self.tokenizer.cls_token_id, *ids, self.tokenizer.sep_token_id]
        return {"task": task, "input_ids": ids, "token_type_ids": [0] * len(ids),
                "labels": [IGNORE_INDEX, *labels, IGNORE_INDEX] if task in TOKEN_LEVEL_TASKS else [labels]}

    def _map_documents(self, documents, task, make):
        """`make(document, rng, index)` -> examples of one document, over the documents dataset; examples without
        any label (a window of punctuation, say) are left out."""
        def batch(rows, indices):
            return _columns([example for i, index in enumerate(indices)
                             for example in make({key: rows[key][i] for key in rows}, self.rng(task, index), index)
                             if any(label != IGNORE_INDEX for label in example["labels"])])

        return documents.map(batch, batched=True, with_indices=True, remove_columns=documents.column_names,
                             **_progress(documents, task))

    def _paragraph_windows(self, document, budget, spans=False):
        given = (document["entities"], document["phrases"]) if spans else None
        return [window for paragraph in document["paragraphs"]
                for window in self.windows(self.encode(paragraph, given), budget)]

    # ----- word-aware tasks -----

    def knowledge_masking(self, documents: "Dataset") -> "Dataset":
        def make(document, rng, _):
            return [self._example("knowledge_masking", *self.mask(window, rng))
                    for window in self._paragraph_windows(document, self.max_length - 2, spans=True)]

        return self._map_documents(documents, "knowledge_masking", make)

    def mask(self, segment: Segment, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        """(masked ids, labels) of one window: whole units until `mask_probability` of the pieces are chosen."""
        in_span = {}
        for start, end in segment.spans:
            for word in range(start, end):
                in_span[word] = (start, end)
        positions_of_unit: dict[tuple[int, int], list[int]] = {}
        for position, word in enumerate(segment.word_of_piece):
            positions_of_unit.setdefault(in_span.get(word, (word, word + 1)), []).append(position)
        units = list(positions_of_unit.values())
        budget = max(1, round(self.mask_probability * len(segment.ids)))
        chosen: list[int] = []
        for unit in (units[i] for i in rng.permutation(len(units))):
            if len(chosen) + len(unit) <= budget:
                chosen += unit
            if len(chosen) == budget:
                break
        ids, labels = list(segment.ids), [IGNORE_INDEX] * len(segment.ids)
        for position in sorted(chosen):
            labels[position] = ids[position]
            draw = rng.random()
            if draw < MASK_TOKEN_SHARE:
                ids[position] = self.tokenizer.mask_token_id
            elif draw < MASK_TOKEN_SHARE + RANDOM_TOKEN_SHARE:
                ids[position] = int(rng.choice(self.replacement_ids))
        return ids, labels

    def capitalization(self, documents: "Dataset") -> "Dataset":
        def make(document, rng, _):
            examples = []
            for window in self._paragraph_windows(document, self.max_length - 2):
                labels = [IGNORE_INDEX] * len(window.ids)
                for word, position in window.first_pieces().items():
                    first = window.words[word][:1]
                    if first.isupper() or first.islower():
                        labels[position] = int(first.isupper())
                examples.append(self._example("capitalization", window.ids, labels))
            return examples

        return self._map_documents(documents, "capitalization", make)

    def token_document_relation(self, documents: "Dataset") -> "Dataset":
        def make(document, rng, _):
            paragraphs = document["paragraphs"]
            groups = paragraphs if len(paragraphs) > 1 else [[sentence] for sentence in paragraphs[0]]
            if len(groups) < 2:
                return []
            encoded = [self.encode(group) for group in groups]
            vocabulary = [{word.lower() for sentence in group for word in sentence.words} for group in encoded]
            examples = []
            for index, group in enumerate(encoded):
                elsewhere = set().union(*(words for other, words in enumerate(vocabulary) if other != index))
                for window in self.windows(group, self.max_length - 2):
                    labels = [IGNORE_INDEX] * len(window.ids)
                    for word, position in window.first_pieces().items():
                        text = window.words[word].lower()
                        if any(character.isalnum() for character in text):
                            labels[position] = int(text in elsewhere)
                    examples.append(self._example("token_document_relation", window.ids, labels))
            return examples

        return self._map_documents(documents, "token_document_relation", make)

    # ----- structure-aware tasks -----

    def sentence_reordering(self, documents: "Dataset") -> "Dataset":
        m = self.max_reorder_segments

        def make(document, rng, _):
            examples = []
            for paragraph in document["paragraphs"]:
                encoded = self.encode(paragraph)
                # pack whole sentences, leaving room for a [SEP] after each of up to m segments
                for window in self.sentence_windows(encoded, self.max_length - 1 - m):
                    n = int(rng.integers(1, min(m, len(window)) + 1))
                    cuts = sorted(rng.choice(np.arange(1, len(window)), n - 1, replace=False).tolist())
                    bounds = list(zip([0, *cuts], [*cuts, len(window)], strict=True))
                    permutation = rng.permutation(n).tolist()
                    ids = []
                    for original in permutation:
                        start, end = bounds[original]
                        ids += [piece for sentence in window[start:end] for piece in sentence.ids]
                        ids.append(self.tokenizer.sep_token_id)
                    examples.append(self._example("sentence_reordering", ids[:-1],
                                                  sentence_reordering_label(permutation)))
            return examples

        return self._map_documents(documents, "sentence_reordering", make)

    def sentence_distance(self, documents: "Dataset | IterableDataset") -> "Dataset | IterableDataset":
        """Pairs of class 2 take B from another document of the corpus; in a stream, of the same `map` batch."""
        from datasets import IterableDataset

        if isinstance(documents, IterableDataset):
            def batch(rows, indices):
                sentences = [[s for paragraph in paragraphs for s in paragraph] for paragraphs in rows["paragraphs"]]
                return _columns([example for i, index in enumerate(indices) for example in
                                 self._distance_pairs(sentences, i, self.rng("sentence_distance", index))])

            return documents.map(batch, batched=True, with_indices=True, remove_columns=documents.column_names,
                                 batch_size=STREAM_MAP_DOCUMENTS)
        sentences = [[s for paragraph in paragraphs for s in paragraph] for paragraphs in documents["paragraphs"]]
        return self._map_documents(documents, "sentence_distance",
                                   lambda document, rng, index: self._distance_pairs(sentences, index, rng))

    def _distance_pairs(self, sentences, index, rng):
        own = sentences[index]
        firsts, seconds, labels = [], [], []
        for position, sentence in enumerate(own):
            far = [other for other in range(len(own)) if abs(other - position) > 1]
            classes = [label for label, possible in enumerate((position + 1 < len(own), bool(far),
                                                               len(sentences) > 1)) if possible]
            if not classes:
                continue
            label = int(rng.choice(classes))
            if label == 0:
                second = own[position + 1]
            elif label == 1:
                second = own[int(rng.choice(far))]
            else:
                other = int(rng.integers(len(sentences) - 1))
                other_document = sentences[other + (other >= index)]
                second = other_document[int(rng.integers(len(other_document)))]
            firsts.append(sentence)
            seconds.append(second)
            labels.append(label)
        return self._pair_examples("sentence_distance", firsts, seconds, labels)

    # ----- semantic-aware tasks -----

    def labelled_pairs(self, pairs: "Dataset", task: str) -> "Dataset":
        """Examples of `task` from a pairs dataset (`load_labelled_pairs`)."""
        def batch(rows):
            return _columns(self._pair_examples(task, rows["sentence1"], rows["sentence2"], rows["label"]))

        return pairs.map(batch, batched=True, remove_columns=pairs.column_names, **_progress(pairs, task))

    def _pair_examples(self, task, firsts, seconds, labels):
        if not firsts:
            return []
        encoded = self.tokenizer(list(firsts), list(seconds), truncation=True, max_length=self.max_length,
                                 return_token_type_ids=True)
        return [{"task": task, "input_ids": ids, "token_type_ids": types, "labels": [int(label)]}
                for ids, types, label in zip(encoded["input_ids"], encoded["token_type_ids"], labels, strict=True)]

    # ----- all at once -----

    def build(self, documents: "Dataset", tasks: Iterable[str] = PRETRAINING_TASKS,
              pairs: Mapping[str, "Dataset"] | None = None) -> "DatasetDict":
        """`datasets.DatasetDict` with the examples of each of `tasks`: the document tasks from `documents`, the pair
        tasks from `pairs` (`{task: load_labelled_pairs(...)}`). A task without examples is an error."""
        from datasets import DatasetDict

        pairs = pairs or {}
        unknown = sorted(set(tasks) - set(PRETRAINING_TASKS))
        if unknown:
            raise HfExtError(f"unknown pre-training task(s) {', '.join(unknown)} "
                             f"(known: {', '.join(PRETRAINING_TASKS)})")
        built = {}
        for task in tasks:
            if task in PAIR_TASKS:
                if task not in pairs:
                    raise HfExtError(f"{task} needs labelled pairs (JSON lines with sentence1, sentence2, label): its "
                                     "data is not public and cannot be made from raw documents")
                built[task] = self.labelled_pairs(pairs[task], task)
            else:
                built[task] = getattr(self, task)(documents)
            if len(built[task]) == 0:
                raise HfExtError(f"the documents give no {task} examples"
                                 + (" (it needs documents of two or more sentences)"
                                    if task in ("token_document_relation", "sentence_distance") else ""))
        return DatasetDict(built)


def pretraining_datasets(tokenizer: PreTrainedTokenizerFast, config: Ernie2PreTrainingConfig,
                         schedule: ContinualSchedule, documents: "Dataset",
                         pair_files: Mapping[str, str | Path | None] | None = None,
                         entity_lexicon: str | Path | None = None, phrase_lexicon: str | Path | None = None,
                         span_heuristics: bool = True, max_length: int = 128,
                         mask_probability: float = MASK_PROBABILITY, seed: int = 0) -> "DatasetDict":
    """Every task's examples for a continual pre-training run: from `documents` (`load_documents`), and from files:
    `pair_files` (`{task: path}` of labelled pairs for the pair tasks the `schedule` trains, `load_labelled_pairs`)
    and the optional entity and phrase lexicons (`read_lexicon`) that knowledge masking masks whole, besides the
    spans given with the documents and, with `span_heuristics`, capitalised and content-word runs. `config` is the
    pre-training model's (`max_reorder_segments`, the pair tasks' label counts). Returns `Ernie2DataBuilder.build`'s
    `DatasetDict`."""
    builder = _builder(tokenizer, config, entity_lexicon, phrase_lexicon, span_heuristics, max_length,
                       mask_probability, seed)
    return builder.build(documents, schedule.tasks, _pairs(config, schedule, pair_files))


def _pairs(config, schedule, pair_files):
    return {task: load_labelled_pairs(path, task, config.task_num_labels[task])
            for task, path in (pair_files or {}).items() if path and task in schedule.tasks}


def _builder(tokenizer, config, entity_lexicon, phrase_lexicon, span_heuristics, max_length, mask_probability,
             seed):
    finder = SpanFinder(read_lexicon(entity_lexicon) if entity_lexicon else (),
                        read_lexicon(phrase_lexicon) if phrase_lexicon else (),
                        split_words=word_splitter(tokenizer), heuristics=span_heuristics)
    return Ernie2DataBuilder(tokenizer, max_length, config.max_reorder_segments, finder, mask_probability, seed=seed)


def task_streams(tokenizer: PreTrainedTokenizerFast, config: Ernie2PreTrainingConfig, schedule: ContinualSchedule,
                 documents: "IterableDataset", pair_files: Mapping[str, str | Path | None] | None = None,
                 entity_lexicon: str | Path | None = None, phrase_lexicon: str | Path | None = None,
                 span_heuristics: bool = True, max_length: int = 128, mask_probability: float = MASK_PROBABILITY,
                 seed: int = 0) -> dict[str, "IterableDataset"]:
    """`pretraining_datasets` for a documents stream (`read_documents(..., streaming=True)`): `{task: examples}`
    as `datasets.IterableDataset`s built while they are read (the labelled pairs, small, are read whole). Each
    task's stream reads the documents on its own. A task whose first examples do not come within the first
    `map` batch of documents is refused as giving none."""
    from datasets import IterableDataset

    pairs = _pairs(config, schedule, pair_files)
    builder = _builder(tokenizer, config, entity_lexicon, phrase_lexicon, span_heuristics, max_length,
                       mask_probability, seed)
    streams: dict[str, IterableDataset] = {}
    for task in schedule.tasks:
        if task in PAIR_TASKS:
            if task not in pairs:
                raise HfExtError(f"{task} needs labelled pairs (JSON lines with sentence1, sentence2, label)")
            streams[task] = builder.labelled_pairs(pairs[task], task).to_iterable_dataset()
        else:
            streams[task] = getattr(builder, task)(documents)
        try:
            first = next(iter(streams[task].take(1)), None)
        except HfExtError:
            raise
        except Exception as error:  # the reader's own, as in training (`hf_ext.streaming.PositionedStream`)
            raise StreamReadError(error) from error
        if first is None:
            raise HfExtError(f"the documents give no {task} examples")
    return streams


def stage_mixture(streams: Mapping[str, "IterableDataset"], stage: "Stage", seed: int = 0) -> "IterableDataset":
    """One stream of a stage's examples: each example drawn from the task streams (each read again from its start
    when used up) with the task's share of the stage's steps as probability (`datasets.interleave_datasets`)."""
    from datasets import interleave_datasets

    tasks = list(stage.steps)
    missing = [task for task in tasks if task not in streams]
    if missing:
        raise HfExtError(f"no examples for task(s) {', '.join(missing)} of the stage")
    return interleave_datasets([streams[task].repeat(None) for task in tasks],
                               probabilities=[stage.steps[task] / stage.total_steps for task in tasks], seed=seed,
                               stopping_strategy="all_exhausted")


def _progress(dataset, task):
    """`map`'s progress bar for a map-style dataset; a stream, built while it is read, has none and is built
    `STREAM_MAP_DOCUMENTS` documents at a time."""
    from datasets import Dataset

    return {"desc": f"ERNIE 2.0 {task} examples"} if isinstance(dataset, Dataset) else \
        {"batch_size": STREAM_MAP_DOCUMENTS}


def _columns(examples):
    return {key: [example[key] for example in examples] for key in EXAMPLE_COLUMNS}


class Ernie2PreTrainingCollator:
    """Pads examples of any tasks into a batch for `Ernie2ForPreTraining`: `input_ids` (with `pad_token_id`),
    `token_type_ids`, `attention_mask` (right padding), `task_type_ids` (each row its task's id, from
    `config.task_ids`) and `<task>_labels` for every task in the batch: `(batch, length)` for token tasks and
    `(batch,)` for sentence tasks, -100 on padding and on the rows of other tasks."""

    def __init__(self, task_ids, pad_token_id=0, pad_to_multiple_of=None):
        self.task_ids = dict(task_ids)
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features):
        width = max(len(feature["input_ids"]) for feature in features)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        rows = len(features)
        batch = {"input_ids": torch.full((rows, width), self.pad_token_id, dtype=torch.long),
                 "token_type_ids": torch.zeros((rows, width), dtype=torch.long),
                 "attention_mask": torch.zeros((rows, width), dtype=torch.long),
                 "task_type_ids": torch.zeros((rows, width), dtype=torch.long)}
        for task in dict.fromkeys(feature["task"] for feature in features):
            shape = (rows, width) if task in TOKEN_LEVEL_TASKS else (rows,)
            batch[f"{task}_labels"] = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
        for row, feature in enumerate(features):
            length, task = len(feature["input_ids"]), feature["task"]
            batch["input_ids"][row, :length] = torch.tensor(feature["input_ids"])
            batch["token_type_ids"][row, :length] = torch.tensor(feature["token_type_ids"])
            batch["attention_mask"][row, :length] = 1
            batch["task_type_ids"][row] = self.task_ids[task]
            labels = batch[f"{task}_labels"]
            if task in TOKEN_LEVEL_TASKS:
                labels[row, :length] = torch.tensor(feature["labels"])
            else:
                labels[row] = feature["labels"][0]
        return batch


__all__ = ["DOCUMENT_TASKS", "Ernie2DataBuilder", "Ernie2PreTrainingCollator", "PAIR_TASKS", "SpanFinder",
           "capitalised_runs", "content_word_runs", "documents_from_records", "load_documents",
           "document_features", "load_labelled_pairs", "pretraining_datasets", "read_documents", "read_lexicon",
           "stage_mixture", "task_streams", "word_splitter", "words_and_pieces"]
