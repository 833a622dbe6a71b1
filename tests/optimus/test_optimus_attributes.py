"""Latent attribute operators (`hf_ext.models.optimus.attributes`) on a tiny Optimus: training on the bundled
sentences' parts, saving and loading (a foreign operator refused), guided sampling that the classifiers accept more
often than the unguided draws, editing that moves the requested attribute and keeps the others (both methods: the
flow on the classifiers and the label Gaussians), the commands and the app's `guided_sample` and `edit`
endpoints."""

import random
import shutil

import pytest
import torch

from hf_ext.models.optimus import OptimusLatentSpace, OptimusModel
from hf_ext.models.optimus.attributes import (
    ATTRIBUTES_FOLDER,
    LatentAttribute,
    arithmetic_edited_latents,
    edited_latents,
    guided_latents,
    label_gaussian,
    latent_base,
    latent_fingerprint,
    load_latent_attributes,
    parse_request,
    train_latent_attribute,
)
from hf_ext.models.optimus.demo import ACTIVITIES, SUBJECTS, recombined_sentences, sentence_parts

pytestmark = pytest.mark.slow  # the operators take seconds to train
APP_FOLDER = "optimus_attribute_folder"  # the `client` fixture serves it
PARTS = {"subject": SUBJECTS, "activity": ACTIVITIES}
PER_LABEL = 12


def labelled(part, seed=0):
    """`PER_LABEL` recombined sentences of each label of `part`, and their labels."""
    rng = random.Random(seed)
    texts = [text for label in PARTS[part]
             for text in rng.sample([t for t in recombined_sentences() if sentence_parts(t)[part] == label], PER_LABEL)]
    return texts, [sentence_parts(text)[part] for text in texts]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny converted Optimus with random weights and a latent of 16 (the sample folder's 5 dimensions tell the
    subjects apart less well)."""
    from hf_ext.models.optimus.conversion import convert_optimus_checkpoint
    from hf_ext.models.optimus.samples import write_sample_checkpoint

    root = tmp_path_factory.mktemp("optimus_attributes")
    write_sample_checkpoint(root / "original", seed=7, latent_size=16, hidden_size=32)
    convert_optimus_checkpoint(root / "original", root / "converted")
    return root / "converted"


@pytest.fixture(scope="module")
def space(tiny_folder):
    return OptimusLatentSpace.from_pretrained(tiny_folder, max_new_tokens=12)


@pytest.fixture(scope="module")
def operators(space):
    return {part: train_latent_attribute(space, *labelled(part), part) for part in PARTS}


def accuracy(attribute, space, texts, labels):
    predicted = attribute.predict(space.encode(texts)[0])
    return sum(p == label for p, label in zip(predicted, labels, strict=True)) / len(labels)


def test_an_operator_learns_its_attribute_from_a_dozen_labels_per_class(space, operators):
    # a random model's latent holds its sentences' parts only in part: the operators tell them apart well above
    # chance (1/6), on the sentences they learnt from and on those they never saw
    for part, attribute in operators.items():
        texts, labels = labelled(part)
        assert accuracy(attribute, space, texts, labels) >= 0.5
        unseen = [text for text in recombined_sentences() if text not in texts]
        assert accuracy(attribute, space, unseen, [sentence_parts(t)[part] for t in unseen]) >= 1 / 3
        assert attribute.fingerprint == latent_fingerprint(space.model)


def test_guided_latents_satisfy_the_classifiers_more_often_than_the_draws_they_start_from(space, operators):
    generator = torch.Generator().manual_seed(0)
    mean, scale = latent_base(operators.values())
    for request in ({"subject": SUBJECTS[2]}, {"subject": SUBJECTS[0], "activity": ACTIVITIES[3]}):
        guided = guided_latents(operators, request, 64, space.model.config.latent_size, generator)
        unguided = mean + torch.randn((64, len(mean)), generator=generator) @ scale.T

        def accepted(latents, request=request):
            return sum(all(operators[name].predict(latents)[row] == label for name, label in request.items())
                       for row in range(len(latents))) / len(latents)

        assert accepted(guided) >= 0.9 > accepted(unguided) + 0.3


def accepted(operators, latents, request):
    """The share of `latents` that every requested operator's classifier gives its requested label."""
    return sum(all(operators[name].predict(latents)[row] == label for name, label in request.items())
               for row in range(len(latents))) / len(latents)


