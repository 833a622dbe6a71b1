"""The README's main job, `hf-ext demo`: end to end with a few training steps, and with its real defaults, where the
model it trains must reconstruct the sentences, interpolate between two of them and keep an informative latent."""

import json

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModel

from hf_ext.cli import main
from hf_ext.models.optimus.demo import ACTIVITIES, PLACES, SHOWN, SUBJECTS, dropout_probabilities
from hf_ext.sample_text import bundled_sentences

pytestmark = pytest.mark.slow

SUMMARY_FIELDS = {"reconstructions", "interpolation", "kl", "active_units", "mutual_information", "seconds"}


def parts(text):
    """The recombination parts a sentence contains (as words in a row)."""
    return [part for part in (*SUBJECTS, *ACTIVITIES, *PLACES) if f" {part} " in f" {text} "]


def position_accuracy(reference, output):
    """Matching words at the same positions, over the longer sentence (the definition docs/optimus.md gives)."""
    reference, output = reference.split(), output.split()
    return sum(a == b for a, b in zip(reference, output, strict=False)) / max(len(reference), len(output))


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path, capsys, no_network):
    workdir = tmp_path / "demo"
    assert main(["demo", "--workdir", str(workdir), "--max-steps", "4"]) == 0
    out, err = capsys.readouterr()
    assert "huggingface.co" not in err and "Retrying" not in err
    for step in ("1. writing", "2. converting", "3. loading AutoModel.from_pretrained('hf-ext/optimus-demo')",
                 "4. training", "step    4/4", "5. reconstructions", "t=1.00", "6. writing", "done in"):
        assert step in out
    assert len(out.splitlines()) < 45  # a few lines per step
    # the fine-tuned model was saved, and it differs from the converted one
    converted = AutoModel.from_pretrained(workdir / "converted")
    finetuned = AutoModel.from_pretrained(workdir / "finetuned")
    assert not torch.equal(converted.to_latent.weight, finetuned.to_latent.weight)
    # it was trained without dropout, and its configuration says so: continuing from it trains the same model
    saved = json.loads((workdir / "finetuned" / "config.json").read_text())
    probabilities = {f"{side}.{name}": saved[side][name] for side in ("encoder", "decoder")
                     for name in dropout_probabilities(getattr(finetuned.config, side))}
    assert len(probabilities) >= 5 and set(probabilities.values()) == {0.0}, probabilities
    assert not (workdir / "trainer").exists()  # the Trainer's working folder, which the demo leaves empty
    summary = json.loads((workdir / "demo.json").read_text())
    assert SUMMARY_FIELDS <= set(summary)
    assert [row["input"] for row in summary["reconstructions"]] == bundled_sentences()
    assert (workdir / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the fine-tuned model's card records what the demo measured of it
    card = ModelCard.load(workdir / "finetuned" / "README.md")
    recorded = {result.metric_type: result.metric_value for result in card.data.eval_results}
    assert recorded["kl"] == summary["kl"] and recorded["active_units"] == summary["active_units"]
    assert recorded["word_accuracy"] == pytest.approx(
        sum(row["word_accuracy"] for row in summary["reconstructions"]) / len(summary["reconstructions"]))
    # a second run replaces its own folder, but a foreign folder is refused
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    assert main(["demo", "--workdir", str(foreign), "--max-steps", "1"]) == 1
    assert "was not written by hf-ext demo" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_defaults_give_a_working_vae(tmp_path, capsys, no_network):
    workdir = tmp_path / "demo"
    assert main(["demo", "--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    summary = json.loads((workdir / "demo.json").read_text())
    assert SUMMARY_FIELDS <= set(summary)
    rows = summary["reconstructions"]
    assert len(rows) == len(bundled_sentences())
    accuracies = [position_accuracy(row["input"], row["output"]) for row in rows]
    assert [row["word_accuracy"] for row in rows] == pytest.approx(accuracies)
    # the sentences whose reconstructions the demo prints are reconstructed, and nearly all of the rest
    for index in SHOWN:
        assert rows[index]["input"] in out and rows[index]["output"] in out
        assert accuracies[index] >= 0.9, rows[index]
    assert sum(accuracies) / len(accuracies) >= 0.9
    outputs = [row["output"] for row in rows]
    assert len(set(outputs)) >= 0.9 * len(outputs)
    interpolation = summary["interpolation"]
    steps = interpolation["steps"]
    assert interpolation["source"] != interpolation["target"]
    assert [step["t"] for step in steps] == pytest.approx([i / (len(steps) - 1) for i in range(len(steps))])
    assert steps[0]["text"] == interpolation["source"] and steps[-1]["text"] == interpolation["target"]
    assert len({step["text"] for step in steps}) >= 3  # the path passes through other sentences on its way
    # and on the way it recombines: a step that is neither end keeps a part (subject, activity or place) of one
    ends = (interpolation["source"], interpolation["target"])
    assert any(step["text"] not in ends and (step["parts_from_source"] or step["parts_from_target"])
               for step in steps[1:-1]), steps
    for step in steps:
        assert set(step["parts_from_source"] + step["parts_from_target"]) <= set(parts(step["text"])), step
    # an informative latent: a real KL, most dimensions active, the sentences told apart
    assert summary["kl"] > 5
    assert summary["active_units"] >= summary["latent_size"] // 2
    assert summary["mutual_information"] > 2
    assert 0 < summary["seconds"] < 600
