"""The Optimus app of `hf-ext serve`: a latent-space explorer. Reconstruct a sentence, walk the line between two
sentences' posterior means (the whole path listed, a slider over t), complete an analogy, decode samples from the
prior, and see the posterior means of the sentences entered so far on a plane with the interpolation path. Where the
folder holds latent attribute operators (`latent_attributes/`), sample with requested attributes and edit sentences
towards them.

The API names (gradio_client): `reconstruct`, `interpolate`, `analogy`, `sample`, `guided_sample`, `edit`. Needs
gradio (`hf-ext[app]`), which `build_app` imports; not imported by the package."""

from typing import TYPE_CHECKING, Any

import torch

from ...errors import HfExtError
from ...hub import model_name
from ...serve import MAX_TEXT_CHARS, checked_float, checked_int, checked_text, user_errors
from .attributes import DEFAULT_METHOD, METHODS
from .latent_space import OptimusLatentSpace
from .loading import load_optimus
from .samples import bundled_sentences

if TYPE_CHECKING:  # gradio and matplotlib are optional
    import gradio as gr
    import numpy as np
    from matplotlib.figure import Figure

MODEL_TYPES = ("optimus",)  # the model types this app serves

DECODINGS = ("greedy", "sampling", "beam search")
MAX_NEW_TOKENS = 32
MAX_BEAMS = 8
MAX_STEPS = 16
MAX_SAMPLES = 16
MAX_PRIOR_TEMPERATURE = 3.0
MAX_DEGREE = 3.0
REMEMBERED = 48  # the latent map shows the latest sentences entered, at most this many


def generation_options(decoding: str, num_beams: float, top_p: float, seed: float) -> dict:
    """`generate()` settings of the page's decoding options; seeds torch's generator, which sampling draws from."""
    if decoding not in DECODINGS:
        raise HfExtError(f"decoding must be one of {', '.join(DECODINGS)}, got {decoding!r}")
    num_beams = checked_int(num_beams, "beams", 1, MAX_BEAMS)
    top_p = checked_float(top_p, "top-p", 0.01, 1.0)
    torch.manual_seed(checked_int(seed, "seed", 0, 2**31 - 1))
    if decoding == "sampling":
        return {"do_sample": True, "top_k": 0, "top_p": top_p, "num_beams": 1}
    return {"do_sample": False, "num_beams": num_beams if decoding == "beam search" else 1}


