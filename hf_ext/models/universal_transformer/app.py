"""The Universal Transformer app of `hf-ext serve`: an input's output (seq2seq models, greedy) and the halting map of
ACT, the ponder time N + R of every encoder and decoder position, as a heatmap and a table.

The API name (gradio_client): `halting_map`. Needs gradio (`hf-ext[app]`), which `build_app`
imports; not imported by the package."""

from typing import TYPE_CHECKING, Any

from ...hub import model_name
from ...serve import MAX_TEXT_CHARS, checked_int, checked_text, user_errors
from . import UniversalTransformerForSeq2SeqLM
from .halting_map import HaltingRow, halting_map, halting_map_figure
from .loading import load_model_and_tokenizer

if TYPE_CHECKING:  # gradio and matplotlib are optional
    import gradio as gr
    from matplotlib.figure import Figure
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MODEL_TYPES = ("universal-transformer",)  # the model types this app serves

MAX_NEW_TOKENS = 128


class UniversalTransformerApp:
    """The app's functions over one model and its tokenizer."""

    def __init__(self, model: "PreTrainedModel", tokenizer: "PreTrainedTokenizerBase") -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer

    def halting_map(self, text: str, max_new_tokens: float) -> tuple[str, list[dict]]:
        """The greedy output of `text` (empty for an encoder) and the halting map's rows (`side`, `tokens`,
        `ponder_time`); `max_new_tokens` 0 means the input length plus one."""
        text = checked_text(text, "the input")
        new_tokens = checked_int(max_new_tokens, "max new tokens", 0, MAX_NEW_TOKENS) or None
        rows = halting_map(self.model, self.tokenizer, text, max_new_tokens=new_tokens)
        output = ""
        if isinstance(self.model, UniversalTransformerForSeq2SeqLM):
            special = set(self.tokenizer.all_special_tokens)
            output = self.tokenizer.convert_tokens_to_string([token for token in rows[-1].tokens
                                                              if token not in special])
        return output, [{"side": row.side, "tokens": row.tokens, "ponder_time": row.ponder_time} for row in rows]

    @staticmethod
    def views(rows: list[dict], text: str) -> "tuple[Figure | None, list[list]]":
        """The heatmap and the per-position table of `halting_map`'s rows."""
        if not rows:
            return None, []
        figure = halting_map_figure([HaltingRow(**row) for row in rows], title=f"Halting map of {text.strip()!r}")
        table = [[row["side"], position, token, round(value, 3)] for row in rows
                 for position, (token, value) in enumerate(zip(row["tokens"], row["ponder_time"], strict=True))]
        return figure, table


def build_app(source: str, trust_remote_code: bool = False, model_kwargs: dict[str, Any] | None = None,
              ) -> "gr.Blocks":
    """The halting-map viewer of the Universal Transformer in `source` (a folder or Hub repo id); `model_kwargs` go
    to the model's `from_pretrained` (`dtype`, `device_map`)."""
    import gradio as gr

    model, tokenizer = load_model_and_tokenizer(source, trust_remote_code, **(model_kwargs or {}))
    app = UniversalTransformerApp(model, tokenizer)
    config = model.config
    kind = "seq2seq" if isinstance(model, UniversalTransformerForSeq2SeqLM) else "encoder"
    name = model_name(source)  # a repo id or the folder's own name, not a local path
    with gr.Blocks(title=f"Universal Transformer: {name}", analytics_enabled=False) as blocks:
        gr.Markdown(f"# Universal Transformer halting map\n`{name}` ({kind}, "
                    f"{'ACT, at most ' + str(config.act_max_steps) + ' steps' if config.use_act else 'no ACT'}): "
                    "how many steps N + R each position ponders before it halts.")
        with gr.Row():
            text = gr.Textbox(label="input", elem_id="input", max_length=MAX_TEXT_CHARS, lines=1, scale=3)
            max_new_tokens = gr.Slider(0, MAX_NEW_TOKENS, value=0, step=1, scale=1,
                                       label="max new tokens (0: the input length plus one)",
                                       visible=kind == "seq2seq")
        run = gr.Button("Halting map", variant="primary")
        output = gr.Textbox(label="output (greedy)", elem_id="output", interactive=False, visible=kind == "seq2seq")
        heatmap = gr.Plot(label="halting map", format="png", elem_id="heatmap")
        table = gr.Dataframe(headers=["side", "position", "token", "ponder time"], label="ponder time per position",
                             interactive=False, elem_id="ponder_time")
        with gr.Accordion("values (as the API returns them)", open=False):
            rows = gr.JSON(label="rows")
        run.click(user_errors(app.halting_map), [text, max_new_tokens], [output, rows], api_name="halting_map").success(
            user_errors(app.views), [rows, text], [heatmap, table], api_visibility="private")
    return blocks
