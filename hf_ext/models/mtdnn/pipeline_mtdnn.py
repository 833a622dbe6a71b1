"""MT-DNN's pipeline: a text, or a pair of texts, through every task head at once (or through one), as
`pipeline("mt-dnn", model=folder)` or, where hf-ext is not installed, `pipeline("mt-dnn", model=folder,
trust_remote_code=True)` (the folder's config names this file in `custom_pipelines`, with `feature-extraction`: the
shared encoder's hidden states).

    >>> predict = pipeline("mt-dnn", model="path/to/folder", trust_remote_code=True)
    >>> predict({"text": "A man is playing.", "text_pair": "A man is sleeping."})
    {"nli": {"type": "classification", "label": "contradiction", "probabilities": {...}}, "sts": {...}, ...}
    >>> predict("A man is playing.", task="sst")   # one task's prediction only
    >>> predict(["A man is playing.", {"text": ..., "text_pair": ...}], batch_size=8)   # one result per input

An input is a text or `{"text": ..., "text_pair": ...}` (as the text-classification pipeline takes pairs); a list of
them gives a list of results. Each result maps task names to predictions: a classification's `label` and
`probabilities` (by label; a SAN head's output, a log-probability, gives the same softmax), a regression's or a
ranking's `score` (ranking: the score of the pair as one candidate), a sequence-labeling task's `tags` (one per word
of the first text, split at white space: a word's tag is its first piece's) and `entities`, a span task's `answer`
to the first text (the question) in the second (the context, read in overlapping windows of the encoder's positions;
"" where a `span_classification_yn` task finds no answer). A task that reads a pair, and a span task, answer
`{"type": ..., "needs": ...}` for a single text.

Remote code: imports only torch, transformers and this folder. hf-ext's `hf-ext serve` app calls this pipeline.
"""

from collections.abc import Iterator
from typing import Any

import torch
from transformers.pipelines.base import ChunkPipeline
from transformers.pipelines.feature_extraction import FeatureExtractionPipeline

from .configuration_mtdnn import PAIR_FORMATS, SPAN_TASK_TYPES, max_input_length

PIPELINE_TASK = "mt-dnn"  # the pipeline's task name (`pipeline("mt-dnn", ...)`, the config's `custom_pipelines`)
FEATURE_TASK = "feature-extraction"
DOC_STRIDE = 128  # tokens shared by two windows of a long context (the original's squad_prepro.py)
N_BEST = 20  # start and end candidates per window (postprocess_qa_predictions' n_best_size)
DEFAULT_SPAN_WINDOW = 512  # tokens of a span task's window where the encoder's positions set no limit
NO_OFFSET = (-1, -1)  # offset of a token outside the context (the question, special tokens)
# what a chunk carries besides the encoder's inputs; "kind" first: the pipeline's batching reads its length
CHUNK_FIELDS = ("kind", "tasks", "words", "word_ids", "offsets", "context")


