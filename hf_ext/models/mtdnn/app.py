"""The MT-DNN app of `hf-ext serve`: a sentence or a sentence pair through every task head at once, each head's
prediction with its probabilities (classification), its score (regression, ranking), the tagged words and entities
of the first sentence (sequence labeling), or the answer to the first sentence found in the second (span tasks).

The API name (gradio_client): `predict`. Needs gradio (`hf-ext[app]`), which `build_app`
imports; not imported by the package."""

from typing import TYPE_CHECKING

import numpy as np
import torch

from ...hub import model_name
from ...loading import load_config, load_tokenizer, loading
from ...serve import MAX_TEXT_CHARS, checked_text, user_errors
from . import MTDNNConfig
from .configuration_mtdnn import PAIR_FORMATS, SPAN_TASK_TYPES, max_input_length
from .token_tasks import encode_squad_examples, span_answers

if TYPE_CHECKING:  # gradio is optional
    import gradio as gr
    from transformers import PreTrainedTokenizerBase

    from . import MTDNNModel

MODEL_TYPES = ("mt-dnn",)  # the model types this app serves


class MTDNNApp:
    """The app's functions over one multi-task model and its tokenizer."""

    def __init__(self, model: "MTDNNModel", tokenizer: "PreTrainedTokenizerBase") -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer

    @torch.no_grad()
    def predict(self, sentence: str, second_sentence: str) -> dict:
        """`{task: prediction}` for every task head: a classification's `label` and `probabilities` (by label), a
        regression's or a ranking's `score` of the pair. Tasks reading pairs need `second_sentence`; single-sentence
        tasks read `sentence` alone."""
        sentence = checked_text(sentence, "the sentence")
        second = checked_text(second_sentence, "the second sentence", required=False)
        limit = max_input_length(self.model.config.encoder)
        predictions, encoded = {}, {}
        for task in self.model.config.tasks:
            if task["type"] in SPAN_TASK_TYPES:
                predictions[task["name"]] = self.answer(task, sentence, second) if second else \
                    {"type": task["type"], "needs": "a question and a context (the second sentence)"}
                continue
            if task["type"] == "sequence_labeling":
                predictions[task["name"]] = self.tag(task, sentence)
                continue
            pair = task["data_format"] in PAIR_FORMATS
            if pair and not second:
                predictions[task["name"]] = {"type": task["type"], "needs": "a sentence pair"}
                continue
            if pair not in encoded:  # the encoder runs once for the sentence and once for the pair, not per task
                batch = self.tokenizer(sentence, second if pair else None, truncation=True, max_length=limit,
                                       return_tensors="pt").to(self.model.device)
                token_type_ids = batch.get("token_type_ids", torch.zeros_like(batch["input_ids"]))
                sequence = self.model.encode(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                             token_type_ids=token_type_ids).last_hidden_state
                encoded[pair] = (sequence, token_type_ids, batch["attention_mask"])
            logits = self.model.head_logits(task["name"], *encoded[pair])[0][0]
            if task["type"] == "classification":
                labels = task["labels"] or [f"LABEL_{index}" for index in range(task["num_labels"])]
                # a SAN head's logits are log-probabilities, which the softmax leaves as they are
                probabilities = dict(zip(labels, logits.softmax(-1).tolist(), strict=True))
                predictions[task["name"]] = {"type": "classification", "label": max(probabilities,
                                                                                    key=probabilities.__getitem__),
                                             "probabilities": probabilities}
            else:
                predictions[task["name"]] = {"type": task["type"], "score": logits.item()}
        return predictions

    def tag(self, task: dict, sentence: str) -> dict:
        """A sequence-labeling task's tag of every word of `sentence` (split at white space; a word's tag is its
        first piece's) and the entities they form (seqeval's chunks)."""
        from ...metrics.seqeval.seqeval import entities  # plain functions; the evaluate module is loaded by path

        words = sentence.split()
        batch = self.tokenizer(words, is_split_into_words=True, truncation=True,
                               max_length=max_input_length(self.model.config.encoder), return_tensors="pt")
        word_ids = batch.word_ids(0)
        logits = self.model(**batch.to(self.model.device), task=task["name"]).logits[0]
        predicted = logits.argmax(-1).tolist()
        tags = {word: task["labels"][predicted[position]] for position, word in reversed(list(enumerate(word_ids)))
                if word is not None}  # reversed: a word keeps its first piece's tag
        tagged = [[word, tags.get(index, "O")] for index, word in enumerate(words)]
        found = [{"type": kind, "text": " ".join(words[first:last + 1]), "first_word": first, "last_word": last}
                 for kind, first, last in entities([tag for _, tag in tagged])]
        return {"type": "sequence_labeling", "tags": tagged, "entities": found}

    def answer(self, task: dict, question: str, context: str) -> dict:
        """A span task's answer to `question` in `context` (over windows of the model's positions, as evaluation
        reads them); "" where a `span_classification_yn` task finds no answer."""
        windows = encode_squad_examples(
            [{"id": "0", "question": question, "context": context, "answers": {"text": [], "answer_start": []}}],
            self.tokenizer, max_input_length(self.model.config.encoder) or 512)
        logits = []
        for row in range(len(windows["input_ids"])):
            inputs = {key: torch.tensor([windows[key][row]], device=self.model.device)
                      for key in ("input_ids", "token_type_ids", "attention_mask")}
            logits.append(self.model(**inputs, task=task["name"]).logits[0].float().cpu().numpy())
        width = max(len(row) for row in logits)
        padded = np.stack([np.pad(row, ((0, width - len(row)), (0, 0))) for row in logits])  # read up to each length
        answers, _ = span_answers(task, padded, windows)
        return {"type": task["type"], "answer": answers["0"]}

    @staticmethod
    def views(predictions: dict, task_names: list[str]) -> list:
        """One `gr.Label` value per task: the probabilities by label, or a line with the score or what is missing."""
        views = []
        for name in task_names:
            prediction = (predictions or {}).get(name, {})
            if "probabilities" in prediction:
                views.append(prediction["probabilities"])
            elif "score" in prediction:
                views.append(f"{prediction['type']} score {prediction['score']:.4f}")
            elif "entities" in prediction:
                views.append("; ".join(f"{e['type']}: {e['text']}" for e in prediction["entities"]) or "no entities")
            elif "answer" in prediction:
                views.append(f"answer: {prediction['answer']}" if prediction["answer"] else "no answer")
            else:
                views.append(f"needs {prediction.get('needs', 'an input')}")
        return views


