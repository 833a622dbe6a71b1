"""The data and evaluation of MT-DNN's token-level tasks: sequence labeling (NER-style tags per word) and span
classification (extractive question answering, SQuAD v1.1; with unanswerable questions, SQuAD v2.0).

Facts from namisan/mt-dnn (HEAD 3228e7c): `prepro_std.py` `extract_feature_sequence` (a word's tag on its first
piece; the continuation pieces tagged `X`, the special tokens `CLS` and `SEP`, where the task's labels have those
tags), `experiments/ner/` (CoNLL files, `Seqence` TSV rows `uid \\t tags \\t words`), `data_utils/metrics.py`
`compute_seqacc` (entity scores on the word tags: the `X`, `CLS`, `SEP` positions are left out),
`experiments/squad/squad_prepro.py` (question and context as one pair, the context cut into windows of `max_length`
tokens that overlap by `doc_stride`; an answer outside a window, or no answer, is labelled with the first token) and
`data_utils/utils_qa.py` `postprocess_qa_predictions` (the best span of at most `max_answer_length` tokens over an
example's windows; SQuAD v2.0 answers nothing where the first token's score beats the best span's by more than the
threshold).

Where the task's labels lack `X`, `CLS` and `SEP` (the usual tag sets), those tokens get the label -100, which no
loss reads, as transformers' token-classification examples do.
"""

import ast
import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from ...errors import HfExtError
from ...text_files import json_lines, read_lines
from .modeling_mtdnn import IGNORE_INDEX
from .pipeline_mtdnn import DOC_STRIDE, NO_OFFSET, best_answer, question_windows

if TYPE_CHECKING:  # datasets is imported only when used
    from datasets import Dataset

CONLL_SUFFIXES = (".conll", ".txt", ".bio", ".iob")
SPECIAL_TAGS = ("X", "CLS", "SEP")  # the original's tags of continuation pieces and of the special tokens

TaggedSentence = tuple[list[str], list[str]]


# ----- sequence labeling ------------------------------------------------------------------------------------------

