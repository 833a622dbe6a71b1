"""The Optimus paper's label-conditional generation (`hf_ext.models.optimus.conditional`, method `conditional`) on a
tiny Optimus: the fine-tuning with label embeddings added to z, samples that carry the requested subject more often
than prior samples do (judged by parsing the decoded sentences, `demo.sentence_parts`), edits that change it, the
operators saved with the fine-tuned model's folder and read back by the library, the command and the app."""

import json
import random
import shutil

import pytest
import torch

from hf_ext.models.optimus import OptimusLatentSpace, OptimusModel
from hf_ext.models.optimus.attributes import (
    ATTRIBUTES_FOLDER,
    ConditionalAttribute,
    conditional_edited_latents,
    latent_fingerprint,
    load_latent_attributes,
)
from hf_ext.models.optimus.conditional import labelled_rows, train_label_conditional
from hf_ext.models.optimus.demo import SUBJECTS, recombined_sentences, sentence_parts

APP_FOLDER = "conditional_folder"  # the `client` fixture serves it
PER_LABEL = 12
# a random tiny model's decoder learns to read the subjects' embeddings in this many steps at this rate
STEPS, LEARNING_RATE = 100, 1e-2


def labelled(seed=0):
    """`PER_LABEL` recombined sentences of each subject, and their subjects."""
    rng = random.Random(seed)
    texts = [text for label in SUBJECTS for text in
             rng.sample([t for t in recombined_sentences() if sentence_parts(t)["subject"] == label], PER_LABEL)]
    return texts, [sentence_parts(text)["subject"] for text in texts]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny converted Optimus with random weights and a latent of 16."""
    from hf_ext.models.optimus.conversion import convert_optimus_checkpoint
    from hf_ext.models.optimus.samples import write_sample_checkpoint

    root = tmp_path_factory.mktemp("optimus_conditional")
    write_sample_checkpoint(root / "original", seed=7, latent_size=16, hidden_size=32)
    convert_optimus_checkpoint(root / "original", root / "converted")
    return root / "converted"


@pytest.fixture(scope="module")
def trained(tiny_folder, tmp_path_factory):
    """The tiny model fine-tuned with the subjects' embeddings: its latent space, operators and trainer."""
    space = OptimusLatentSpace.from_pretrained(tiny_folder, max_new_tokens=12)
    operators, trainer = train_label_conditional(space.model, space.processor, {"subject": labelled()},
                                                 tmp_path_factory.mktemp("trainer"), steps=STEPS,
                                                 learning_rate=LEARNING_RATE, logging_steps=10, disable_tqdm=True)
    return space, operators, trainer


@pytest.fixture(scope="module")
def conditional_folder(trained, tmp_path_factory):
    """The fine-tuned model's folder with its operator in it."""
    space, operators, _ = trained
    folder = tmp_path_factory.mktemp("optimus_conditional") / "model"
    space.model.save_pretrained(folder)
    space.processor.save_pretrained(folder)
    operators["subject"].save(folder / ATTRIBUTES_FOLDER / "subject")
    return folder


def share(texts, labels):
    return sum(sentence_parts(text).get("subject") == label for text, label in zip(texts, labels, strict=True)) \
        / len(texts)


@pytest.mark.slow
def test_the_fine_tuning_lowers_the_reconstruction_loss_and_keeps_the_embeddings(trained):
    space, operators, trainer = trained
    losses = [entry["loss_rec"] for entry in trainer.state.log_history if "loss_rec" in entry]
    assert losses[-1] < losses[0] / 2
    subject = operators["subject"]
    assert subject.labels == sorted(SUBJECTS) and subject.fingerprint == latent_fingerprint(space.model)
    # the embeddings of different subjects differ, by more than the spread of the latents they are added to
    distances = torch.cdist(subject.embedding.weight, subject.embedding.weight)
    assert distances[~torch.eye(len(SUBJECTS), dtype=torch.bool)].min() > subject.latent_scale.diagonal().max()


@pytest.mark.slow
def test_samples_carry_the_requested_subject_more_often_than_prior_samples(trained):
    # measured: 1.0 against 0.0 to 0.08 for the prior
    space, operators, _ = trained
    generator = torch.Generator().manual_seed(0)
    requested = [label for label in SUBJECTS for _ in range(8)]
    guided = [text for label in SUBJECTS for text in
              space.guided_sample({"subject": label}, 8, operators=operators, generator=generator)]
    prior = space.sample(len(requested), generator)
    assert share(guided, requested) >= 0.8 > share(prior, requested) + 0.5
    # the method is the operators' own by default
    assert space.guided_sample({"subject": "a girl"}, 4, operators=operators,
                               generator=torch.Generator().manual_seed(1)) == \
        space.guided_sample({"subject": "a girl"}, 4, operators=operators, method="conditional",
                            generator=torch.Generator().manual_seed(1))