def build_app(source: str, trust_remote_code: bool = False) -> "gr.Blocks":
    """The multi-task predictor of the MT-DNN model in `source` (a folder or Hub repo id)."""
    import gradio as gr
    from transformers import AutoModel

    load_config(source, MTDNNConfig.model_type, "an MT-DNN model", trust_remote_code)
    tokenizer = load_tokenizer(source, trust_remote_code)
    with loading("an MT-DNN model", source):
        model = AutoModel.from_pretrained(source, trust_remote_code=trust_remote_code)
    app = MTDNNApp(model, tokenizer)
    tasks = model.config.tasks
    task_names = [task["name"] for task in tasks]

    name = model_name(source)  # a repo id or the folder's own name, not a local path
    with gr.Blocks(title=f"MT-DNN: {name}", analytics_enabled=False) as blocks:
        gr.Markdown(f"# MT-DNN: every task head\n`{name}`: {len(tasks)} tasks. Tasks that read a pair need the "
                    "second sentence; single-sentence and sequence-labeling tasks read the first alone; span tasks "
                    "answer the first (a question) from the second (a context).")
        with gr.Row():
            sentence = gr.Textbox(label="sentence", elem_id="sentence", max_length=MAX_TEXT_CHARS, lines=1)
            second_sentence = gr.Textbox(label="second sentence (for pair tasks)", elem_id="second_sentence",
                                         max_length=MAX_TEXT_CHARS, lines=1)
        run = gr.Button("Predict", variant="primary")
        with gr.Row():
            task_views = [gr.Label(label=f"{task['name']} ({task['type']}, {task['head']} head)",
                                   elem_id=f"task_{task['name']}") for task in tasks]
        with gr.Accordion("values (as the API returns them)", open=False):
            predictions = gr.JSON(label="predictions")
        run.click(user_errors(app.predict), [sentence, second_sentence], predictions, api_name="predict").success(
            lambda values: app.views(values, task_names), predictions, task_views, api_visibility="private")
    return blocks