def read_tagged_sentences(path: str | Path) -> list[TaggedSentence]:
    """Words and their tags: a CoNLL file (`.conll`, `.txt`, `.bio`, `.iob`: one word per line, the word first and
    its tag last, a blank line between sentences, `-DOCSTART-` lines skipped) or the original's `Seqence` TSV
    (`uid \\t [tags] \\t [words]`, as `experiments/ner/prepro.py` writes, read as Python literals)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".tsv":
        return _read_sequence_tsv(path)
    if suffix not in CONLL_SUFFIXES:
        raise HfExtError(f"{path}: sequence labeling data are CoNLL files ({', '.join(CONLL_SUFFIXES)}), the "
                         "original's Seqence .tsv rows or its preprocessed .json lines")
    sentences = conll_sentences(read_lines(path, "CoNLL file"), lambda number: f"{path}, line {number}")
    if not sentences:
        raise HfExtError(f"CoNLL file {path} has no sentences")
    return sentences


def conll_sentences(lines: Sequence[str], where: Callable[[int], str]) -> list[TaggedSentence]:
    """The tagged sentences of CoNLL `lines` (one word per line, the word first and its tag last, a blank line between
    sentences, `-DOCSTART-` lines skipped); `where(n)` names line `n` (from 1) in errors."""
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    for number, line in enumerate([*lines, ""], 1):
        fields = line.split()
        if fields and fields[0] == "-DOCSTART-":
            continue
        if not fields:
            if words:
                sentences.append((words, tags))
            words, tags = [], []
            continue
        if len(fields) < 2:
            raise HfExtError(f"{where(number)}: a word and its tag, separated by white space, got {line!r}")
        words.append(fields[0])
        tags.append(fields[-1])
    return sentences


def _read_sequence_tsv(path):
    sentences = []
    for number, line in enumerate(read_lines(path, "Seqence TSV file"), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        where = f"{path}, line {number}"
        if len(fields) != 3:
            raise HfExtError(f"{where}: the original's Seqence rows have 3 tab-separated fields (uid, tags, words), "
                             f"got {len(fields)}")
        sentences.append(sequence_row(fields[1], fields[2], where))
    if not sentences:
        raise HfExtError(f"Seqence TSV file {path} has no rows")
    return sentences


def sequence_row(tags: str, words: str, where: str) -> TaggedSentence:
    """The words and tags of a row of the original's `Seqence` TSV, its tags and words fields (Python literals of
    lists of strings); `where` names the row in errors."""
    try:
        tag_list, word_list = ast.literal_eval(tags), ast.literal_eval(words)
    except (ValueError, SyntaxError):
        raise HfExtError(f"{where}: tags and words must be Python lists of strings") from None
    if not (isinstance(tag_list, list) and isinstance(word_list, list)
            and all(isinstance(item, str) for item in [*tag_list, *word_list])):
        raise HfExtError(f"{where}: tags and words must be Python lists of strings")
    if len(tag_list) != len(word_list):
        raise HfExtError(f"{where}: {len(word_list)} words but {len(tag_list)} tags")
    return word_list, tag_list


def encode_tagged_sentences(sentences: Sequence[TaggedSentence], spec: dict[str, Any],
                            tokenizer: PreTrainedTokenizerBase, max_length: int = 512,
                            where: Callable[[int], str] = lambda number: f"the data, sentence {number}",
                            ) -> dict[str, list[Any]]:
    """Tokenized columns (`input_ids`, `token_type_ids`, `attention_mask`, `labels`) of tagged sentences for the
    sequence-labeling task `spec`: each word's tag on its first piece; the other pieces and the special tokens get
    the original's `X`, `CLS`, `SEP` tags where the task has them, -100 (no loss) otherwise. Truncated to
    `max_length` tokens. A tag that is not one of the task's labels is refused with the sentence that holds it
    (`where(n)` names sentence `n`, from 1)."""
    if not getattr(tokenizer, "is_fast", False):
        raise HfExtError("sequence labeling data needs a fast tokenizer (one that maps pieces to words)")
    tag_ids = {tag: index for index, tag in enumerate(spec["labels"])}
    for number, (words, tags) in enumerate(sentences, 1):
        unknown = sorted({tag for tag in tags if tag not in tag_ids})
        if unknown:
            raise HfExtError(f"{where(number)}: tag(s) {', '.join(map(repr, unknown[:5]))} are not labels "
                             f"of task {spec['name']} ({', '.join(spec['labels'])})")
        if len(words) != len(tags):
            raise HfExtError(f"{where(number)}: {len(words)} words but {len(tags)} tags")
    encoded = tokenizer([words for words, _ in sentences], is_split_into_words=True, truncation=True,
                        max_length=max_length, return_token_type_ids=True, return_attention_mask=True)
    continuation = tag_ids.get("X", IGNORE_INDEX)
    labels = []
    for row, (_, tags) in enumerate(sentences):
        word_ids = encoded.word_ids(row)
        row_labels = []
        for position, word in enumerate(word_ids):
            if word is None:
                row_labels.append(tag_ids.get("CLS" if position == 0 else "SEP", IGNORE_INDEX))
            elif position and word_ids[position - 1] == word:
                row_labels.append(continuation)
            else:
                row_labels.append(tag_ids[tags[word]])
        labels.append(row_labels)
    return {"input_ids": encoded["input_ids"], "token_type_ids": encoded["token_type_ids"],
            "attention_mask": encoded["attention_mask"], "labels": labels}


def sequence_labeling_references(spec: dict[str, Any], logits: np.ndarray, label_ids: np.ndarray,
                                 ) -> tuple[list[list[str]], list[list[str]]]:
    """Predicted and gold tag names of every labelled word: the positions whose gold label is -100 or one of the
    original's `X`, `CLS`, `SEP` tags are left out (its `compute_seqacc`); a prediction of those tags reads `O`.
    `logits` are `(N, L, C)` and `label_ids` `(N, L)` (both padded with -100, as Trainer gathers them)."""
    names = list(spec["labels"])
    predicted = np.asarray(logits).argmax(-1)
    skipped = {names.index(tag) for tag in SPECIAL_TAGS if tag in names}
    predictions, references = [], []
    for row_predicted, row_gold in zip(predicted, np.asarray(label_ids), strict=True):
        keep = [i for i, gold in enumerate(row_gold) if gold != IGNORE_INDEX and gold not in skipped]
        references.append([names[row_gold[i]] for i in keep])
        predictions.append([names[row_predicted[i]] if names[row_predicted[i]] not in SPECIAL_TAGS else "O"
                            for i in keep])
    return predictions, references


# ----- span classification ----------------------------------------------------------------------------------------

def read_squad_examples(path: str | Path, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Questions with their context and answers: a SQuAD JSON file (`{"data": [{"paragraphs": [{"context", "qas":
    [{"id", "question", "answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}`) or JSON lines in the layout of
    the Hub's `squad` datasets (`{"id", "question", "context", "answers": {"text": [...], "answer_start": [...]}}`).
    Every answer must be the text at its `answer_start` in the context; a `span_classification` task (SQuAD v1.1)
    needs an answer for every question, a `span_classification_yn` task (v2.0) reads an empty one as "no answer"."""
    text = Path(path).read_text(encoding="utf-8") if Path(path).is_file() else None
    if text is None:
        raise HfExtError(f"cannot read SQuAD data {path}: no such file")
    examples = []
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        document = None
    if isinstance(document, dict) and "data" in document:
        for article in document["data"]:
            examples.extend(article_examples(article, str(path), spec))
    else:
        for where, row in json_lines(path, "SQuAD JSON-lines file"):
            examples.append(squad_row_example(row, where, spec))
    if not examples:
        raise HfExtError(f"SQuAD data {path} has no questions")
    return examples


