"""MT-DNN on any encoder (issue 26 items 1 and 3): every task type (classification with linear and SAN heads,
regression, ranking, sequence labeling, span classification with and without unanswerable questions) on BERT,
RoBERTa, XLM-RoBERTa, DeBERTa, DeBERTa-v2 (v3's settings), ELECTRA, ALBERT and ModernBERT, each a tiny random config
built here (nothing downloaded): forward and loss of every task, save and reload, a pretrained encoder under new
heads, refusals of non-encoders, and (slow) Trainer steps that lower the loss, LoRA on each encoder's attention, and
remote-code loading without hf-ext."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers
from test_mtdnn_model import SAN, TASK_DEF_YAML, pair_batch
from test_mtdnn_token_tasks import TOKEN_TASK_DEF_YAML
from transformers import AutoModel, AutoModelForMaskedLM

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext.models.mtdnn import MTDNNConfig, MTDNNModel
from hf_ext.models.mtdnn.task_defs import config_from_task_def_yaml

SIZES = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 24, "max_position_embeddings": 40}
# per encoder type: its config class and what a tiny config of it needs beyond SIZES (ids inside the vocabulary;
# one segment as the released RoBERTa checkpoints have; the relative-position settings of the released DeBERTa and
# DeBERTa-v3 checkpoints; ELECTRA's and ALBERT's smaller embeddings)
ENCODERS = {
    "bert": ("BertConfig", {}),
    "roberta": ("RobertaConfig", {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "type_vocab_size": 1}),
    "xlm-roberta": ("XLMRobertaConfig", {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
                                         "type_vocab_size": 1}),
    "deberta": ("DebertaConfig", {"relative_attention": True, "pos_att_type": ["c2p", "p2c"],
                                  "max_relative_positions": -1, "position_biased_input": False}),
    "deberta-v2": ("DebertaV2Config", {"relative_attention": True, "pos_att_type": ["p2c", "c2p"],
                                       "position_buckets": 8, "norm_rel_ebd": "layer_norm", "share_att_key": True,
                                       "max_relative_positions": -1, "position_biased_input": False}),
    "electra": ("ElectraConfig", {"embedding_size": 8}),
    "albert": ("AlbertConfig", {"embedding_size": 8}),
    "modernbert": ("ModernBertConfig", {"pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3, "cls_token_id": 2,
                                        "sep_token_id": 3, "global_attn_every_n_layers": 2, "local_attention": 8}),
}
# encoders with segment embeddings get the token type ids; the others (one segment or none) must not
READS_SEGMENTS = {"bert", "electra", "albert"}
BATCH = pair_batch([(4, 3), (2, 5), (6, 1), (3, 3), (1, 2), (5, 4)])  # at most 14 tokens: RoBERTa's offset fits


def encoder_config(model_type):
    class_name, extra = ENCODERS[model_type]
    return getattr(transformers, class_name)(**SIZES, **extra)


def mtdnn_model(model_type, seed=0):
    config = config_from_task_def_yaml(TASK_DEF_YAML + TOKEN_TASK_DEF_YAML,
                                       encoder_config(model_type), san=SAN, group_sizes={"rank": 3})
    torch.manual_seed(seed)
    return MTDNNModel(config).eval()


def task_inputs(task):
    """The batch for a task: single sentences for sst (segment 0 only), pairs otherwise; labels of its type."""
    batch = dict(BATCH)
    if task == "sst":
        batch["token_type_ids"] = torch.zeros_like(batch["token_type_ids"])
    labels = {"sst": torch.tensor([0, 1, 1, 0, 1, 0]), "nli": torch.tensor([0, 1, 2, 2, 1, 0]),
              "sts": torch.linspace(0, 5, 6), "rank": torch.tensor([2, 2, 2, 0, 0, 0]),
              # a tag per token (none on padding), the answer's first and last token (the first token: no answer)
              "ner": torch.randint(0, 8, batch["input_ids"].shape, generator=torch.Generator().manual_seed(0))
              .masked_fill(batch["attention_mask"] == 0, -100),
              "squad": torch.tensor([[2, 3], [1, 1], [4, 6], [2, 2], [1, 2], [3, 5]]),
              "squad2": torch.tensor([[2, 3], [0, 0], [4, 6], [0, 0], [1, 2], [3, 5]])}
    return {**batch, "labels": labels[task]}


# the fast tier keeps one encoder of each kind (segments, one segment, relative positions, no segments); importing
# each further family costs seconds
FAST_ENCODERS = ("bert", "roberta", "deberta-v2", "modernbert")


@pytest.mark.parametrize("model_type", [model_type if model_type in FAST_ENCODERS else
                                        pytest.param(model_type, marks=pytest.mark.slow) for model_type in ENCODERS])
def test_every_task_type_runs_trains_and_reloads_on_each_encoder(model_type, tmp_path):
    model = mtdnn_model(model_type)
    assert model.bert.config.model_type == model_type and type(model.bert).__name__.endswith("Model")
    assert getattr(model.bert, "pooler", None) is None  # no head reads an encoder pooler
    assert model.encoder_reads_segments == (model_type in READS_SEGMENTS)
    length = BATCH["input_ids"].shape[1]
    shapes = {"sst": (6, 2), "nli": (6, 3), "sts": (6, 1), "rank": (6, 1), "ner": (6, length, 8),
              "squad": (6, length, 2), "squad2": (6, length, 2)}
    outputs = {}
    for task, shape in shapes.items():
        model.zero_grad()
        output = model(**task_inputs(task), task=task)
        assert output.logits.shape == shape and torch.isfinite(output.loss), (task, output.loss)
        output.loss.backward()
        gradient = model.get_input_embeddings().weight.grad
        assert gradient is not None and gradient.abs().sum() > 0, task  # the loss reaches the encoder
        outputs[task] = output.logits.detach()
    assert outputs["nli"].exp().sum(-1).sub(1).abs().max() < 1e-5  # a SAN head's log-probabilities

    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["encoder"]["model_type"] == model_type
    reloaded = AutoModel.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, MTDNNModel) and type(reloaded.bert) is type(model.bert)
    with torch.no_grad():
        for task, logits in outputs.items():
            torch.testing.assert_close(reloaded(**task_inputs(task), task=task).logits, logits, rtol=0, atol=0)


@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "modernbert"])
def test_a_pretrained_encoder_starts_under_new_heads(model_type, tmp_path):
    """An encoder saved with its masked-LM head (keys under its own prefix, as the released checkpoints are) gives
    the new model's encoder every weight, whatever its type."""
    torch.manual_seed(1)
    masked_lm = AutoModelForMaskedLM.from_config(encoder_config(model_type))
    masked_lm.save_pretrained(tmp_path)
    config = config_from_task_def_yaml(TASK_DEF_YAML, encoder_config(model_type), san=SAN, group_sizes={"rank": 3})
    model = MTDNNModel.from_pretrained_encoder(str(tmp_path), config)
    expected = masked_lm.base_model.state_dict()
    assert set(model.bert.state_dict()) <= set(expected)
    for name, tensor in model.bert.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