def test_gaussian_latents_satisfy_the_classifiers_more_often_than_prior_draws(space, operators):
    # the label Gaussians are fitted to the posterior means, the classifiers to those means and posterior draws: the
    # classifiers judge the Gaussians' samples independently (a random model's classifiers are weak judges: 0.36 to
    # 0.69 acceptance against 0.02 to 0.38 for the draws); the Gaussians' own nearest label accepts 0.70 to 0.97
    # only the requested operators are passed: the others would each add a random label to every draw (next test)
    generator = torch.Generator().manual_seed(0)
    mean, scale = latent_base(operators.values())
    for request in ({"subject": SUBJECTS[2]}, {"activity": ACTIVITIES[1]},
                    {"subject": SUBJECTS[0], "activity": ACTIVITIES[3]}):
        requested = {name: operators[name] for name in request}
        guided = guided_latents(requested, request, 64, space.model.config.latent_size, generator, method="gaussian")
        prior = space.model.sample_prior(64, generator)
        fitted = mean + torch.randn((64, len(mean)), generator=generator) @ scale.T
        assert accepted(operators, guided, request) > max(accepted(operators, prior, request),
                                                          accepted(operators, fitted, request)) + 0.2
        nearest = {name: operators[name].nearest_label(guided) for name in request}
        assert sum(all(nearest[name][row] == operators[name].label_id(label) for name, label in request.items())
                   for row in range(len(guided))) / len(guided) >= 0.7


def test_gaussian_sampling_draws_a_label_of_every_operator_not_requested(space, operators):
    # p(z | subject) as the mixture over the activity's labels of p(z | subject, activity): at temperature 0 every
    # draw is the mean of one component, and 64 draws hit all six (one Gaussian would give 64 equal latents)
    subject, activity = operators["subject"], operators["activity"]
    request = {"subject": SUBJECTS[2]}
    guided = guided_latents(operators, request, 64, space.model.config.latent_size, torch.Generator().manual_seed(0),
                            method="gaussian", temperature=0.0)
    components = torch.stack([label_gaussian([(subject, subject.label_id(SUBJECTS[2])), (activity, label)])[0]
                              for label in range(len(activity.labels))])
    distances = (guided[:, None] - components[None]).norm(dim=-1)
    assert distances.min(1).values.max() < 1e-4
    assert len(set(distances.argmin(1).tolist())) == len(activity.labels)


def test_gaussian_editing_changes_the_predicted_label_and_keeps_the_others(space, operators):
    sentences = recombined_sentences()[::11]
    means = space.encode(sentences)[0]
    before = {part: operators[part].predict(means) for part in PARTS}
    targets = [next(label for label in SUBJECTS if label != current) for current in before["subject"]]
    moved = torch.cat([arithmetic_edited_latents(operators, means[row:row + 1], {"subject": target}, keep_others=True)
                       for row, target in enumerate(targets)])
    # by the label Gaussians' nearest label (0.8 here) and by the classifier (0.2 here; 0 before, by the choice of
    # the targets), the activity's classifier keeping its label (0.95 here)
    subject = operators["subject"]
    nearest = [subject.labels[index] for index in subject.nearest_label(moved).tolist()]
    assert sum(n == t for n, t in zip(nearest, targets, strict=True)) / len(targets) >= 0.7
    assert sum(p == t for p, t in zip(subject.predict(moved), targets, strict=True)) / len(targets) >= 0.15
    kept = sum(p == b for p, b in zip(operators["activity"].predict(moved), before["activity"], strict=True))
    assert kept / len(targets) >= 0.9
    # the move is the difference of the two labels' means, less its part along the activity's label means
    activity = operators["activity"]
    step = subject.label_means[subject.label_id(targets[0])] - subject.label_means[subject.nearest_label(means[:1])[0]]
    directions = activity.label_means - activity.label_means.mean(0)
    assert (moved[0] - means[0] - step).norm() > 0
    torch.testing.assert_close((moved[0] - means[0]) @ directions.T, torch.zeros(len(directions)), atol=1e-4,
                               rtol=0)
    assert arithmetic_edited_latents(operators, means[:1], {"subject": before["subject"][0]}).equal(means[:1])


def test_editing_moves_the_attribute_and_keeps_the_others(space, operators):
    sentences = recombined_sentences()[::31]
    means = space.encode(sentences)[0]
    before = {part: operators[part].predict(means) for part in PARTS}
    targets = [next(label for label in SUBJECTS if label != current) for current in before["subject"]]
    moved = torch.cat([edited_latents(operators, means[row:row + 1], {"subject": target})[0]
                       for row, target in enumerate(targets)])
    assert operators["subject"].predict(moved) == targets
    assert operators["activity"].predict(moved) == before["activity"]
    # and it stays near the sentence: closer than the nearest sentence of the target subject is
    for row, target in enumerate(targets):
        others = space.encode([text for text in recombined_sentences() if sentence_parts(text)["subject"] == target])[0]
        assert (moved[row] - means[row]).norm() < (others - means[row]).norm(dim=1).max()