def article_examples(article: dict[str, Any], source: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The examples of one article of a SQuAD JSON file (`{"paragraphs": [{"context", "qas": [...]}]}`), each named
    "`source`, question ID" in errors."""
    examples = []
    for paragraph in article.get("paragraphs", []):
        for qa in paragraph.get("qas", []):
            answers = [] if qa.get("is_impossible") else qa.get("answers", [])
            examples.append(_example(qa.get("id"), qa.get("question"), paragraph.get("context"),
                                     [a.get("text") for a in answers], [a.get("answer_start") for a in answers],
                                     f"{source}, question {qa.get('id')!r}", spec))
    return examples


def squad_row_example(row: object, where: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The example of a SQuAD row in the layout of the Hub's `squad` datasets; `where` names it in errors."""
    if not isinstance(row, dict) or not isinstance(row.get("answers", {}), dict):
        raise HfExtError(f"{where}: a row holds id, question, context and answers {{text, answer_start}}")
    answers = row.get("answers", {})
    return _example(row.get("id"), row.get("question"), row.get("context"), answers.get("text", []),
                    answers.get("answer_start", []), where, spec)


def _example(uid, question, context, texts, starts, where, spec):
    if not (isinstance(question, str) and question.strip() and isinstance(context, str) and context.strip()):
        raise HfExtError(f"{where}: a question and a context, both non-empty text")
    if not (isinstance(texts, list) and isinstance(starts, list) and len(texts) == len(starts)):
        raise HfExtError(f"{where}: answers need as many texts as answer_start positions")
    for answer, start in zip(texts, starts, strict=True):
        if not isinstance(answer, str) or isinstance(start, bool) or not isinstance(start, int) or not answer:
            raise HfExtError(f"{where}: an answer is a non-empty text and its integer answer_start")
        if not 0 <= start <= len(context) - len(answer) or context[start:start + len(answer)] != answer:
            raise HfExtError(f"{where}: the answer {answer[:40]!r} is not the context's text at answer_start {start} "
                             "(a span outside the text?)")
    if not texts and spec["type"] == "span_classification":
        raise HfExtError(f"{where}: no answer, but task {spec['name']} is span_classification (SQuAD v1.1: every "
                         "question has one); use span_classification_yn for unanswerable questions")
    return {"id": str(uid) if uid is not None else where, "question": question.strip(), "context": context,
            "answers": {"text": texts, "answer_start": starts}}


def encode_squad_examples(examples: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase,
                          max_length: int = 384, doc_stride: int | None = None) -> dict[str, list[Any]]:
    """Tokenized windows of question-context pairs, as the original's `squad_prepro.py` (and transformers'
    question-answering examples) make them: `input_ids`, `token_type_ids`, `attention_mask`, `labels` (the first and
    last token of the first answer, or the first token where the window does not hold it or there is none), and
    what evaluation reads: `example_id`, `offset_mapping` (character offsets of the context's tokens, (-1, -1)
    elsewhere), `context`, `answers` (the gold texts). `doc_stride` defaults to `DOC_STRIDE`, or half the window
    where that is less."""
    if not getattr(tokenizer, "is_fast", False):
        raise HfExtError("span data needs a fast tokenizer (one that maps tokens to character offsets)")
    doc_stride = min(DOC_STRIDE, max_length // 2) if doc_stride is None else doc_stride
    if not 0 <= doc_stride < max_length:
        raise HfExtError(f"doc stride {doc_stride} must be below the window's {max_length} tokens")
    try:
        encoded, window_offsets = question_windows(tokenizer, [e["question"] for e in examples],
                                                   [e["context"] for e in examples], max_length, doc_stride)
    except Exception as error:  # the tokenizers library's own error: a question too long for the window and stride
        raise HfExtError(f"cannot cut the contexts into windows of {max_length} tokens with a stride of {doc_stride}: "
                         f"{str(error).splitlines()[0]}") from None
    columns: dict[str, list[Any]] = defaultdict(list)
    for window, (example_index, offsets) in enumerate(zip(encoded["overflow_to_sample_mapping"], window_offsets,
                                                          strict=True)):
        example = examples[example_index]
        start = end = 0
        if example["answers"]["text"]:
            first = example["answers"]["answer_start"][0]
            last = first + len(example["answers"]["text"][0])
            context_tokens = [i for i, offset in enumerate(offsets) if offset != NO_OFFSET]
            if offsets[context_tokens[0]][0] <= first and offsets[context_tokens[-1]][1] >= last:
                start = max(i for i in context_tokens if offsets[i][0] <= first)
                end = min(i for i in context_tokens if offsets[i][1] >= last)
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            columns[key].append(encoded[key][window])
        columns["labels"].append([start, end])
        columns["example_id"].append(example["id"])
        columns["offset_mapping"].append([list(offset) for offset in offsets])
        columns["context"].append(example["context"])
        columns["answers"].append(list(example["answers"]["text"]))
    return dict(columns)


def span_answers(spec: dict[str, Any], logits: np.ndarray, windows: "Dataset | dict[str, list[Any]]",
                 ) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Each example's predicted answer text (`{example_id: text}`, "" for no answer) and its gold answers, from the
    `(N, L, 2)` start and end scores of its windows (`windows` holds `encode_squad_examples`' columns, in the same
    order): the best span of at most the task's `max_answer_length` tokens inside the context over the example's
    windows (start and end among each window's `N_BEST` best: `pipeline_mtdnn.best_answer`, which the pipeline
    shares); a `span_classification_yn` task answers nothing where
    the first token's start and end scores beat the best span's by more than its `null_score_diff_threshold` (the
    no-answer score of an example is its lowest over the windows)."""
    logits = np.asarray(logits)
    windows_of: dict[str, list[tuple[list[float], list[float], Any]]] = defaultdict(list)
    contexts: dict[str, str] = {}
    gold: dict[str, list[str]] = {}
    for row, (example_id, offsets, context, answers) in enumerate(zip(
            windows["example_id"], windows["offset_mapping"], windows["context"], windows["answers"], strict=True)):
        length = len(offsets)
        windows_of[example_id].append((logits[row, :length, 0].tolist(), logits[row, :length, 1].tolist(), offsets))
        contexts[example_id], gold[example_id] = context, list(answers)
    predictions = {example_id: best_answer(spec, windows_of[example_id], contexts[example_id]) for example_id in gold}
    return predictions, gold


__all__ = ["article_examples", "conll_sentences", "encode_squad_examples", "encode_tagged_sentences",
           "read_squad_examples", "read_tagged_sentences", "sequence_labeling_references", "sequence_row",
           "span_answers", "squad_row_example"]
