"""The MT-DNN app of `hf-ext serve`: a sentence or a sentence pair through every task head at once, each head's
prediction with its probabilities (classification), its score (regression, ranking), the tagged words and entities
of the first sentence (sequence labeling), or the answer to the first sentence found in the second (span tasks).

The API name (gradio_client): `predict`. Needs gradio (`hf-ext[app]`), which `build_app`
imports; not imported by the package."""

from typing import TYPE_CHECKING, Any

from ...hub import model_name
from ...loading import load_config, load_tokenizer, loading
from ...serve import MAX_TEXT_CHARS, checked_text, user_errors
from . import MTDNNConfig
from .pipeline_mtdnn import MTDNNPipeline

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
        self.pipeline = MTDNNPipeline(model=self.model, tokenizer=tokenizer)  # type: ignore[arg-type]  # any tokenizer

    def predict(self, sentence: str, second_sentence: str) -> dict:
        """`{task: prediction}` for every task head, as the model's pipeline (`pipeline_mtdnn.MTDNNPipeline`) gives
        it: a classification's `label` and `probabilities` (by label), a regression's or a ranking's `score` of the
        pair, a sequence-labeling task's tagged words and entities of `sentence`, a span task's answer to `sentence`
        found in `second_sentence`. Tasks reading pairs need `second_sentence`; single-sentence tasks read
        `sentence` alone."""
        sentence = checked_text(sentence, "the sentence")
        second = checked_text(second_sentence, "the second sentence", required=False)
        return self.pipeline({"text": sentence, "text_pair": second} if second else sentence)

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


def build_app(source: str, trust_remote_code: bool = False, model_kwargs: dict[str, Any] | None = None,
              ) -> "gr.Blocks":
    """The multi-task predictor of the MT-DNN model in `source` (a folder or Hub repo id); `model_kwargs` go to the
    model's `from_pretrained` (`dtype`, `device_map`)."""
    import gradio as gr
    from transformers import AutoModel

    load_config(source, MTDNNConfig.model_type, "an MT-DNN model", trust_remote_code)
    tokenizer = load_tokenizer(source, trust_remote_code)
    with loading("an MT-DNN model", source):
        model = AutoModel.from_pretrained(source, trust_remote_code=trust_remote_code, **(model_kwargs or {}))
    app = MTDNNApp(model, tokenizer)
    tasks = model.config.tasks
    task_names = [task["name"] for task in tasks]

    name = model_name(source)  # a repo id or the folder's own name, not a local path
    with gr.Blocks(title=f"MT-DNN: {name}", analytics_enabled=False) as blocks:
        gr.Markdown(f"# MT-DNN: every task head\n`{name}`: {len(tasks)} tasks. Tasks that read a pair need the "
                    "second sentence; single-sentence and sequence-labeling tasks read the first alone; span tasks "
                    "answer the first (a question) from the second (a context). The same predictions in Python: "
                    "`pipeline(\"mt-dnn\", model=folder, trust_remote_code=True)`.")
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