def question_windows(tokenizer: Any, questions: list[str], contexts: list[str], max_length: int,
                     doc_stride: int | None = None) -> tuple[Any, list[list[tuple[int, int]]]]:
    """Question-context pairs cut into windows of `max_length` tokens that share `doc_stride` tokens (`DOC_STRIDE`, or
    half the window where that is less), as the original's `squad_prepro.py` cuts them: the tokenizer's encoding of
    every window (`overflow_to_sample_mapping` names each window's pair) and each window's character offsets of the
    context's tokens (`NO_OFFSET` elsewhere). Needs a fast tokenizer."""
    doc_stride = min(DOC_STRIDE, max_length // 2) if doc_stride is None else doc_stride
    encoded = tokenizer(questions, contexts, truncation="only_second", max_length=max_length, stride=doc_stride,
                        return_overflowing_tokens=True, return_offsets_mapping=True, return_token_type_ids=True,
                        return_attention_mask=True)
    offsets = []
    for window, window_offsets in enumerate(encoded["offset_mapping"]):
        sequence_ids = encoded.sequence_ids(window)
        offsets.append([tuple(offset) if sequence_ids[i] == 1 else NO_OFFSET
                        for i, offset in enumerate(window_offsets)])
    return encoded, offsets


def best_span(starts: list[float], ends: list[float], offsets: list[tuple[int, int]] | list[list[int]],
              max_answer_length: int) -> tuple[float, int, int] | None:
    """The best answer span of one window: `(score, first character, end character)` of the highest start + end
    score among each side's `N_BEST` best tokens, both inside the context (an offset other than (-1, -1)), the end
    not before the start and at most `max_answer_length` tokens long; None where no span qualifies."""
    in_context = [tuple(offset) != NO_OFFSET for offset in offsets]
    top_starts = sorted(range(len(starts)), key=starts.__getitem__, reverse=True)[:N_BEST]
    top_ends = sorted(range(len(ends)), key=ends.__getitem__, reverse=True)[:N_BEST]
    best = None
    for start in top_starts:
        for end in top_ends:
            if not (in_context[start] and in_context[end] and start <= end < start + max_answer_length):
                continue
            score = starts[start] + ends[end]
            if best is None or score > best[0]:
                best = (score, offsets[start][0], offsets[end][1])
    return best


def best_answer(spec: dict[str, Any], windows: list[tuple[list[float], list[float], Any]], context: str) -> str:
    """A span task's answer in `context` from the start and end scores and the offsets of its windows (each window's
    scores as long as its offsets): the best span over the windows (`best_span`); a `span_classification_yn` task
    answers "" where the first token's start and end scores (the lowest over the windows) beat the best span's by
    more than its `null_score_diff_threshold`."""
    spans = [span for starts, ends, offsets in windows
             if (span := best_span(starts, ends, offsets, spec["max_answer_length"])) is not None]
    score, first, last = max(spans, key=lambda span: span[0]) if spans else (float("-inf"), 0, 0)
    if spec["type"] == "span_classification_yn":
        null_score = min(starts[0] + ends[0] for starts, ends, _ in windows)
        if null_score - score > spec["null_score_diff_threshold"]:
            return ""
    return context[first:last]


# Copied from hf_ext.metrics.seqeval.seqeval.end_of_chunk
def end_of_chunk(previous_tag: str, tag: str, previous_type: str, entity_type: str) -> bool:
    """Whether the chunk before this token ends here (conlleval's endOfChunk)."""
    return (previous_tag in ("E", "S")
            or (previous_tag in ("B", "I") and tag in ("B", "S", "O"))
            or (previous_tag not in ("O", ".") and previous_type != entity_type))


# Copied from hf_ext.metrics.seqeval.seqeval.start_of_chunk
def start_of_chunk(previous_tag: str, tag: str, previous_type: str, entity_type: str) -> bool:
    """Whether a chunk starts at this token (conlleval's startOfChunk)."""
    return (tag in ("B", "S")
            or (previous_tag in ("E", "S", "O") and tag in ("E", "I"))
            or (tag not in ("O", ".") and previous_type != entity_type))


# Copied from hf_ext.metrics.seqeval.seqeval.entities
def entities(tags: list[str], suffix: bool = False) -> list[tuple[str, int, int]]:
    """The chunks `(type, first, last)` of one tag sequence."""
    found = []
    previous_tag, previous_type, begin = "O", "", 0
    for index, chunk in enumerate([*tags, "O"]):
        if suffix:
            tag, entity_type = chunk[-1], chunk[:-1].rsplit("-", maxsplit=1)[0] or "_"
        else:
            tag, entity_type = chunk[0], chunk[1:].split("-", maxsplit=1)[-1] or "_"
        if end_of_chunk(previous_tag, tag, previous_type, entity_type):
            found.append((previous_type, begin, index - 1))
        if start_of_chunk(previous_tag, tag, previous_type, entity_type):
            begin = index
        previous_tag, previous_type = tag, entity_type
    return found


def reads_pair(spec: dict[str, Any]) -> bool:
    """Whether a sentence-level task reads a sentence pair (its data format has a hypothesis)."""
    return spec["data_format"] in PAIR_FORMATS


class MTDNNPipeline(ChunkPipeline):
    """Every task head's prediction for a text or a text pair (see the module's description). `task`: one task's
    name (its prediction alone), or None for every task. Inputs are cut into chunks (the text alone, the pair, the
    first text's words, a span task's windows), each encoded once whatever the number of tasks reading it; with
    `batch_size`, chunks of several inputs share the encoder's batches."""

    def _sanitize_parameters(self, task: str | None = None, **kwargs: Any):
        if kwargs:
            raise ValueError(f"unknown argument(s) {', '.join(sorted(kwargs))} of the MT-DNN pipeline (it takes task=)")
        if task is None:
            return {"tasks": None}, {}, {"tasks": None}
        names = [self.model.config.task(task)["name"]]  # ValueError with one line for an unknown task
        return {"tasks": names}, {}, {"tasks": names}

    @property
    def mtdnn(self) -> Any:
        """The MT-DNN model (typed `PreTrainedModel` by the base class, which has no `encode`)."""
        return self.model

    @property
    def text_tokenizer(self) -> Any:
        """The tokenizer (which `pipeline()` loads for a "text" pipeline)."""
        return self.tokenizer

    def selected(self, tasks: list[str] | None) -> list[dict[str, Any]]:
        return self.model.config.tasks if tasks is None else [self.model.config.task(name) for name in tasks]

    def preprocess(self, inputs: Any, tasks: list[str] | None = None,  # type: ignore[override]  # chunks
                   ) -> Iterator[dict[str, Any]]:
        text, text_pair = self.texts(inputs)
        specs = self.selected(tasks)
        limit = max_input_length(self.model.config.encoder)
        chunks = []
        sentence_tasks = [spec["name"] for spec in specs if spec["type"] not in SPAN_TASK_TYPES
                          and spec["type"] != "sequence_labeling" and not reads_pair(spec)]
        pair_tasks = [spec["name"] for spec in specs if spec["type"] not in SPAN_TASK_TYPES
                      and spec["type"] != "sequence_labeling" and reads_pair(spec)]
        tag_tasks = [spec["name"] for spec in specs if spec["type"] == "sequence_labeling"]
        span_tasks = [spec["name"] for spec in specs if spec["type"] in SPAN_TASK_TYPES]
        if sentence_tasks:
            chunks.append(self.chunk("sentence", sentence_tasks,
                                     self.text_tokenizer(text, truncation=True, max_length=limit)))
        if pair_tasks and text_pair:
            chunks.append(self.chunk("pair", pair_tasks,
                                     self.text_tokenizer(text, text_pair, truncation=True, max_length=limit)))
        words = text.split()
        if tag_tasks and words:
            encoded = self.text_tokenizer(words, is_split_into_words=True, truncation=True, max_length=limit)
            chunks.append(self.chunk("words", tag_tasks, encoded, words=words, word_ids=encoded.word_ids(0)))
        if span_tasks and text_pair:
            chunks.extend(self.span_windows(span_tasks, text, text_pair, limit or DEFAULT_SPAN_WINDOW))
        if not chunks:  # nothing to encode (only pair or span tasks, and no pair): one chunk that no head reads
            chunks.append(self.chunk("sentence", [], self.text_tokenizer(text, truncation=True, max_length=limit)))
        for index, chunk in enumerate(chunks):
            yield {**chunk, "is_last": index == len(chunks) - 1}

    @staticmethod
    def texts(inputs: Any) -> tuple[str, str | None]:
        """`(text, text_pair)` of one input: a text, or a dict of `text` and, optionally, `text_pair`."""
        if isinstance(inputs, dict) and set(inputs) <= {"text", "text_pair"} and isinstance(inputs.get("text"), str) \
                and isinstance(inputs.get("text_pair"), str | None):
            return inputs["text"], inputs.get("text_pair") or None
        if isinstance(inputs, str):
            return inputs, None
        raise ValueError(f"an MT-DNN pipeline input is a text or a dict of text and text_pair (texts), not "
                         f"{type(inputs).__name__}{' ' + str(sorted(inputs)) if isinstance(inputs, dict) else ''}")

    def chunk(self, kind: str, tasks: list[str], encoded: Any, **fields: Any) -> dict[str, Any]:
        """One chunk: the encoder's inputs as one-row tensors and what postprocessing reads."""
        input_ids = torch.tensor([encoded["input_ids"]])
        token_type_ids = encoded.get("token_type_ids") or [0] * len(encoded["input_ids"])
        return {"kind": kind, "tasks": tasks, **{name: fields.get(name) for name in CHUNK_FIELDS[2:]},
                "input_ids": input_ids, "attention_mask": torch.tensor([encoded["attention_mask"]]),
                "token_type_ids": torch.tensor([token_type_ids])}

    def span_windows(self, tasks: list[str], question: str, context: str, max_length: int) -> list[dict[str, Any]]:
        """A question and its context in windows of `max_length` tokens overlapping by `DOC_STRIDE` (or half the
        window where that is less), as hf-ext's span-task evaluation reads them."""
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError("span tasks need a fast tokenizer (one that maps tokens to character offsets)")
        encoded, offsets = question_windows(self.text_tokenizer, [question], [context], max_length)
        return [self.chunk("span", tasks, {key: encoded[key][window] for key in
                                           ("input_ids", "token_type_ids", "attention_mask")},
                           offsets=window_offsets, context=context) for window, window_offsets in enumerate(offsets)]

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        """The encoder once over the chunks, then each task's head over the chunks that it reads (`logits:<task>`,
        NaN in the other rows)."""
        batched = isinstance(model_inputs["kind"], list)  # several chunks, collated by the pipeline's batching
        row_tasks = model_inputs["tasks"] if batched else [model_inputs["tasks"]]
        outputs = {name: model_inputs[name] for name in (*CHUNK_FIELDS, "is_last")}
        token_type_ids, attention_mask = model_inputs["token_type_ids"], model_inputs["attention_mask"]
        sequence = self.mtdnn.encode(input_ids=model_inputs["input_ids"], attention_mask=attention_mask,
                                     token_type_ids=token_type_ids).last_hidden_state
        for name in dict.fromkeys(name for tasks in row_tasks for name in tasks):
            rows = torch.tensor([row for row, tasks in enumerate(row_tasks) if name in tasks],
                                device=sequence.device)
            logits = self.mtdnn.head_logits(name, sequence[rows], token_type_ids[rows], attention_mask[rows])[0]
            full = logits.new_full((len(row_tasks), *logits.shape[1:]), float("nan"))
            full[rows] = logits
            outputs[f"logits:{name}"] = full
        return outputs

    def postprocess(self, model_outputs: list[dict[str, Any]],  # type: ignore[override]  # a chunk list
                    tasks: list[str] | None = None) -> dict[str, Any]:
        predictions = {}
        for spec in self.selected(tasks):
            name = spec["name"]
            chunks = [chunk for chunk in model_outputs if f"logits:{name}" in chunk
                      and not torch.isnan(chunk[f"logits:{name}"]).all()]
            if spec["type"] in SPAN_TASK_TYPES:
                predictions[name] = {"type": spec["type"], "answer": self.answer(spec, chunks)} if chunks else \
                    {"type": spec["type"], "needs": "a question and a context (the text pair)"}
            elif spec["type"] == "sequence_labeling":
                predictions[name] = self.tag(spec, chunks[0] if chunks else None)
            elif not chunks:
                predictions[name] = {"type": spec["type"], "needs": "a sentence pair"}
            else:
                predictions[name] = self.sentence_prediction(spec, chunks[0][f"logits:{name}"][0].float().cpu())
        return predictions

    @staticmethod
    def sentence_prediction(spec: dict[str, Any], logits: torch.Tensor) -> dict[str, Any]:
        """A classification's label and probabilities by label, a regression's or ranking's score, from the head's
        output for one input."""
        if spec["type"] != "classification":
            return {"type": spec["type"], "score": logits.item()}
        labels = spec["labels"] or [f"LABEL_{index}" for index in range(spec["num_labels"])]
        # a SAN head's logits are log-probabilities, which the softmax leaves as they are
        probabilities = dict(zip(labels, logits.softmax(-1).tolist(), strict=True))
        return {"type": "classification", "label": max(probabilities, key=probabilities.__getitem__),
                "probabilities": probabilities}

    @staticmethod
    def tag(spec: dict[str, Any], chunk: dict[str, Any] | None) -> dict[str, Any]:
        """Each word's tag (its first piece's; "O" for a word cut off by truncation) and the entities they form."""
        words = chunk["words"] if chunk is not None else []
        tags: dict[int, str] = {}
        if chunk is not None:
            predicted = chunk[f"logits:{spec['name']}"][0].argmax(-1).tolist()
            for position, word in reversed(list(enumerate(chunk["word_ids"]))):  # a word keeps its first piece's
                if word is not None:
                    tags[word] = spec["labels"][predicted[position]]
        tagged = [[word, tags.get(index, "O")] for index, word in enumerate(words)]
        found = [{"type": kind, "text": " ".join(words[first:last + 1]), "first_word": first, "last_word": last}
                 for kind, first, last in entities([tag for _, tag in tagged])]
        return {"type": "sequence_labeling", "tags": tagged, "entities": found}

    @staticmethod
    def answer(spec: dict[str, Any], chunks: list[dict[str, Any]]) -> str:
        """A span task's answer from its windows' start and end scores (`best_answer`)."""
        windows = []
        for chunk in chunks:
            logits = chunk[f"logits:{spec['name']}"][0, :len(chunk["offsets"])].float().cpu()
            windows.append((logits[:, 0].tolist(), logits[:, 1].tolist(), chunk["offsets"]))
        return best_answer(spec, windows, chunks[0]["context"])


class MTDNNFeatureExtractionPipeline(FeatureExtractionPipeline):
    """`feature-extraction` for MT-DNN: the shared encoder's last hidden states, one vector per token, as the stock
    pipeline gives them for a plain encoder. The stock pipeline reads a model's first output, which for MT-DNN is a
    task head's logits."""

    def _forward(self, model_inputs: dict[str, Any]) -> Any:  # type: ignore[override]
        return self.model.encode(**model_inputs)  # type: ignore[operator]


__all__ = ["FEATURE_TASK", "MTDNNFeatureExtractionPipeline", "MTDNNPipeline", "PIPELINE_TASK", "best_answer",
           "best_span", "entities", "question_windows"]