def test_an_operator_saves_and_loads_and_refuses_another_model(space, operators, tmp_path, optimus_tiny_converted):
    for attribute in operators.values():
        attribute.save(tmp_path / ATTRIBUTES_FOLDER / attribute.name)
    loaded = load_latent_attributes(tmp_path, space.model)
    assert sorted(loaded) == sorted(operators)
    latents = torch.randn(8, space.model.config.latent_size)
    for name, attribute in operators.items():
        assert loaded[name].labels == attribute.labels and loaded[name].has_label_gaussians
        torch.testing.assert_close(loaded[name](latents), attribute(latents))
        torch.testing.assert_close(loaded[name].label_means, attribute.label_means, atol=0, rtol=0)
        torch.testing.assert_close(loaded[name].label_scale, attribute.label_scale, atol=0, rtol=0)
        assert not attribute.label_means.equal(torch.zeros_like(attribute.label_means))
    other = OptimusModel.from_pretrained(optimus_tiny_converted)
    with pytest.raises(ValueError, match="latent size|trained on another model"):
        load_latent_attributes(tmp_path, other)
    shifted = LatentAttribute("subject", ["a", "b"], space.model.config.latent_size, fingerprint="0" * 16)
    shutil.rmtree(tmp_path / ATTRIBUTES_FOLDER / "subject")
    shifted.save(tmp_path / ATTRIBUTES_FOLDER / "subject")
    with pytest.raises(ValueError, match="'subject' .* was trained on another model"):
        load_latent_attributes(tmp_path, space.model)


def test_an_operator_of_format_1_loads_for_the_flow_only(space, operators, tmp_path):
    from bad_input_optimus import as_format_1

    operators["subject"].save(tmp_path / ATTRIBUTES_FOLDER / "subject")
    as_format_1(tmp_path / ATTRIBUTES_FOLDER / "subject")
    loaded = load_latent_attributes(tmp_path, space.model)["subject"]
    assert not loaded.has_label_gaussians
    latents = torch.randn(8, space.model.config.latent_size)
    torch.testing.assert_close(loaded(latents), operators["subject"](latents))
    generator = torch.Generator().manual_seed(0)
    assert guided_latents({"subject": loaded}, {"subject": SUBJECTS[0]}, 2, len(latents[0]), generator,
                          steps=4).shape == (2, len(latents[0]))
    with pytest.raises(ValueError, match="'subject' was saved before label Gaussians existed"):
        guided_latents({"subject": loaded}, {"subject": SUBJECTS[0]}, 2, len(latents[0]), method="gaussian")
    with pytest.raises(ValueError, match="newer than this hf-ext reads"):
        (tmp_path / ATTRIBUTES_FOLDER / "subject" / "attribute.json").write_text(
            '{"format_version": 3, "name": "subject", "labels": ["a", "b"], "latent_size": 16, "hidden_size": 64, '
            '"model_fingerprint": ""}')
        LatentAttribute.load(tmp_path / ATTRIBUTES_FOLDER / "subject")


def test_requests_are_checked(operators):
    assert parse_request(["subject=a man", " place = on the beach "]) == {"subject": "a man", "place": "on the beach"}
    with pytest.raises(ValueError, match="contradictory request"):
        parse_request(["subject=a man", "subject=a woman"])
    with pytest.raises(ValueError, match="name=label"):
        parse_request(["subject"])
    for request, message in (({}, "no attributes requested"), ({"mood": "happy"}, "unknown attribute 'mood'"),
                             ({"subject": "a dog"}, "has no label 'a dog'")):
        with pytest.raises(ValueError, match=message):
            guided_latents(operators, request, 2, 5)
    with pytest.raises(ValueError, match="unknown method 'magic'; the methods are: gaussian, flow, conditional"):
        guided_latents(operators, {"subject": "a man"}, 2, 5, method="magic")