class OptimusApp:
    """The app's functions over one `OptimusLatentSpace`: the API ones take and return plain values, the others
    draw the latent map from the sentences a session entered."""

    def __init__(self, space: OptimusLatentSpace, operators: dict | None = None, missing_operators: str = "") -> None:
        self.space = space
        self.operators = operators
        self.missing_operators = missing_operators  # why there are none, for the guided functions' answer

    def reconstruct(self, sentence: str, decoding: str, num_beams: float, top_p: float, seed: float) -> str:
        text = checked_text(sentence, "the sentence")
        return self.space.reconstruct([text], **generation_options(decoding, num_beams, top_p, seed))[0]

    def interpolate(self, start: str, end: str, steps: float, decoding: str, num_beams: float, top_p: float,
                    seed: float) -> list[list]:
        start, end = checked_text(start, "the first sentence"), checked_text(end, "the last sentence")
        steps = checked_int(steps, "steps", 2, MAX_STEPS)
        path = self.space.interpolate(start, end, steps, **generation_options(decoding, num_beams, top_p, seed))
        return [[round(t, 4), text] for t, text in path]

    def interpolate_at(self, start: str, end: str, t: float, decoding: str, num_beams: float, top_p: float,
                       seed: float) -> str:
        start, end = checked_text(start, "the first sentence"), checked_text(end, "the last sentence")
        t = checked_float(t, "t", 0.0, 1.0)
        return self.space.interpolate_at(start, end, t, **generation_options(decoding, num_beams, top_p, seed))

    def analogy(self, a: str, b: str, c: str, degree: float, decoding: str, num_beams: float, top_p: float,
                seed: float) -> str:
        a, b, c = (checked_text(text, f"sentence {name}") for name, text in zip("abc", (a, b, c), strict=True))
        degree = checked_float(degree, "degree", -MAX_DEGREE, MAX_DEGREE)
        return self.space.analogy(a, b, c, degree, **generation_options(decoding, num_beams, top_p, seed))

    def sample(self, count: float, temperature: float, decoding: str, num_beams: float, top_p: float,
               seed: float) -> list[str]:
        """Latents z = temperature * e, e ~ N(0, I) (the prior at temperature 1), decoded."""
        count = checked_int(count, "samples", 1, MAX_SAMPLES)
        temperature = checked_float(temperature, "temperature", 0.0, MAX_PRIOR_TEMPERATURE)
        options = generation_options(decoding, num_beams, top_p, seed)
        generator = torch.Generator().manual_seed(int(seed))
        latents = self.space.model.sample_prior(count, generator) * temperature
        return self.space.decode(latents, **options)

    def _request(self, attributes: str) -> dict[str, str]:
        from .attributes import parse_request, resolve_request

        if self.operators is None:
            raise HfExtError(self.missing_operators)
        request = parse_request(part for part in checked_text(attributes, "the attributes").split(";") if part.strip())
        resolve_request(self.operators, request)
        return request

    @staticmethod
    def _method(method: str) -> str:
        if method not in METHODS:
            raise HfExtError(f"unknown method {method!r}; the methods are: {', '.join(METHODS)}")
        return method

    def guided_sample(self, attributes: str, count: float, seed: float, method: str = DEFAULT_METHOD) -> list[str]:
        """Sentences with the requested attributes (`name=label; name=label`) by `method` (`gaussian`, `flow` or
        `conditional`), greedy decoding."""
        method = self._method(method)
        request = self._request(attributes)
        count = checked_int(count, "samples", 1, MAX_SAMPLES)
        generator = torch.Generator(device=self.space.model.device).manual_seed(checked_int(seed, "seed", 0,
                                                                                           2**31 - 1))
        return self.space.guided_sample(request, count, operators=self.operators, generator=generator, method=method)

    def edit(self, sentence: str, attributes: str, method: str = DEFAULT_METHOD) -> str:
        """The sentence moved to the requested attributes by `method`, the operators' other attributes kept, greedy
        decoding."""
        text = checked_text(sentence, "the sentence")
        method = self._method(method)
        return self.space.edit([text], self._request(attributes), operators=self.operators, method=method)[0]

    def remember(self, sentences: list[str] | None, *texts: str | None) -> list[str]:
        """The session's sentences with `texts` added (those not empty, too long, or there already), latest last."""
        new = [text.strip() for text in texts if text and text.strip() and len(text.strip()) <= MAX_TEXT_CHARS]
        kept = [text for text in sentences or [] if text not in new] + list(dict.fromkeys(new))
        return kept[-REMEMBERED:]

    def latent_map(self, sentences: list[str] | None, start: str | None = None, end: str | None = None,
                   steps: float | None = None) -> "Figure | None":
        """The posterior means of `sentences` on a plane, with the interpolation from `start` to `end` (its `steps`
        decoded greedily) drawn through them when both ends are among the sentences; None until there are two."""
        from .plots import latent_space_figure

        if sentences is None or len(sentences) < 2:
            return None
        means, _ = self.space.encode(sentences)
        interpolation = None
        path_ends = [(text or "").strip() for text in (start, end)]
        if all(text in sentences for text in path_ends):
            ends = means[[sentences.index(text) for text in path_ends]]
            steps = checked_int(steps, "steps", 2, MAX_STEPS)
            latents = self.space.model.interpolate(ends[0], ends[1], steps)
            texts = self.space.decode(latents)
            interpolation = (points(latents), list(zip(torch.linspace(0, 1, steps).tolist(), texts, strict=True)))
        figure = latent_space_figure(points(means), sentences, interpolation=interpolation)
        figure.set_size_inches(9, 7 if interpolation else 6)
        return figure


def points(latents: torch.Tensor) -> "np.ndarray":
    """Latents as numpy points for a plot, from a model on any device and in any dtype (numpy has no bfloat16)."""
    return latents.detach().float().cpu().numpy()