@pytest.mark.parametrize("pretrained, message", [
    (encoder_config("electra"), "the pretrained encoder is of type electra, the config's encoder of type bert"),
    (transformers.BertConfig(**{**SIZES, "hidden_size": 32}),
     "the pretrained bert encoder does not fit the config's encoder: size mismatch for "),
    (transformers.BertConfig(**{**SIZES, "num_hidden_layers": 1}),
     "the pretrained bert encoder does not fit the config's encoder: missing ['encoder.layer.1."),
])
def test_a_pretrained_encoder_that_does_not_fit_is_refused(pretrained, message, tmp_path):
    AutoModel.from_config(pretrained).save_pretrained(tmp_path)
    config = config_from_task_def_yaml(TASK_DEF_YAML, encoder_config("bert"), san=SAN)
    with pytest.raises(ValueError) as error:
        MTDNNModel.from_pretrained_encoder(str(tmp_path), config)
    assert str(error.value).startswith(message) and "\n" not in str(error.value), error.value


def test_a_config_without_an_encoder_type_is_bert():
    """Folders written before other encoders were supported hold a BERT encoder dict; it loads as BERT."""
    encoder = {key: value for key, value in encoder_config("bert").to_dict().items() if key != "model_type"}
    config = MTDNNConfig(encoder=encoder, tasks=[{"name": "a", "type": "classification", "num_labels": 2}])
    assert type(config.encoder).__name__ == "BertConfig" and config.encoder.hidden_size == 16