def test_the_commands_train_sample_and_edit(tiny_folder, tmp_path, capsys):
    import json

    from hf_ext.cli import main

    folder = tmp_path / "model"
    shutil.copytree(tiny_folder, folder)
    texts, labels = labelled("subject")
    data = tmp_path / "subject.jsonl"
    data.write_text("".join(json.dumps({"text": text, "label": label}) + "\n"
                            for text, label in zip(texts, labels, strict=True)))
    assert main(["optimus", "attribute", "train", str(folder), str(folder), "--data", str(data),
                 "--name", "subject"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["labels"] == {label: PER_LABEL for label in SUBJECTS} and summary["training_accuracy"] >= 0.5
    assert (folder / ATTRIBUTES_FOLDER / "subject" / "classifier.safetensors").is_file()
    assert main(["optimus", "attribute", "sample", str(folder), "--attribute", "subject=a girl", "--num", "3",
                 "--max-new-tokens", "8"]) == 0
    samples = capsys.readouterr().out.splitlines()
    space = OptimusLatentSpace.from_pretrained(folder, max_new_tokens=8)
    assert samples == space.guided_sample({"subject": "a girl"}, 3, generator=torch.Generator().manual_seed(0))
    assert main(["optimus", "attribute", "edit", str(folder), texts[0], "--attribute", "subject=a girl",
                 "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{texts[0]}\t->\t{space.edit(texts[0], {'subject': 'a girl'})[0]}"]
    # --method picks the method (the tiny model decodes the two methods' latents differently)
    by_method = {}
    for method in ("gaussian", "flow"):
        assert main(["optimus", "attribute", "sample", str(folder), "--attribute", "subject=a girl", "--num", "3",
                     "--max-new-tokens", "8", "--method", method, "--flow-steps", "20"]) == 0
        by_method[method] = capsys.readouterr().out.splitlines()
        assert by_method[method] == space.guided_sample({"subject": "a girl"}, 3, method=method, steps=20,
                                                        generator=torch.Generator().manual_seed(0))
        assert main(["optimus", "attribute", "edit", str(folder), *texts[:4], "--attribute", "subject=a girl",
                     "--max-new-tokens", "8", "--method", method, "--flow-steps", "20"]) == 0
        by_method[f"edit {method}"] = capsys.readouterr().out.splitlines()
        assert by_method[f"edit {method}"] == [f"{text}\t->\t{output}" for text, output in zip(
            texts[:4], space.edit(texts[:4], {"subject": "a girl"}, method=method, steps=20), strict=True)]
    assert by_method["gaussian"] == samples
    assert by_method["gaussian"] != by_method["flow"] or by_method["edit gaussian"] != by_method["edit flow"]


@pytest.fixture(scope="module")
def optimus_attribute_folder(tiny_folder, tmp_path_factory, operators):
    """The tiny folder with the subject and activity operators in it."""
    folder = tmp_path_factory.mktemp("optimus_attributes") / "model"
    shutil.copytree(tiny_folder, folder)
    for attribute in operators.values():
        attribute.save(folder / ATTRIBUTES_FOLDER / attribute.name)
    return folder


def test_the_app_samples_and_edits_as_the_library(client, optimus_attribute_folder, operators):
    from gradio_client.exceptions import AppError

    from hf_ext.models.optimus.app import MAX_NEW_TOKENS

    space = OptimusLatentSpace.from_pretrained(optimus_attribute_folder, max_new_tokens=MAX_NEW_TOKENS)
    request = {"subject": "a girl", "activity": "reading a book"}
    for method in ("gaussian", "flow"):
        assert client.predict("subject=a girl; activity=reading a book", 3, 5, method, api_name="/guided_sample") == \
            space.guided_sample(request, 3, operators=operators, generator=torch.Generator().manual_seed(5),
                                method=method)
        assert client.predict("a man is reading a book at home .", "subject=a girl", method, api_name="/edit") == \
            space.edit("a man is reading a book at home .", {"subject": "a girl"}, operators=operators,
                       method=method)[0]
    # the method's default is the library's
    assert client.predict("subject=a girl", 2, 1, api_name="/guided_sample") == \
        space.guided_sample({"subject": "a girl"}, 2, operators=operators, generator=torch.Generator().manual_seed(1))
    for attributes, message in (("mood=happy", "unknown attribute"), ("subject=a dog", "has no label"),
                                ("subject=a girl; subject=a boy", "contradictory request")):
        with pytest.raises(AppError, match=message):
            client.predict(attributes, 2, 0, api_name="/guided_sample")
    with pytest.raises(AppError, match=r"'magic' .* is not in the list of choices: "
                                       r"\['gaussian', 'flow', 'conditional'\]"):
        client.predict("a man is reading a book at home .", "subject=a girl", "magic", api_name="/edit")
