"""Optimus training and evaluation: the original's beta schedules, the schedule callback (and resuming), the Trainer's
logged terms, LoRA, the paper's LM metrics, plots, the `hf-ext optimus train/evaluate` tools and a 2-process run.
Models here are tiny and sized unlike the fixture's on purpose."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import PROCESS_TIMEOUT, REPO_ROOT, cli_exit_code, run_torchrun, torchrun_cli
from fsdp2_training import fsdp2_and_ddp_command_runs, fsdp2_and_ddp_runs
from huggingface_hub import ModelCard
from interrupted_runs import StopAtStep
from safetensors.torch import load_file
from transformers import AutoModel, BertTokenizer, GPT2Tokenizer, TrainingArguments
from transformers.pytorch_utils import Conv1D

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext import OptimusLatentSpace, OptimusModel, OptimusProcessor
from hf_ext.cli import main
from hf_ext.errors import HfExtError
from hf_ext.lora import add_lora, load_lora
from hf_ext.metrics import load_metric
from hf_ext.models.optimus.metrics import evaluate_optimus_lm, optimus_lm_statistics
from hf_ext.models.optimus.plots import (
    plot_interpolation_table,
    plot_latent_space,
    plot_training_curves,
    project_to_plane,
)
from hf_ext.models.optimus.samples import random_model, tiny_config
from hf_ext.models.optimus.training import (
    BetaScheduleCallback,
    OptimusDataCollator,
    OptimusTrainer,
    frange_cycle_linear,
    frange_cycle_zero_linear,
    load_text_dataset,
)
from hf_ext.sample_text import train_bert_vocab, train_gpt2_bpe

pytestmark = pytest.mark.slow

FIXTURE = REPO_ROOT / "tests/fixtures/optimus/tiny"
SNLI = REPO_ROOT / "tests/data/snli_sentences"
MAX_LENGTH = 24




@pytest.fixture(scope="module")
def texts():
    return load_text_dataset(SNLI / "train.txt")


@pytest.fixture(scope="module")
def processor(texts, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizers")
    train_bert_vocab(texts["text"], folder / "enc", vocab_size=150)
    train_gpt2_bpe(texts["text"], folder / "dec", vocab_size=280)
    gpt2 = GPT2Tokenizer(vocab=str(folder / "dec" / "vocab.json"), merges=str(folder / "dec" / "merges.txt"))
    OptimusProcessor.add_decoder_special_tokens(gpt2)
    return OptimusProcessor(tokenizer=BertTokenizer(vocab=str(folder / "enc" / "vocab.txt")), decoder_tokenizer=gpt2)


def small_config(processor, **overrides):
    base_vocab = len(processor.decoder_tokenizer) - 3  # <PAD>, <BOS>, <EOS> come after the base vocabulary
    return tiny_config(len(processor.tokenizer), base_vocab, latent_size=6, hidden_size=24, num_layers=2,
                       num_heads=2, **overrides)


def make_model(processor, seed=0, **overrides):
    torch.manual_seed(seed)
    return OptimusModel(small_config(processor, **overrides))


def training_args(folder, max_steps, **kwargs):
    values = dict(output_dir=str(folder), max_steps=max_steps, per_device_train_batch_size=4,
                  per_device_eval_batch_size=20, learning_rate=2e-3, logging_steps=1, save_strategy="no", seed=0,
                  use_cpu=True, report_to=[], disable_tqdm=True)
    return TrainingArguments(**{**values, **kwargs})


def logged(log_history, key):
    return [entry[key] for entry in log_history if key in entry]


def window_means(schedule, logging_steps):
    return [float(np.mean(schedule[i:i + logging_steps])) for i in range(0, len(schedule), logging_steps)]


# ----- beta schedules -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, schedule", [
    ("beta_schedule_train", lambda: frange_cycle_zero_linear(100, start=0.0, stop=1.0, n_cycle=1, ratio_increase=0.25,
                                                             ratio_zero=0.5)),
    ("beta_schedule_example", lambda: frange_cycle_zero_linear(37, start=0.0, stop=1.0, n_cycle=2,
                                                               ratio_increase=0.3, ratio_zero=0.2)),
    ("beta_schedule_linear_example", lambda: frange_cycle_linear(37, start=0.0, stop=1.0, n_cycle=3, ratio=0.5)),
])
def test_beta_schedules_equal_the_original(name, schedule):
    calls = {t["name"]: t["original_call"] for t in json.loads((FIXTURE / "reference.json").read_text())["tensors"]}
    assert calls[name].startswith("frange_cycle")
    expected = load_file(str(FIXTURE / "reference.safetensors"))[name].numpy()
    assert np.array_equal(schedule(), expected)


def test_beta_schedule_by_hand():
    # period 10, zeros while i < 2, then 0, 0.1, ... by repeated addition until the value passes 0.5
    expected = [0, 0, 0, 0.1, 0.2, 0.1 + 0.1 + 0.1, 0.4, 0.5, 0.5, 0.5]
    assert frange_cycle_zero_linear(10, 0.0, 0.5, 1, ratio_increase=0.5, ratio_zero=0.2).tolist() == expected
    # two cycles of 3.5 steps: the second starts at int(3.5) = 3 and overwrites the first one's last value
    assert frange_cycle_linear(7, 0.0, 2.0, 2, ratio=1.0).tolist() == pytest.approx(
        [0, 2 / 3.5, 4 / 3.5, 0, 2 / 3.5, 4 / 3.5, 6 / 3.5])
    for bad in (dict(n_cycle=0), dict(ratio_increase=0.0), dict(ratio_zero=-0.1)):
        with pytest.raises(ValueError):
            frange_cycle_zero_linear(10, **bad)


# ----- Trainer, callback, collator ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(processor, texts, tmp_path_factory):
    """A tiny model trained 16 steps with two schedule cycles; evaluated before and after."""
    model = make_model(processor, beta=0.5, length_weighted_loss=True, fb_mode=0)
    trainer = OptimusTrainer(model=model, args=training_args(tmp_path_factory.mktemp("run"), 16, logging_steps=4),
                             train_dataset=texts, eval_dataset=texts.select(range(20)),
                             data_collator=OptimusDataCollator(processor, max_length=MAX_LENGTH),
                             callbacks=[BetaScheduleCallback(n_cycles=2, ratio_zero=0.25, ratio_increase=0.5)])
    before = trainer.evaluate()
    trainer.train()
    return trainer, before, trainer.evaluate()


def test_collator_builds_both_sides_from_the_text_column(processor, texts, trained):
    collator = OptimusDataCollator(processor, text_column="sentence", max_length=10)
    rows = [{"sentence": text, "other": 1} for text in texts["text"][:3]]
    batch = collator(rows)
    expected = processor(texts["text"][:3], max_length=10)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    for key in batch:
        assert torch.equal(batch[key], expected[key])
    # the Trainer keeps the text column for the collator although forward() has no such argument
    train_batch = next(iter(trained[0].get_train_dataloader()))
    assert train_batch["labels"][:, 0].eq(processor.decoder_tokenizer.bos_token_id).all()


def test_training_lowers_the_loss_and_logs_each_term(trained):
    trainer, before, after = trained
    assert after["eval_loss"] < before["eval_loss"] - 0.3
    assert after["eval_loss_rec"] < before["eval_loss_rec"]
    history = trainer.state.log_history
    # beta, logged as the mean over each window of 4 steps, follows the schedule: 2 cycles over 16 steps, stop 0.5
    schedule = frange_cycle_zero_linear(16, 0.0, 0.5, 2, ratio_increase=0.5, ratio_zero=0.25)
    assert logged(history, "beta") == pytest.approx(window_means(schedule, 4))
    losses, rec, kl = logged(history, "loss"), logged(history, "loss_rec"), logged(history, "loss_kl")
    assert len(losses) == len(rec) == len(kl) == 4 and all(k >= 0 for k in kl)
    assert rec[-1] < rec[0]
    # the plain KL is logged beside the loss's KL term; without free bits (fb_mode 0) they are the same number
    assert logged(history, "kl") == pytest.approx(kl, rel=1e-5)
    assert after["eval_kl"] == pytest.approx(after["eval_loss_kl"], rel=1e-5)
    # eval runs at the full beta again once training is over
    assert trainer.model.beta == 0.5


def test_free_bits_zero_the_kl_term_but_not_the_logged_kl(processor, texts, tmp_path):
    # every dimension under its 100-nat target: the loss's KL term is 0, the plain KL is still measured
    model = make_model(processor, beta=0.5, fb_mode=1, dim_target_kl=100.0)
    evaluation = texts.select(range(8))
    trainer = OptimusTrainer(model=model, args=training_args(tmp_path, 1), eval_dataset=evaluation,
                             data_collator=OptimusDataCollator(processor, max_length=MAX_LENGTH))
    metrics = trainer.evaluate()
    batch = processor(list(evaluation["text"]), max_length=MAX_LENGTH)
    with torch.no_grad():
        mean, logvar, _ = model.encode(batch["input_ids"], batch["attention_mask"])
    expected = (0.5 * (mean ** 2 + logvar.exp() - logvar - 1)).sum(-1).mean().item()
    assert metrics["eval_loss_kl"] == 0
    assert metrics["eval_kl"] == pytest.approx(expected, rel=1e-5) and expected > 0


def test_resume_continues_the_beta_schedule(processor, texts, tmp_path):
    def run(output_dir, resume=None):
        trainer = OptimusTrainer(model=make_model(processor, seed=1, beta=1.0),
                                 args=training_args(output_dir, 8, save_strategy="steps", save_steps=4),
                                 train_dataset=texts, data_collator=OptimusDataCollator(processor, max_length=12),
                                 callbacks=[BetaScheduleCallback(ratio_zero=0.25, ratio_increase=0.5)])
        trainer.train(resume_from_checkpoint=resume)
        return trainer.state.log_history

    uninterrupted = run(tmp_path / "a")
    resumed = run(tmp_path / "b", resume=str(tmp_path / "a" / "checkpoint-4"))
    after = [entry for entry in resumed if entry["step"] > 4 and "beta" in entry]
    assert [entry["step"] for entry in after] == [5, 6, 7, 8]
    assert logged(uninterrupted, "beta") == [0, 0, 0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert logged(after, "beta") == logged(uninterrupted, "beta")[4:]
    # weights, optimizer, data order and RNG come back too
    assert logged(after, "loss") == pytest.approx(logged(uninterrupted, "loss")[4:], rel=1e-4)


def test_callback_validates_its_settings():
    for bad in (dict(n_cycles=0), dict(ratio_increase=0.0), dict(ratio_zero=1.0), dict(beta=-1.0)):
        with pytest.raises(ValueError):
            BetaScheduleCallback(**bad)


# ----- LoRA -----------------------------------------------------------------------------------------------------------

def test_lora_on_both_halves_trains_saves_and_reloads(processor, texts, tmp_path):
    from peft.tuners.lora import LoraLayer

    # a base with large random weights stands in for a pre-trained one (with the usual small init and frozen
    # embeddings, the logits stay near uniform whatever the adapters do)
    model = random_model(small_config(processor, beta=0.2), seed=2)
    frozen_before = model.encoder.encoder.layer[0].attention.self.query.weight.detach().clone()
    peft_model = add_lora(model, r=4, lora_alpha=8)
    lora_layers = {name: layer for name, layer in peft_model.named_modules() if isinstance(layer, LoraLayer)}
    conv1d = {name for name, layer in lora_layers.items() if isinstance(layer.get_base_layer(), Conv1D)}
    assert len(conv1d) == 6 and len(lora_layers) == 12  # c_attn, attn.c_proj, mlp.c_proj | query, key, value; x2
    for name, layer in lora_layers.items():  # GPT-2's Conv1D stores [in, out] weights
        assert layer.fan_in_fan_out == (name in conv1d), name
    trainable = [name for name, p in peft_model.named_parameters() if p.requires_grad]
    assert all("lora_" in name or "modules_to_save" in name for name in trainable)
    assert {"to_latent", "latent_to_memory", "latent_to_embedding"} <= {
        name.split(".modules_to_save")[0].split(".")[-1] for name in trainable if "modules_to_save" in name}

    trainer = OptimusTrainer(model=peft_model, args=training_args(tmp_path / "run", 12, learning_rate=3e-2,
                                                                  logging_steps=3),
                             train_dataset=texts, eval_dataset=texts.select(range(20)),
                             data_collator=OptimusDataCollator(processor, max_length=MAX_LENGTH),
                             callbacks=[BetaScheduleCallback(ratio_zero=0.0, ratio_increase=0.5)])
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    assert trainer.evaluate()["eval_loss"] < before - 3.0
    # the schedule reached the wrapped model's beta
    assert logged(trainer.state.log_history, "beta") == pytest.approx(
        window_means(frange_cycle_zero_linear(12, 0.0, 0.2, 1, 0.5, 0.0), 3))
    assert torch.equal(model.encoder.encoder.layer[0].attention.self.query.weight, frozen_before)

    peft_model.save_pretrained(tmp_path / "adapter")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (tmp_path / "adapter").iterdir()}
    reloaded = load_lora(random_model(small_config(processor, beta=0.2), seed=2), tmp_path / "adapter")
    batch = processor(texts["text"][:5], max_length=MAX_LENGTH)
    with torch.no_grad():
        expected, actual = peft_model.eval()(**batch), reloaded(**batch)
    for key in ("logits", "mean", "logvar", "loss"):
        assert torch.equal(actual[key], expected[key]), key


# ----- LM metrics -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def optimus_lm():
    return load_metric("optimus_lm")


def metric_inputs(mean, logvar, sample, log_likelihood=None, num_words=None):
    count = len(mean)
    return dict(log_likelihood=log_likelihood if log_likelihood is not None else [-1.0] * count,
                reconstruction_nll=[1.0] * count, kl=[0.0] * count,
                num_words=num_words if num_words is not None else [1] * count,
                posterior_mean=np.asarray(mean).tolist(), posterior_logvar=np.asarray(logvar).tolist(),
                latent_sample=np.asarray(sample).tolist())


def test_metric_perplexity_elbo_and_kl(optimus_lm):
    zeros = np.zeros((3, 2))
    result = optimus_lm.compute(**{**metric_inputs(np.eye(3, 2), zeros, zeros, [-12.0, -7.5, -3.0], [5, 4, 2]),
                                   "reconstruction_nll": [10.0, 6.0, 2.5], "kl": [1.5, 1.0, 0.25]})
    assert result["perplexity"] == pytest.approx(math.exp(22.5 / 11))
    assert result["nll"] == pytest.approx(7.5)
    assert result["neg_elbo"] == pytest.approx((11.5 + 7.0 + 2.75) / 3)
    assert result["reconstruction_nll"] == pytest.approx(18.5 / 3)
    assert result["kl"] == pytest.approx(2.75 / 3)


def test_metric_active_units_on_hand_built_means(optimus_lm):
    # column c is a_c * (1, -1, 1, -1): unbiased variance 4 a_c^2 / 3 = 0, 0.0033, 0.0133, 1.33
    pattern = np.array([1.0, -1.0, 1.0, -1.0])[:, None]
    mean = pattern * np.array([0.0, 0.05, 0.1, 1.0]) + np.array([3.0, -2.0, 0.5, 0.0])
    inputs = metric_inputs(mean, np.zeros_like(mean), mean)
    assert optimus_lm.compute(**inputs)["active_units"] == 2
    assert optimus_lm.compute(**inputs, au_threshold=0.02)["active_units"] == 1
    assert optimus_lm.compute(**inputs, au_threshold=0.0)["active_units"] == 4


def test_metric_mutual_information(optimus_lm):
    from scipy.special import logsumexp
    from scipy.stats import norm

    # far-apart, unit-variance posteriors with z at each mean: q(z_i) = q(z_i | x_i) / N, so MI = log N - d / 2
    count, dim = 12, 3
    mean = np.arange(count)[:, None] * np.full(dim, 1000.0)
    result = optimus_lm.compute(**metric_inputs(mean, np.zeros((count, dim)), mean))
    assert result["mi"] == pytest.approx(math.log(count) - dim / 2, abs=1e-9)

    # overlapping posteriors, checked against scipy's densities
    rng = np.random.default_rng(0)
    mean, logvar = rng.normal(size=(300, 2)), rng.normal(scale=0.5, size=(300, 2))
    sample = mean + rng.normal(size=mean.shape) * np.exp(0.5 * logvar)
    std = np.exp(0.5 * logvar)
    densities = norm.logpdf(sample[:, None], loc=mean[None], scale=std[None]).sum(-1)  # [z_i, x_j]
    entropy = norm.entropy(scale=std).sum(-1).mean()
    expected = -entropy - np.mean(logsumexp(densities, axis=1) - math.log(len(mean)))
    assert optimus_lm.compute(**metric_inputs(mean, logvar, sample))["mi"] == pytest.approx(expected, rel=1e-9)


def test_lm_statistics_with_the_model(processor, texts):
    model = make_model(processor, seed=3)
    sentences = texts["text"][:6]
    stats = optimus_lm_statistics(model, processor, sentences, batch_size=4, num_samples=4, samples_per_pass=2,
                                  max_length=MAX_LENGTH, generator=torch.Generator().manual_seed(7))
    assert model.training  # the mode is restored

    # the same estimate, written out independently with the same noise draws
    generator = torch.Generator().manual_seed(7)
    model.eval()
    expected = {"log_likelihood": [], "reconstruction_nll": [], "kl": [], "latent_sample": []}
    for start in (0, 4):
        batch = processor(sentences[start:start + 4], max_length=MAX_LENGTH)
        mean, logvar, _ = model.encode(batch["input_ids"], batch["attention_mask"])
        std = torch.exp(0.5 * logvar)
        z = torch.cat([mean[:, None] + torch.randn(len(mean), 2, 6, generator=generator) * std[:, None]
                       for _ in range(2)], 1)
        log_px_z = torch.stack([-model(labels=batch["labels"], latent_z=z[:, k]).loss_rec for k in range(4)], 1)
        prior = torch.distributions.Normal(0.0, 1.0).log_prob(z).sum(-1)
        posterior = torch.distributions.Normal(mean[:, None], std[:, None]).log_prob(z).sum(-1)
        expected["log_likelihood"] += (torch.logsumexp(log_px_z + prior - posterior, 1) - math.log(4)).tolist()
        expected["reconstruction_nll"] += (-log_px_z.mean(1)).tolist()
        expected["kl"] += (0.5 * (mean ** 2 + logvar.exp() - logvar - 1).sum(-1)).tolist()
        expected["latent_sample"] += (mean + torch.randn(len(mean), 6, generator=generator) * std).tolist()
    for key, values in expected.items():
        np.testing.assert_allclose(stats[key], values, rtol=1e-4, atol=1e-4, err_msg=key)
    labels = processor(sentences, max_length=MAX_LENGTH)["labels"]
    assert stats["num_words"] == (labels != processor.decoder_tokenizer.pad_token_id).sum(-1).tolist()

    result = evaluate_optimus_lm(model, processor, sentences, batch_size=4, num_samples=4, samples_per_pass=2,
                                 max_length=MAX_LENGTH, generator=torch.Generator().manual_seed(7))
    assert result["perplexity"] == pytest.approx(math.exp(-sum(stats["log_likelihood"]) / sum(stats["num_words"])))
    assert result["neg_elbo"] == pytest.approx(np.mean(np.add(stats["reconstruction_nll"], stats["kl"])))
    with pytest.raises(ValueError, match="multiple"):
        optimus_lm_statistics(model, processor, sentences, num_samples=5, samples_per_pass=2)


# ----- plots ----------------------------------------------------------------------------------------------------------

def assert_png(path, width):
    from matplotlib.image import imread

    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(path).shape[1] == width


def test_plots(trained, processor, tmp_path):
    trainer = trained[0]
    assert_png(plot_training_curves(trainer.state.log_history, tmp_path / "curves.png"), 1200)
    with pytest.raises(HfExtError, match="nothing|no loss_rec"):
        plot_training_curves([{"loss": 1.0, "step": 1}], tmp_path / "empty.png")
    space = OptimusLatentSpace(trainer.model, processor, max_new_tokens=6)
    rows = space.interpolate("a man is sleeping .", "two dogs run on the beach .", num_steps=4)
    assert [t for t, _ in rows] == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert_png(plot_interpolation_table(rows, tmp_path / "table.png"), 900)
    sentences = texts_of(6)
    means, _ = space.encode(sentences)
    path = trainer.model.interpolate(means[0], means[1], 4)
    steps = list(zip([0, 1 / 3, 2 / 3, 1], space.decode(path), strict=True))
    assert_png(plot_latent_space(means.numpy(), sentences, tmp_path / "map.png", interpolation=(path.numpy(), steps),
                                 labelled=[0, 1], log_history=trainer.state.log_history), 1600)
    assert_png(plot_latent_space(means.numpy(), sentences, tmp_path / "bare.png"), 1100)
    with pytest.raises(HfExtError, match="at least 2 sentences"):
        plot_latent_space(means[:1].numpy(), sentences[:1], tmp_path / "one.png")


def texts_of(count):
    return list(load_text_dataset(SNLI / "train.txt")["text"][:count])


def test_projection_on_the_principal_axes_matches_pca():
    from sklearn.decomposition import PCA

    points = np.random.default_rng(0).normal(size=(30, 5)) * [5, 3, 1, 0.5, 0.1]
    others = np.random.default_rng(1).normal(size=(4, 5))
    (projected, projected_others), explained = project_to_plane(points, others)
    pca = PCA(n_components=2).fit(points)
    signs = np.sign((projected * pca.transform(points)).sum(0))  # each axis is defined up to its sign
    np.testing.assert_allclose(projected * signs, pca.transform(points), atol=1e-9)
    np.testing.assert_allclose(projected_others * signs, pca.transform(others), atol=1e-9)
    np.testing.assert_allclose(explained, pca.explained_variance_ratio_)
    # along a given direction: that direction first, then the principal axis of what is left orthogonal to it
    direction = np.array([0.0, 1.0, 0.0, 0.0, 0.0])
    (along, _), shares = project_to_plane(points, others, first_axis=3 * direction)
    centred = points - points.mean(0)
    np.testing.assert_allclose(along[:, 0], centred[:, 1], atol=1e-9)
    rest = PCA(n_components=1).fit(np.delete(centred, 1, axis=1))
    np.testing.assert_allclose(np.abs(along[:, 1]), np.abs(rest.transform(np.delete(centred, 1, axis=1))[:, 0]),
                               atol=1e-9)
    assert shares == pytest.approx([centred[:, 1].var() / centred.var(0).sum(), rest.explained_variance_[0]
                                    * (len(points) - 1) / len(points) / centred.var(0).sum()])


# ----- CLI ------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir(processor, tmp_path_factory):
    folder = tmp_path_factory.mktemp("model") / "optimus-tiny"
    make_model(processor, seed=4, beta=1.0).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def test_cli_train_saves_a_trained_model(model_dir, tmp_path, capsys):
    out = tmp_path / "trained"
    code = main(["optimus", "train", str(model_dir), "--train-file", str(SNLI / "train.txt"), "--output-dir",
                 str(out), "--max-steps", "4", "--batch-size", "4", "--logging-steps", "2", "--beta", "0.5",
                 "--fb-mode", "0", "--length-weighted-loss", "--max-length", str(MAX_LENGTH), "--learning-rate",
                 "1e-3", "--plot", "--eval-file", str(SNLI / "test.txt"), "--num-samples", "4",
                 "--samples-per-pass", "2"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 4
    # the evaluation of the saved model is `evaluate`'s, and its card records it
    assert main(["optimus", "evaluate", str(out), "--eval-file", str(SNLI / "test.txt"), "--num-samples", "4",
                 "--samples-per-pass", "2", "--max-length", str(MAX_LENGTH), "--batch-size", "4"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert summary["eval"] == pytest.approx(evaluated, rel=1e-5) and set(evaluated) >= {"perplexity", "kl", "mi"}
    recorded = {r.metric_type: r.metric_value for r in ModelCard.load(out / "README.md").data.eval_results}
    assert recorded == pytest.approx(evaluated, rel=1e-5)
    assert {"config.json", "model.safetensors", "modeling_optimus.py", "tokenizer_config.json", "decoder_tokenizer",
            "log_history.json", "training_curves.png", "README.md"} <= {p.name for p in out.iterdir()}
    card = (out / "README.md").read_text()
    assert "`hf-ext optimus train`, with these settings:" in card and "| `beta` | `0.5` |" in card
    assert "4 optimizer steps" in card and str(tmp_path) not in card
    trained, initial = AutoModel.from_pretrained(out, trust_remote_code=True), AutoModel.from_pretrained(model_dir)
    assert (trained.config.beta, trained.config.fb_mode, trained.config.length_weighted_loss) == (0.5, 0, True)
    assert not torch.equal(trained.to_latent.weight, initial.to_latent.weight)
    history = json.loads((out / "log_history.json").read_text())
    # 4 steps, one cycle to 0.5: zero for the first step, then 0, 0.5 (the next value, 1.0, passes the stop)
    assert logged(history, "beta") == pytest.approx(window_means([0, 0, 0.5, 0.5], 2))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_cli_train_resumes_after_ctrl_c_during_a_checkpoint_save(model_dir, tmp_path, capsys, monkeypatch):
    from transformers import TrainerState

    def argv(out):
        return ["optimus", "train", str(model_dir), "--train-file", str(SNLI / "train.txt"), "--output-dir", str(out),
                "--max-steps", "6", "--batch-size", "4", "--logging-steps", "2", "--save-steps", "2",
                "--max-length", str(MAX_LENGTH), "--learning-rate", "1e-3"]

    assert main(argv(tmp_path / "straight")) == 0, capsys.readouterr().err
    expected = json.loads(capsys.readouterr().out)
    save_state = TrainerState.save_to_json

    def interrupted(state, path):  # Ctrl-C after checkpoint-4's weights, before its trainer_state.json
        if "checkpoint-4" in str(path):
            raise KeyboardInterrupt
        save_state(state, path)

    monkeypatch.setattr(TrainerState, "save_to_json", interrupted)
    out, checkpoints = tmp_path / "resumed", tmp_path / "resumed-checkpoints"
    assert main(argv(out)) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "hf-ext: error: interrupted"
    assert not out.exists() and sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    assert not (checkpoints / "checkpoint-4" / "trainer_state.json").exists()
    monkeypatch.setattr(TrainerState, "save_to_json", save_state)
    assert main(argv(out)) == 0, capsys.readouterr().err
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["steps"] == 6 and not checkpoints.exists()
    # the same weights as the uninterrupted run, and a train_loss over the whole run, not only the resumed steps
    assert load_file(out / "model.safetensors").keys() == load_file(tmp_path / "straight" / "model.safetensors").keys()
    assert all(torch.equal(t, load_file(tmp_path / "straight" / "model.safetensors")[k])
               for k, t in load_file(out / "model.safetensors").items())
    assert resumed["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-4)


@pytest.mark.parametrize("extra, message", [
    (["--max-steps", "0"], "argument --max-steps: must be at least 1"),
    (["--ratio-increase", "0"], "argument --ratio-increase: must be in (0, 1]"),
    (["--fb-mode", "3"], "argument --fb-mode: invalid choice: 3"),
    (["--max-length", "500"], "--max-length 500 exceeds"),
    (["--train-file", "missing.txt"], "text file missing.txt does not exist"),
])
def test_cli_train_refuses_bad_arguments(model_dir, tmp_path, capsys, extra, message):
    out = tmp_path / "never"
    code = cli_exit_code(["optimus", "train", str(model_dir), "--train-file", str(SNLI / "train.txt"),
                          "--output-dir", str(out), *extra])
    err = capsys.readouterr().err.strip()
    assert code != 0 and err.startswith("hf-ext: error:") and message in err and "\n" not in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_cli_evaluate_matches_the_api(model_dir, processor, tmp_path, capsys):
    sentences = load_text_dataset(SNLI / "valid.txt")["text"][:10]
    eval_file = tmp_path / "eval.txt"
    eval_file.write_text("\n\n".join(sentences))  # blank lines are skipped
    args = ["--num-samples", "4", "--samples-per-pass", "2", "--max-length", str(MAX_LENGTH), "--seed", "3"]
    assert main(["optimus", "evaluate", str(model_dir), "--eval-file", str(eval_file), *args]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = evaluate_optimus_lm(AutoModel.from_pretrained(model_dir), processor, sentences, batch_size=8,
                                   num_samples=4, samples_per_pass=2, max_length=MAX_LENGTH,
                                   generator=torch.Generator().manual_seed(3))
    assert printed == pytest.approx(expected)
    assert printed["perplexity"] > 1 and 0 <= printed["active_units"] <= 6
    assert main(["optimus", "evaluate", str(model_dir), "--eval-file", str(eval_file), "--num-samples", "5",
                 "--samples-per-pass", "2"]) == 1
    assert "multiple of --samples-per-pass" in capsys.readouterr().err


# ----- distributed ----------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_two_process_cpu_training_with_torchrun(model_dir, tmp_path):
    ranks, run = run_torchrun("optimus/optimus_ddp_train.py", model_dir, SNLI / "train.txt", tmp_path)
    for result in ranks:
        assert (result["world_size"], result["global_step"], result["backend"]) == (2, 6, "gloo")
        assert math.isfinite(result["train_loss"])
        assert len(logged(result["log_history"], "loss_rec")) == len(logged(result["log_history"], "loss_kl")) == 3
        # 2 cycles of 3 steps ramping 0 -> 2/3 -> (4/3 passes the stop) 1, averaged over windows of 2 steps
        assert logged(result["log_history"], "beta") == pytest.approx([1 / 3, 0.5, 5 / 6])
    assert ranks[0]["weights_checksum"] == ranks[1]["weights_checksum"]
    assert ranks[0]["log_history"][:-1] == ranks[1]["log_history"][:-1]  # the final entry holds each rank's timing


@pytest.mark.slow
def test_fsdp2_training_through_accelerate_matches_ddp(model_dir, tmp_path):
    """`finetune_optimus` (the run of `hf-ext optimus train`) under 2 processes over gloo, sharded by accelerate's
    FSDP2 plan with the settings of docs/launch/accelerate_fsdp2_gpu.yaml: a unit per encoder and decoder layer, the
    encoder's embedding module, the decoder's word embeddings with the tied softmax; every parameter sharded, the tie
    kept, the KL weight ramped as scheduled; the run trains exactly as DDP does on the same batches (losses, with
    dropout and the sampled latent, and weights within float rounding)."""
    runs, weights = fsdp2_and_ddp_runs("optimus/optimus_fsdp2_train.py", model_dir, SNLI / "train.txt", out=tmp_path)
    fsdp2 = runs["fsdp2"]
    assert fsdp2["units"] == ["", "decoder.h.0", "decoder.h.1", "decoder.wte", "encoder.embeddings",
                              "encoder.encoder.layer.0", "encoder.encoder.layer.1", "lm_head"]
    assert fsdp2["tied"] and runs["ddp"]["tied"]
    # one cycle over the 6 steps: half of it ramping from 0 to 1, then 1
    assert fsdp2["beta"] == pytest.approx([0, 1 / 3, 2 / 3, 1, 1, 1]) and len(fsdp2["losses"]) == 6
    start = load_file(model_dir / "model.safetensors")
    assert all(not torch.equal(weights["fsdp2"][name], start[name]) for name in ("decoder.h.0.mlp.c_fc.weight",
                                                                               "encoder.encoder.layer.1.output.dense.weight"))


def test_streamed_text_shards_train_and_resume_mid_stream_as_an_uninterrupted_run(processor, tmp_path,
                                                                                  monkeypatch):
    from hf_ext.models.optimus.training import finetune_optimus, read_text_lines

    lines = [line for line in (SNLI / "train.txt").read_text().splitlines() if line.strip()]
    shards = tmp_path / "shards"
    shards.mkdir()
    for shard in range(4):
        (shards / f"part-{shard}.txt").write_text("\n".join(lines[shard::4]) + "\n")
    seen = []
    collate = OptimusDataCollator.__call__
    monkeypatch.setattr(OptimusDataCollator, "__call__",
                        lambda self, features: seen.append([f["text"] for f in features]) or collate(self, features))

    def run(out, callbacks=()):
        seen.clear()
        model = make_model(processor, seed=4)
        try:
            finetune_optimus(model, processor, read_text_lines(shards, streaming=True), out, max_steps=6,
                             batch_size=4, save_steps=2, max_length=MAX_LENGTH, callbacks=callbacks,
                             print_logs=False, use_cpu=True, disable_tqdm=True)
        except KeyboardInterrupt:
            return None, list(seen)
        return model, list(seen)

    expected, expected_seen = run(tmp_path / "whole")
    assert [text for batch in expected_seen[:2] for text in batch] == lines[0::4][:8]  # shard order, in order
    run(tmp_path / "resumed", [StopAtStep(3)])
    assert (tmp_path / "resumed" / "checkpoint-2" / "stream_state-rank0.json").is_file()
    resumed, resumed_seen = run(tmp_path / "resumed")
    assert resumed_seen == expected_seen[2:][:len(resumed_seen)] and len(resumed_seen) >= 4
    state = resumed.state_dict()
    assert all(torch.equal(tensor, state[name]) for name, tensor in expected.state_dict().items())


@pytest.mark.slow
def test_cli_train_under_fsdp2_saves_the_whole_trained_model_as_ddp_does(model_dir, tmp_path):
    """`hf-ext optimus train` (all weights, no LoRA) under 2 processes over gloo, sharded by accelerate's FSDP2 plan
    (tests/fsdp2_command.py): both processes exit 0, the main one writes the folder once, its weights whole (gathered
    from the shards by every process; the softmax saved tied to the decoder's embeddings) and equal to the same
    command's under DDP."""
    runs = fsdp2_and_ddp_command_runs(["optimus", "train", model_dir, "--train-file", SNLI / "train.txt",
                                       "--max-steps", "3", "--batch-size", "4", "--max-length", MAX_LENGTH,
                                       "--learning-rate", "3e-3", "--device", "cpu"], out=tmp_path)
    fsdp2, ddp = runs["fsdp2"], runs["ddp"]
    assert fsdp2["steps"] == ddp["steps"] == 3
    start = load_file(model_dir / "model.safetensors")
    assert fsdp2["weights"].keys() == start.keys()
    assert not torch.equal(fsdp2["weights"]["to_latent.weight"], start["to_latent.weight"])
    trained = AutoModel.from_pretrained(tmp_path / "fsdp2" / "model")
    assert trained.get_output_embeddings().weight is trained.get_input_embeddings().weight


@pytest.mark.slow
def test_cli_train_under_torchrun_writes_its_output_once_from_the_main_process(model_dir, tmp_path, capsys):
    """`hf-ext optimus train` with LoRA under `torchrun --nproc-per-node 2`: both processes end with exit code 0, both
    evaluate the merged model alike, and only the main process writes the output folder, once, with one summary
    line; the saved model is the one evaluated (`evaluate` on it gives the recorded metrics)."""
    out = tmp_path / "trained"
    evaluation = ["--eval-file", SNLI / "test.txt", "--num-samples", "4", "--samples-per-pass", "2",
                  "--max-length", MAX_LENGTH, "--batch-size", "4"]
    code, stdout, err = torchrun_cli(["optimus", "train", model_dir, "--train-file", SNLI / "train.txt",
                                      "--output-dir", out, "--max-steps", "3", "--learning-rate", "1e-2",
                                      "--lora-r", "2", "--device", "cpu", *evaluation], timeout=PROCESS_TIMEOUT)
    assert code == 0, err[-3000:]
    [summary] = [json.loads(line) for line in stdout.splitlines()]
    assert summary["steps"] == 3 and summary["output_dir"] == str(out)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["trained"]  # no staging folder, no checkpoints
    assert main(["optimus", "evaluate", str(out), *map(str, evaluation)]) == 0
    assert summary["eval"] == pytest.approx(json.loads(capsys.readouterr().out), rel=1e-5)
    trained, initial = AutoModel.from_pretrained(out, trust_remote_code=True), AutoModel.from_pretrained(model_dir)
    assert not torch.equal(trained.to_latent.weight, initial.to_latent.weight)
