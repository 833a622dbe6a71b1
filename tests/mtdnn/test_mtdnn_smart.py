"""SMART adversarial training (issue 26 item 4): the adversarial loss equals the original's `SmartPerturbation` on
the fixture (`tests/fixtures/mtdnn/smart/`, written by the original's code), every norm runs, the Trainer adds the
term and logs it, and the command's --adv-* options are checked."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext.models.mtdnn import MTDNNModel
from hf_ext.models.mtdnn.smart import SmartSettings, adversarial_loss, stable_kl, symmetric_kl

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "mtdnn" / "smart"
REFERENCE = json.loads((FIXTURE / "reference.json").read_text())


@pytest.fixture(scope="module")
def fixture_model():
    return MTDNNModel.from_pretrained(FIXTURE / "model").train()  # as the original's update(); every dropout is 0


def case_id(case):
    return f"{case['task']}-k{case['adv_k']}"


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=case_id)
def test_adversarial_loss_equals_the_originals(fixture_model, case):
    inputs = load_file(FIXTURE / "inputs.safetensors")
    spec = fixture_model.config.task(case["task"])
    logits = fixture_model(**inputs, task=case["task"]).logits
    settings = SmartSettings(k=case["adv_k"], step_size=case["adv_step_size"], noise_var=case["adv_noise_var"],
                             epsilon=case["adv_epsilon"], p_norm=case["adv_p_norm"],
                             norm_level=case["adv_norm_level"])
    torch.manual_seed(case["noise_seed"])
    loss = adversarial_loss(fixture_model, spec, logits, inputs, settings)
    assert loss.item() > 1e-5  # the perturbation moves the outputs: a real value is compared
    assert loss.item() == pytest.approx(case["adv_loss"], abs=REFERENCE["written_by"]["tolerance"]["atol"])
    assert loss.item() == pytest.approx(case["adv_loss"], rel=1e-4)  # the losses are small: closer than the atol


def test_the_fixture_states_what_wrote_it():
    written_by = REFERENCE["written_by"]
    assert "mt_dnn/perturbation.py" in written_by["smart"] and len(written_by["original_commit"]) == 40
    assert {case["task"] for case in REFERENCE["cases"]} == {"cls", "reg", "rank", "san"}


def test_every_norm_runs_and_each_moves_the_noise_its_own_way(fixture_model):
    """The original runs only `inf` per token (the others end in an unbound variable there); here each one gives a
    finite loss of its own."""
    inputs = load_file(FIXTURE / "inputs.safetensors")
    spec = fixture_model.config.task("cls")
    logits = fixture_model(**inputs, task="cls").logits
    losses = {}
    for p_norm, norm_level in [("inf", 0), ("inf", 1), ("l2", 0), ("l2", 1), ("l1", 0)]:
        torch.manual_seed(0)
        settings = SmartSettings(p_norm=p_norm, norm_level=norm_level)
        losses[p_norm, norm_level] = adversarial_loss(fixture_model, spec, logits, inputs, settings).item()
    assert all(math.isfinite(value) and value > 0 for value in losses.values()), losses
    assert len({round(value, 9) for value in losses.values()}) == len(losses), losses


def test_the_adversarial_loss_reaches_every_weight_it_should(fixture_model):
    """The term trains the encoder (through the clean and the perturbed passes) and the task's head."""
    inputs = load_file(FIXTURE / "inputs.safetensors")
    fixture_model.zero_grad()
    logits = fixture_model(**inputs, task="cls").logits
    torch.manual_seed(0)
    adversarial_loss(fixture_model, fixture_model.config.task("cls"), logits, inputs, SmartSettings()).backward()
    assert fixture_model.get_input_embeddings().weight.grad.abs().sum() > 0
    assert fixture_model.heads["cls"].out_proj.weight.grad.abs().sum() > 0
    assert fixture_model.heads["reg"].out_proj.weight.grad is None


def test_criteria_are_the_originals_on_known_values():
    logits, target = torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([[0.0, 1.0, 0.0]])
    p, q = logits.softmax(-1), target.softmax(-1)
    expected = (p * (p.log() - q.log())).sum() + (q * (q.log() - p.log())).sum()
    assert symmetric_kl(logits, target).item() == pytest.approx(expected.item(), rel=1e-6)
    # stable_kl: 2 * sum p * (logit(p) - logit(q)) with logit(x) = log(x / (1 - x)), the epsilon aside
    logit = lambda x: (x / (1 - x)).log()  # noqa: E731
    assert stable_kl(logits, target).item() == pytest.approx((2 * p * (logit(p) - logit(q))).sum().item(), rel=1e-4)


@pytest.mark.parametrize("settings, message", [
    ({"p_norm": "l3"}, "adv_p_norm must be one of inf, l2, l1, got 'l3'"),
    ({"k": 0}, "adv_k must be a positive integer, got 0"),
    ({"step_size": math.nan}, "adv_step_size must be a finite number >= 0, got nan"),
    ({"alpha": -1.0}, "adv_alpha must be a finite number >= 0, got -1.0"),
])
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        SmartSettings(**settings)


@pytest.mark.slow
def test_trainer_adds_and_logs_the_adversarial_term(fixture_model, tmp_path):
    """With `smart`, the step's loss is the task loss plus alpha times the adversarial loss, and `adv_loss` is
    logged beside the task's loss; SMART training still lowers the task loss."""
    from datasets import Dataset

    from hf_ext.models.mtdnn.training import train_mtdnn

    inputs = load_file(FIXTURE / "inputs.safetensors")
    rows = {name: tensor.tolist() * 4 for name, tensor in inputs.items()}
    rows["labels"] = [0, 1, 2, 1] * 4
    rows["task"] = [fixture_model.config.task_index("cls")] * 16
    model = MTDNNModel.from_pretrained(FIXTURE / "model")
    batch = {**inputs, "labels": torch.tensor([0, 1, 2, 1])}
    with torch.no_grad():
        before = model.eval()(**batch, task="cls").loss.item()
    trainer = train_mtdnn(model.train(), {"cls": Dataset.from_dict(rows)}, output_dir=tmp_path, max_steps=12,
                          per_device_train_batch_size=4, learning_rate=1e-3, warmup_steps=0, seed=0,
                          logging_steps=4, disable_tqdm=True, smart=SmartSettings(alpha=2.0, step_size=1e-3))
    logged = [entry for entry in trainer.state.log_history if "adv_loss" in entry]
    assert len(logged) == 3 and all(entry["adv_loss"] > 0 for entry in logged)
    assert all(entry["loss"] > entry["loss_cls"] for entry in logged)  # the step's loss holds the adversarial term
    with torch.no_grad():
        after = model.eval()(**batch, task="cls").loss.item()
    assert after < before, (before, after)