@pytest.mark.slow
def test_editing_adds_the_target_embedding_and_changes_the_subject(trained):
    space, operators, _ = trained
    subject = operators["subject"]
    sentences = recombined_sentences()[::23]
    targets = [next(label for label in reversed(SUBJECTS) if label != sentence_parts(text)["subject"])
               for text in sentences]
    edited = [space.edit(text, {"subject": target}, operators=operators)[0]
              for text, target in zip(sentences, targets, strict=True)]
    assert share(edited, targets) >= 0.8  # measured: 1.0
    assert share(sentences, targets) == 0
    means = space.encode(sentences[:1])[0]
    torch.testing.assert_close(conditional_edited_latents([(subject, subject.label_id(targets[0]))], means),
                               means + subject.embedding.weight[subject.label_id(targets[0])], atol=0, rtol=0)


@pytest.mark.slow
def test_the_operators_travel_with_the_fine_tuned_folder(trained, conditional_folder, tiny_folder):
    space, operators, _ = trained
    loaded_space = OptimusLatentSpace.from_pretrained(conditional_folder, max_new_tokens=12)
    loaded = loaded_space.latent_attributes()["subject"]
    assert isinstance(loaded, ConditionalAttribute) and loaded.labels == operators["subject"].labels
    for name, tensor in operators["subject"].state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, atol=0, rtol=0)
    assert loaded_space.guided_sample({"subject": "a girl"}, 3, generator=torch.Generator().manual_seed(0)) == \
        space.guided_sample({"subject": "a girl"}, 3, operators=operators, generator=torch.Generator().manual_seed(0))
    assert loaded_space.edit("a man is reading a book at home .", {"subject": "a girl"}) == \
        space.edit("a man is reading a book at home .", {"subject": "a girl"}, operators=operators)
    # the model before the fine-tuning refuses them; the classifier methods do not take them
    with pytest.raises(ValueError, match="'subject' .* was trained on another model"):
        load_latent_attributes(conditional_folder, OptimusModel.from_pretrained(tiny_folder))
    for method in ("gaussian", "flow"):
        with pytest.raises(ValueError, match="'subject' holds the label embeddings of a fine-tuned model"):
            loaded_space.guided_sample({"subject": "a girl"}, 2, method=method)


def test_labelled_sentences_become_rows_of_label_ids():
    names, texts, ids = labelled_rows({"subject": (["a man is .", "a girl is ."], ["a man", "a girl"]),
                                       "place": (["a girl is .", "x"], ["home", "park"])})
    assert names == {"subject": ["a girl", "a man"], "place": ["home", "park"]}
    assert texts == ["a man is .", "a girl is .", "x"] and ids == [[1, -1], [0, 0], [-1, 1]]
    with pytest.raises(ValueError, match="'a man is .' is labelled both 'a man' and 'a girl'"):
        labelled_rows({"subject": (["a man is .", "a man is ."], ["a man", "a girl"])})


@pytest.mark.slow
def test_the_command_writes_a_fine_tuned_model_folder(tiny_folder, tmp_path, capsys):
    from hf_ext.cli import main

    texts, labels = labelled()
    data = tmp_path / "subject.jsonl"
    data.write_text("".join(json.dumps({"text": text, "label": label}) + "\n"
                            for text, label in zip(texts, labels, strict=True)))
    out = tmp_path / "conditional"
    assert main(["optimus", "attribute", "train", str(tiny_folder), str(out), "--method", "conditional", "--name",
                 "subject", "--data", str(data), "--steps", "4", "--device", "cpu"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["operators"] == ["subject"] and summary["steps"] == 4
    assert summary["labels"] == {"subject": {label: PER_LABEL for label in SUBJECTS}}
    space = OptimusLatentSpace.from_pretrained(out, max_new_tokens=8)
    assert summary["model_fingerprint"] == latent_fingerprint(space.model) != \
        latent_fingerprint(OptimusModel.from_pretrained(tiny_folder))
    assert main(["optimus", "attribute", "sample", str(out), "--attribute", "subject=a girl", "--num", "3",
                 "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.splitlines() == space.guided_sample({"subject": "a girl"}, 3,
                                                                       generator=torch.Generator().manual_seed(0))
    assert main(["optimus", "attribute", "edit", str(out), texts[0], "--attribute", "subject=a girl",
                 "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{texts[0]}\t->\t{space.edit(texts[0], {'subject': 'a girl'})[0]}"]
    shutil.rmtree(out)


@pytest.mark.slow
def test_the_app_samples_and_edits_by_the_label_embeddings(client, trained):
    space, operators, _ = trained
    from hf_ext.models.optimus.app import MAX_NEW_TOKENS

    space = OptimusLatentSpace(space.model, space.processor, max_new_tokens=MAX_NEW_TOKENS)
    expected = space.guided_sample({"subject": "a girl"}, 3, operators=operators,
                                   generator=torch.Generator().manual_seed(5))
    assert client.predict("subject=a girl", 3, 5, "conditional", api_name="/guided_sample") == expected
    # the method's default is the folder's operators' own
    assert client.predict("subject=a girl", 3, 5, api_name="/guided_sample") == expected
    assert client.predict("a man is reading a book at home .", "subject=a girl", "conditional", api_name="/edit") == \
        space.edit("a man is reading a book at home .", {"subject": "a girl"}, operators=operators)[0]