def build_app(source: str, trust_remote_code: bool = False, model_kwargs: dict[str, Any] | None = None,
              ) -> "gr.Blocks":
    """The Optimus explorer of the model in `source` (a folder or Hub repo id); `model_kwargs` go to the model's
    `from_pretrained` (`dtype`, `device_map`)."""
    import gradio as gr

    from .attributes import default_method, load_latent_attributes

    model, processor = load_optimus(source, trust_remote_code, **(model_kwargs or {}))
    limit = model.config.max_decoder_tokens
    try:
        operators, missing = load_latent_attributes(source, model), ""
    except ValueError as error:  # none, or trained on another model: the other tabs still work
        operators, missing = None, str(error)
    app = OptimusApp(OptimusLatentSpace(model, processor, max_new_tokens=min(MAX_NEW_TOKENS, limit)), operators,
                     missing)
    examples = bundled_sentences()
    text: dict[str, Any] = dict(max_length=MAX_TEXT_CHARS, lines=1)

    name = model_name(source)  # a repo id or the folder's own name, not a local path
    with gr.Blocks(title=f"Optimus: {name}", analytics_enabled=False) as blocks:
        gr.Markdown(f"# Optimus latent space\n`{name}`: latent size {model.config.latent_size}. Sentences are "
                    "encoded to their posterior means and decoded with the options below.")
        sentences = gr.State([])
        with gr.Accordion("Decoding", open=False):
            with gr.Row():
                decoding = gr.Radio(list(DECODINGS), value="greedy", label="decoding")
                num_beams = gr.Slider(1, MAX_BEAMS, value=4, step=1, label="beams")
                top_p = gr.Slider(0.01, 1.0, value=0.9, step=0.01, label="top-p")
                seed = gr.Number(0, precision=0, minimum=0, label="seed")
        decoding_options = [decoding, num_beams, top_p, seed]

        with gr.Tab("Interpolate"):
            with gr.Row():
                start = gr.Textbox(label="first sentence", elem_id="start", **text)
                end = gr.Textbox(label="last sentence", elem_id="end", **text)
            gr.Examples([[examples[0], examples[1]], [examples[2], examples[3]]], [start, end])
            with gr.Row():
                steps = gr.Slider(2, MAX_STEPS, value=5, step=1, label="steps")
                interpolate_button = gr.Button("Interpolate", variant="primary")
            path = gr.Dataframe(headers=["t", "sentence"], label="path", interactive=False, elem_id="path")
            t = gr.Slider(0, 1, value=0.5, step=0.05, label="t", elem_id="t")
            at_t = gr.Textbox(label="decoded at t", elem_id="at_t", interactive=False)
        with gr.Tab("Reconstruct"):
            sentence = gr.Textbox(label="sentence", elem_id="sentence", **text)
            gr.Examples([[example] for example in examples[:4]], [sentence])
            reconstruct_button = gr.Button("Reconstruct", variant="primary")
            reconstruction = gr.Textbox(label="reconstruction", elem_id="reconstruction", interactive=False)
        with gr.Tab("Analogy"):
            with gr.Row():
                a, b, c = (gr.Textbox(label=name, **text) for name in ("a", "b", "c"))
            degree = gr.Slider(-MAX_DEGREE, MAX_DEGREE, value=1.0, step=0.1, label="degree")
            analogy_button = gr.Button("a : b :: c : ?", variant="primary")
            completion = gr.Textbox(label="?", interactive=False)
        with gr.Tab("Sample"):
            with gr.Row():
                count = gr.Slider(1, MAX_SAMPLES, value=5, step=1, label="samples")
                temperature = gr.Slider(0, MAX_PRIOR_TEMPERATURE, value=1.0, step=0.05,
                                        label="temperature (z = temperature x N(0, I))")
            sample_button = gr.Button("Sample", variant="primary")
            samples = gr.JSON(label="sentences")
        with gr.Tab("Guided"):
            gr.Markdown("Attribute operators of this folder: " + (
                "; ".join(f"`{name}`: {', '.join(operator.labels)}" for name, operator in operators.items())
                if operators else missing) + ". Request attributes as `name=label; name=label`; decoding is greedy.")
            attributes = gr.Textbox(label="attributes", elem_id="attributes", **text)
            method = gr.Radio(list(METHODS), value=default_method(operators) if operators else DEFAULT_METHOD,
                              label="method (gaussian: the labels' Gaussians and the latent arithmetic of their "
                              "means; flow: LatentOps' ODE on the classifiers; conditional: the label embeddings of a "
                              "model fine-tuned with them)")
            with gr.Row():
                guided_count = gr.Slider(1, MAX_SAMPLES, value=5, step=1, label="samples")
                guided_seed = gr.Number(0, precision=0, minimum=0, label="seed")
                guided_button = gr.Button("Sample with these attributes", variant="primary")
            guided_samples = gr.JSON(label="sentences")
            edited_sentence = gr.Textbox(label="sentence to edit", elem_id="edited_sentence", **text)
            edit_button = gr.Button("Edit to these attributes", variant="primary")
            edited = gr.Textbox(label="edited", elem_id="edited", interactive=False)
        latent_map = gr.Plot(label="latent space", format="png", elem_id="latent_map")

        draw, remember = user_errors(app.latent_map), app.remember
        interpolate_button.click(user_errors(app.interpolate), [start, end, steps, *decoding_options], path,
                                 api_name="interpolate").success(
            remember, [sentences, start, end], sentences, api_visibility="private").then(
            draw, [sentences, start, end, steps], latent_map, api_visibility="private")
        t.change(user_errors(app.interpolate_at), [start, end, t, *decoding_options], at_t, api_visibility="private")
        reconstruct_button.click(user_errors(app.reconstruct), [sentence, *decoding_options], reconstruction,
                                 api_name="reconstruct").success(
            remember, [sentences, sentence], sentences, api_visibility="private").then(
            draw, [sentences, start, end, steps], latent_map, api_visibility="private")
        analogy_button.click(user_errors(app.analogy), [a, b, c, degree, *decoding_options], completion,
                             api_name="analogy").success(
            remember, [sentences, a, b, c], sentences, api_visibility="private").then(
            draw, [sentences, start, end, steps], latent_map, api_visibility="private")
        sample_button.click(user_errors(app.sample), [count, temperature, *decoding_options], samples,
                            api_name="sample")
        guided_button.click(user_errors(app.guided_sample), [attributes, guided_count, guided_seed, method],
                            guided_samples,
                            api_name="guided_sample")
        edit_button.click(user_errors(app.edit), [edited_sentence, attributes, method], edited,
                          api_name="edit")
    return blocks
