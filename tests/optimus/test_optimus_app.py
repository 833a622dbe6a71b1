"""`hf-ext serve` on an Optimus folder, through Gradio's API (gradio_client) on a local port: each named function
answers what `OptimusLatentSpace` computes, and bad input gets one clear message."""

import pytest
import torch

from hf_ext.models.optimus import OptimusLatentSpace
from hf_ext.serve import MAX_TEXT_CHARS

pytestmark = pytest.mark.slow
APP_FOLDER = "optimus_sample_folder"  # the `client` fixture serves it
GREEDY = ("greedy", 4, 0.9, 0)  # decoding, beams, top-p, seed
START, END = "a man is playing a guitar .", "a woman is reading a book ."


@pytest.fixture(scope="module")
def space(optimus_sample_folder):
    from hf_ext.models.optimus.app import MAX_NEW_TOKENS

    return OptimusLatentSpace.from_pretrained(optimus_sample_folder, max_new_tokens=MAX_NEW_TOKENS)


def test_the_api_names_are_stable(client):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert sorted(endpoints) == ["/analogy", "/edit", "/guided_sample", "/interpolate", "/reconstruct", "/sample"]
    assert [p["parameter_name"] for p in endpoints["/interpolate"]["parameters"]] == [
        "start", "end", "steps", "decoding", "num_beams", "top_p", "seed"]


def test_reconstruct_interpolate_and_analogy_decode_as_the_library(client, space):
    assert client.predict(START, *GREEDY, api_name="/reconstruct") == space.reconstruct([START])[0]
    path = client.predict(START, END, 3, *GREEDY, api_name="/interpolate")
    assert path["headers"] == ["t", "sentence"]
    assert path["data"] == [[t, text] for t, text in space.interpolate(START, END, 3)]
    assert client.predict(START, END, START, 0.5, *GREEDY, api_name="/analogy") == space.analogy(START, END, START,
                                                                                                 0.5)
    beams = client.predict(START, "beam search", 2, 0.9, 0, api_name="/reconstruct")
    assert beams == space.reconstruct([START], num_beams=2)[0]


def test_samples_are_the_prior_at_a_temperature(client, space):
    samples = client.predict(3, 0.5, *GREEDY, api_name="/sample")
    latents = space.model.sample_prior(3, torch.Generator().manual_seed(0)) * 0.5
    assert samples == space.decode(latents) and len(samples) == 3
    assert client.predict(3, 0.5, *GREEDY, api_name="/sample") == samples  # the seed makes it repeatable


@pytest.mark.parametrize("arguments, message", [
    (("/reconstruct", "  ", *GREEDY), "^the sentence is empty$"),
    (("/reconstruct", "x" * (MAX_TEXT_CHARS + 1), *GREEDY),
     f"^the sentence has {MAX_TEXT_CHARS + 1} characters; the limit is {MAX_TEXT_CHARS}$"),
    (("/interpolate", START, END, 2.5, *GREEDY), r"^steps must be an integer in \[2, 16\], got 2.5$"),
    (("/analogy", START, "", START, 1.0, *GREEDY), "^sentence b is empty$"),
    # what the components refuse themselves (gradio's words)
    (("/reconstruct", START, "telepathy", 4, 0.9, 0), "'telepathy' .*not in the list of choices"),
    (("/interpolate", START, END, 40, *GREEDY), "40 is greater than maximum value 16"),
])
def test_bad_input_is_one_message(client, arguments, message):
    from gradio_client.exceptions import AppError

    api_name, *values = arguments
    with pytest.raises(AppError, match=message):
        client.predict(*values, api_name=api_name)


def test_the_latent_map_draws_the_sentences_and_the_path(space):
    from hf_ext.models.optimus.app import OptimusApp

    app = OptimusApp(space)
    sentences = app.remember([], START, END)
    sentences = app.remember(sentences, "a dog runs .", START, "")
    assert sentences == [END, "a dog runs .", START]
    assert app.latent_map(sentences[:1]) is None
    figure = app.latent_map(sentences, START, END, 4)
    map_axis, listing = figure.axes
    assert len(map_axis.collections[0].get_offsets()) == 3  # the posterior means
    assert len(map_axis.lines[0].get_xydata()) == 4  # the path through them
    assert listing.texts[0].get_text().count("t=") == 4
    assert len(app.latent_map(sentences, START, "not entered", 4).axes[0].lines) == 0
    # every point drawn is in the legend, and nothing in the legend is not drawn
    assert [text.get_text() for text in map_axis.get_legend().get_texts()] == [
        "posterior means of the sentences", "interpolation"]
    assert "of the variance" in map_axis.get_ylabel()


@pytest.mark.parametrize("path", [False, True], ids=["two sentences", "the path between them"])
def test_two_sentences_are_drawn_on_one_axis(space, path):
    from hf_ext.models.optimus.app import OptimusApp

    figure = OptimusApp(space).latent_map([START, END], *((START, END, 3) if path else ()))
    map_axis = figure.axes[0]
    # two points span a line: no second axis of rounding noise
    assert map_axis.get_ylabel() == "(the means lie on one line)" and list(map_axis.get_yticks()) == []
    assert (map_axis.collections[0].get_offsets()[:, 1] == 0).all()
    assert "100% of the variance" in map_axis.get_xlabel()