@pytest.mark.parametrize("encoder, message", [
    (transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2),
     "the encoder must be a bidirectional encoder (BERT, RoBERTa, DeBERTa, ELECTRA, ModernBERT, ...), but 'gpt2' is "
     "not one (a causal language model?)"),
    (transformers.BertConfig(is_decoder=True), "but 'bert' is not one"),
    (transformers.BartConfig(d_model=16), "the encoder must be an encoder model, but 'bart' is an encoder-decoder"),
    (transformers.T5Config(d_model=16), "but 't5' is an encoder-decoder"),
    ({"model_type": "no-such-model"}, "encoder model_type 'no-such-model' is not a model type transformers knows"),
    (transformers.DebertaV2Config(hidden_size=15, num_attention_heads=2),
     "encoder hidden_size 15 is not divisible by num_attention_heads 2"),
])
def test_what_is_not_an_encoder_is_refused_in_one_line(encoder, message):
    with pytest.raises(ValueError) as error:
        MTDNNConfig(encoder=encoder, tasks=[{"name": "a", "type": "classification", "num_labels": 2}])
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ENCODERS)
def test_trainer_steps_lower_the_loss_on_a_separable_task(model_type, tmp_path):
    """Where token 7 is, in three tasks: whether a sentence holds it (classification), the tag of each token (sequence
    labeling: B-PER on it, O elsewhere) and its position (a span task: no answer without it). Trainer (through
    `train_mtdnn`, the run of `hf-ext mtdnn train`) lowers every task's loss on every encoder."""
    from datasets import Dataset

    from hf_ext.models.mtdnn.training import train_mtdnn

    generator = torch.Generator().manual_seed(0)
    inputs = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
    labels = {"sst": [], "tags": [], "squad2": []}
    for index in range(32):
        tokens = torch.randint(8, 50, (5,), generator=generator).tolist()
        if index % 2:
            tokens[index % 5] = 7
        inputs["input_ids"].append([2, *tokens, 3])
        inputs["token_type_ids"].append([0] * 7)
        inputs["attention_mask"].append([1] * 7)
        labels["sst"].append(index % 2)
        labels["tags"].append([-100, *[1 if token == 7 else 0 for token in tokens], -100])
        position = 1 + index % 5 if index % 2 else 0
        labels["squad2"].append([position, position])
    batch = {key: torch.tensor(values) for key, values in inputs.items()}
    # the sentence-level task alone, then the two token-level tasks together
    for tasks, steps in ((("sst",), 60), (("tags", "squad2"), 120)):
        model = mtdnn_model(model_type, seed=1)
        datasets = {task: Dataset.from_dict({**inputs, "labels": labels[task],
                                             "task": [model.config.task_index(task)] * 32}) for task in tasks}

        def losses(model=model, tasks=tasks):
            with torch.no_grad():
                return {task: model.eval()(**batch, labels=torch.tensor(labels[task]), task=task).loss.item()
                        for task in tasks}

        before = losses()
        train_mtdnn(model.train(), datasets, output_dir=tmp_path, max_steps=steps, per_device_train_batch_size=8,
                    learning_rate=3e-3, warmup_steps=0, seed=0, logging_steps=steps, disable_tqdm=True)
        after = losses()
        assert all(after[task] < 0.7 * before[task] for task in tasks), (before, after)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["deberta", "deberta-v2", "modernbert", "electra"])
def test_lora_adapts_each_encoders_attention(model_type):
    from hf_ext.lora import add_lora

    model = add_lora(mtdnn_model(model_type), r=2, lora_alpha=4)
    adapted = {name.split(".lora_A")[0].rsplit(".", 1)[-1] for name, _ in model.named_parameters()
               if ".lora_A" in name}
    expected = {"deberta": {"in_proj"}, "deberta-v2": {"query_proj", "key_proj", "value_proj"},
                "modernbert": {"Wqkv"}, "electra": {"query", "key", "value"}}[model_type]
    assert adapted == expected
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable and all(".lora_" in name or ".heads." in name for name in trainable)


@pytest.mark.slow
def test_folders_of_every_encoder_load_as_remote_code_without_hf_ext(tmp_path):
    from hf_ext.export import write_model_folder
    from hf_ext.models.mtdnn import ENTRY

    expected = {}
    for model_type in ENCODERS:
        model = mtdnn_model(model_type, seed=2)
        (tmp_path / model_type).mkdir()
        write_model_folder(tmp_path / model_type, MTDNNModel, model.config, model.state_dict(), ENTRY.auto_map)
        with torch.no_grad():
            expected[model_type] = torch.cat([model(**BATCH, task=task).logits.flatten()
                                              for task in ("nli", "ner", "squad2")])
    torch.save(BATCH, tmp_path / "batch.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        sys.modules["hf_ext"] = None  # hf_ext must not be needed
        from transformers import AutoModel
        batch = torch.load({str(tmp_path / 'batch.pt')!r})
        logits = {{}}
        for model_type in {list(ENCODERS)!r}:
            model = AutoModel.from_pretrained({str(tmp_path)!r} + "/" + model_type, trust_remote_code=True).eval()
            with torch.no_grad():
                logits[model_type] = torch.cat([model(**batch, task=task).logits.flatten()
                                                for task in ("nli", "ner", "squad2")])
        torch.save(logits, {str(tmp_path / 'logits.pt')!r})
        """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, env={"HF_HUB_OFFLINE": "1",
                   "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    logits = torch.load(tmp_path / "logits.pt")
    for model_type, values in expected.items():
        torch.testing.assert_close(logits[model_type], values, msg=model_type)


@pytest.mark.parametrize("model_type", [model_type if model_type in FAST_ENCODERS else
                                        pytest.param(model_type, marks=pytest.mark.slow) for model_type in ENCODERS])
def test_a_row_as_long_as_the_positions_hold_runs(model_type):
    """`max_input_length` (the cap of `hf-ext mtdnn train --max-length` and the app's truncation) is every
    encoder's longest row: RoBERTa's family loses its position offset (padding id + 1), the others none."""
    from hf_ext.models.mtdnn.configuration_mtdnn import max_input_length

    model = mtdnn_model(model_type)
    longest = max_input_length(model.config.encoder)
    offset = 0 if model_type not in ("roberta", "xlm-roberta") else model.config.encoder.pad_token_id + 1
    assert longest == SIZES["max_position_embeddings"] - offset
    embeddings = getattr(model.bert.embeddings, "position_embeddings", None)
    assert getattr(embeddings, "padding_idx", None) == (model.config.encoder.pad_token_id if offset else None)
    input_ids = torch.randint(5, 50, (1, longest))
    with torch.no_grad():
        assert model(input_ids=input_ids, task="sst").logits.shape == (1, 2)
