"""`hf-ext optimus init` (an Optimus built from a pretrained encoder and a pretrained causal language model) and
training what it builds with frozen or LoRA backbones (`hf-ext optimus train --freeze-encoder/--freeze-decoder/
--lora-r/--lora-on`), on tiny random backbones saved as a Hub download leaves them
(`hf_ext.models.optimus.tiny_backbones`)."""

import argparse
import json
import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoProcessor,
    AutoTokenizer,
    PreTrainedTokenizerFast,
)

from hf_ext.cli import build_parser, main
from hf_ext.cli_utils import needs_the_hub
from hf_ext.models.optimus import OptimusModel, OptimusProcessor
from hf_ext.models.optimus.backbones import decoder_tokens_to_add, sentence_transformers_pooling
from hf_ext.models.optimus.tiny_backbones import write_decoder, write_encoder, write_sentence_transformers_pooling

SNLI_TRAIN = "tests/data/snli_sentences/train.txt"
ENCODERS = ("bert", "modernbert", "deberta-v2")
DECODERS = {"gpt2": {}, "llama": {}, "qwen2": {}, "mistral": {"sliding_window": 4}}
PAIRS = [("bert", "gpt2"), ("bert", "llama"), ("modernbert", "qwen2"), ("deberta-v2", "mistral")]
# pad, BOS, EOS after init: the tokenizer's own where they are three different tokens, the original's otherwise
# (tiny_backbones.SPECIAL_TOKENS: GPT-2 has one <|endoftext|> for BOS and EOS and no pad; Llama's and Mistral's pad
# is their EOS; Qwen2's pad is its EOS and it has no BOS)
SPECIAL_TOKENS = {"gpt2": ("<PAD>", "<BOS>", "<EOS>"), "llama": ("<PAD>", "<s>", "</s>"),
                  "qwen2": ("<PAD>", "<BOS>", "<|endoftext|>"), "mistral": ("<PAD>", "<s>", "</s>")}
# the sentence feature init picks: BERT's pretrained pooler; ModernBERT and DeBERTa-v2 have none
POOLING = {"bert": "pooler", "modernbert": "mean", "deberta-v2": "mean"}
LATENT = 8


@pytest.fixture(scope="module")
def backbones(tmp_path_factory):
    root = tmp_path_factory.mktemp("backbones")
    for model_type in ENCODERS:
        write_encoder(root / model_type, model_type)
    for model_type, config in DECODERS.items():
        write_decoder(root / model_type, model_type, **config)
    return root


def init(encoder, decoder, out, *options, capsys):
    code = main(["optimus", "init", str(encoder), str(decoder), str(out), "--latent-size", str(LATENT), *options])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


@pytest.fixture(scope="module")
def built(backbones, tmp_path_factory):
    """`init` of every pair, once: {(encoder, decoder): folder}."""
    root = tmp_path_factory.mktemp("built")
    folders = {}
    for encoder, decoder in PAIRS:
        folders[encoder, decoder] = root / f"{encoder}+{decoder}"
        assert main(["optimus", "init", str(backbones / encoder), str(backbones / decoder),
                     str(folders[encoder, decoder]), "--latent-size", str(LATENT)]) == 0
    return folders


# ----- init ----------------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("encoder, decoder", PAIRS, ids=[f"{e}+{d}" for e, d in PAIRS])
def test_init_holds_both_backbones_unchanged_with_three_special_tokens(backbones, built, encoder, decoder):
    folder = built[encoder, decoder]
    model, processor = AutoModel.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)
    assert isinstance(model, OptimusModel) and isinstance(processor, OptimusProcessor)
    assert (model.config.encoder.model_type, model.config.decoder.model_type) == (encoder, decoder)
    assert model.config.encoder_pooling == POOLING[encoder] and model.config.latent_size == LATENT

    # the encoder's weights, exactly (its pooler only where the sentence feature is the pooler's)
    pretrained_encoder = AutoModel.from_pretrained(backbones / encoder)
    own = model.encoder.state_dict()
    for name, tensor in pretrained_encoder.state_dict().items():
        if name.startswith("pooler.") and POOLING[encoder] != "pooler":
            assert name not in own
        else:
            assert torch.equal(own[name], tensor), name

    # the decoder's, exactly, its embeddings grown by the added tokens (new rows at the end)
    language_model = AutoModelForCausalLM.from_pretrained(backbones / decoder).eval()
    original_tokenizer, tokenizer = AutoTokenizer.from_pretrained(backbones / decoder), processor.decoder_tokenizer
    vocab = language_model.config.vocab_size
    added = [token for token in SPECIAL_TOKENS[decoder] if token in ("<PAD>", "<BOS>", "<EOS>")]
    assert len(tokenizer) == vocab + len(added) == model.config.decoder.vocab_size
    own = model.decoder.state_dict()
    embedding_names = {name for name in own if name.endswith(("wte.weight", "embed_tokens.weight"))}
    for name, tensor in language_model.base_model.state_dict().items():
        if name in embedding_names:
            assert torch.equal(own[name][:vocab], tensor) and own[name].shape[0] == vocab + len(added)
        else:
            assert torch.equal(own[name], tensor), name
    head = language_model.get_output_embeddings().weight
    assert torch.equal(model.lm_head.weight[:vocab], head)
    assert (model.lm_head.weight is model.decoder.get_input_embeddings().weight) == \
        language_model.config.tie_word_embeddings

    # pad, BOS, EOS: the tokenizer's own where they differ, the original's added tokens otherwise, in that order
    special = tuple(getattr(tokenizer, name) for name in ("pad_token", "bos_token", "eos_token"))
    assert special == SPECIAL_TOKENS[decoder]
    ids = [getattr(tokenizer, f"{name}_id") for name in ("pad_token", "bos_token", "eos_token")]
    assert [ids[special.index(token)] for token in added] == list(range(vocab, vocab + len(added)))
    for token, token_id in zip(special, ids, strict=True):
        if token not in added:
            assert token_id == original_tokenizer.convert_tokens_to_ids(token) < vocab
    assert [model.config.decoder.pad_token_id, model.config.decoder.bos_token_id,
            model.config.decoder.eos_token_id] == ids == [model.config.pad_token_id, model.config.bos_token_id,
                                                          model.config.eos_token_id]

    # with no memory slot and a zero embedding projection, the decoder computes what the causal LM computes on the
    # same ids (positions from 0): the same hidden states, exactly, and the same logits over its own vocabulary (the
    # grown LM head multiplies with more rows, which may round differently). With the memory slot, even a zero one
    # takes attention mass.
    text_ids = torch.tensor([original_tokenizer("a man is playing a guitar on the street .",
                                                add_special_tokens=False)["input_ids"]])
    expected = language_model(text_ids, output_hidden_states=True)
    latent_z = torch.randn(1, LATENT, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.latent_to_embedding.weight.zero_()
        model.latent_to_memory.weight.zero_()
        model.config.latent_as_gpt_memory = False
        output = model(decoder_input_ids=text_ids, latent_z=latent_z, output_hidden_states=True)
        assert torch.equal(output.hidden_states[-1], expected.hidden_states[-1])
        torch.testing.assert_close(output.logits[..., :vocab], expected.logits, rtol=1e-6, atol=1e-5)
        model.config.latent_as_gpt_memory = True
        output = model(decoder_input_ids=text_ids, latent_z=latent_z, output_hidden_states=True)
        assert not torch.allclose(output.hidden_states[-1], expected.hidden_states[-1], atol=1e-3)

@pytest.mark.slow
def test_init_writes_a_card_and_the_model_code(built):
    folder = built["bert", "llama"]
    text = " ".join((folder / "README.md").read_text().split())
    assert ("Built with [hf-ext](https://github.com/hf-ext/hf-ext)" in text
            and "from two pretrained backbones: the encoder `bert` and the decoder `llama`" in text)
    assert "grown by `<PAD>`, with mean-resized embeddings" in text and "its `pooler` pooling" in text
    assert "are freshly initialised and untrained" in text and "Conversion provenance" not in text
    assert "| decoder | llama, 2 layers, hidden size 32, vocabulary 304 (with `<PAD>`, `<s>`, `</s>`) |" in text
    assert str(folder.parent) not in text
    # the folder carries its code, as every folder hf-ext writes (tests/optimus/test_optimus_hub.py loads such folders
    # without hf-ext)
    assert json.loads((folder / "config.json").read_text())["auto_map"]["AutoModel"] == \
        "modeling_optimus.OptimusModel"
    assert {"modeling_optimus.py", "configuration_optimus.py", "processing_optimus.py"} <= {
        path.name for path in folder.iterdir()}


@pytest.mark.slow
def test_init_takes_the_pooling_of_a_sentence_transformers_model_and_an_explicit_one(backbones, tmp_path, capsys):
    encoder = tmp_path / "sentence-bert"
    write_encoder(encoder, "bert")
    write_sentence_transformers_pooling(encoder, "mean")
    summary = init(encoder, backbones / "gpt2", tmp_path / "mean", capsys=capsys)
    # BERT has a pretrained pooler, but the sentence-transformers model was trained on mean pooling
    assert summary["encoder_pooling"] == "mean"
    assert AutoModel.from_pretrained(tmp_path / "mean").config.encoder_pooling == "mean"
    summary = init(encoder, backbones / "gpt2", tmp_path / "cls", "--encoder-pooling", "cls", capsys=capsys)
    assert summary["encoder_pooling"] == "cls"
    assert summary["pad_token"] == "<PAD>" and summary["parameters"] == AutoModel.from_pretrained(
        tmp_path / "cls").num_parameters()


@pytest.mark.parametrize("mode, expected", [("mean", "mean"), ("cls", "cls"), ("max", None)])
def test_sentence_transformers_pooling_is_read_from_the_pooling_module(tmp_path, mode, expected):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert sentence_transformers_pooling(str(tmp_path)) is None  # no modules.json: no sentence-transformers model
    write_sentence_transformers_pooling(tmp_path, mode)
    assert sentence_transformers_pooling(str(tmp_path)) == expected


def word_tokenizer(**special):
    words = ["<s>", "</s>", "<pad>", "<|endoftext|>", "a", "dog"]
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        {word: index for index, word in enumerate(words)}, unk_token="a")), **special)


@pytest.mark.parametrize("special, added", [
    ({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}, ["<PAD>", "<BOS>", "<EOS>"]),  # GPT-2
    ({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>"}, ["<PAD>"]),  # SmolLM2, Llama, Mistral
    ({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}, ["<PAD>", "<BOS>"]),  # Qwen2
    ({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<s>"}, ["<PAD>"]),
    ({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, []),
    ({"bos_token": "<s>", "pad_token": "<pad>"}, ["<EOS>"]),
])
def test_the_tokenizers_own_special_tokens_are_kept_where_they_differ(special, added):
    assert list(decoder_tokens_to_add(word_tokenizer(**special)).values()) == added


def test_init_may_reach_the_hub_for_its_backbones_only(tmp_path):
    parser = build_parser()
    assert needs_the_hub(parser.parse_args(["optimus", "init", "org/encoder", "org/decoder", str(tmp_path / "o")]))
    assert not needs_the_hub(parser.parse_args(["optimus", "init", str(tmp_path), str(tmp_path),
                                                str(tmp_path / "o")]))
    assert needs_the_hub(argparse.Namespace(model="org/model"))  # as before, for every other command


# ----- training with frozen and LoRA backbones ----------------------------------------------------------------------

H, R, LAYERS = 32, 4, 2  # the tiny backbones' width and layers; the LoRA rank of the runs
HEAD, KV_HEADS = 8, {"gpt2": 4, "llama": 2, "qwen2": 2}  # the decoders' head size and key/value heads
TIED = {"gpt2": True, "llama": False, "qwen2": False}


def latent_parameters(decoder):
    """to_latent (H -> 2 x latent), latent_to_memory (latent -> one key/value per layer and key/value head),
    latent_to_embedding (latent -> H)."""
    return H * 2 * LATENT + LATENT * LAYERS * KV_HEADS[decoder] * HEAD + LATENT * H


# LoRA's A (r x in) and B (out x r) of each adapted projection, per backbone: BERT's query/key/value, ModernBERT's
# fused Wqkv, GPT-2's c_attn (H -> 3H), attn.c_proj and mlp.c_proj (4H -> H), Llama's and Qwen2's q/o_proj (H -> H)
# and k/v_proj (H -> key/value heads x head size)
LORA_PARAMETERS = {
    "bert": LAYERS * 3 * R * (H + H),
    "modernbert": LAYERS * R * (H + 3 * H),
    "gpt2": LAYERS * R * ((H + 3 * H) + (H + H) + (4 * H + H)),
    "llama": LAYERS * R * (2 * (H + H) + 2 * (H + 2 * HEAD)),
    "qwen2": LAYERS * R * (2 * (H + 2 * HEAD) + 2 * (H + H)),
}
# the projections LoRA adapts, by the last part of their names
ADAPTED = {"bert": ("query", "key", "value"), "modernbert": ("Wqkv",), "gpt2": ("c_attn", "c_proj"),
           "llama": ("q_proj", "k_proj", "v_proj", "o_proj"), "qwen2": ("q_proj", "k_proj", "v_proj", "o_proj")}

TRAINING_CASES = {
    "frozen encoder and decoder": ("bert", "gpt2", ["--freeze-encoder", "--freeze-decoder"], ()),
    "LoRA on both, BERT + GPT-2": ("bert", "gpt2", ["--lora-r", str(R)], ("encoder", "decoder")),
    "LoRA on both, ModernBERT + Qwen2": ("modernbert", "qwen2", ["--lora-r", str(R)], ("encoder", "decoder")),
    "LoRA on the encoder": ("bert", "llama", ["--lora-r", str(R), "--lora-on", "encoder"], ("encoder",)),
    "LoRA on the decoder": ("bert", "llama", ["--lora-r", str(R), "--lora-on", "decoder"], ("decoder",)),
}


def expected_trainable(encoder, decoder, lora_on, added_tokens):
    if not lora_on:  # frozen backbones: the latent projections alone
        return latent_parameters(decoder)
    adapters = sum(LORA_PARAMETERS[model_type] for side, model_type in (("encoder", encoder), ("decoder", decoder))
                   if side in lora_on)
    # PEFT's trainable tokens: one row of H per added token, in the LM head too where it is not tied
    tokens = added_tokens * H * (1 if TIED[decoder] else 2)
    return adapters + latent_parameters(decoder) + tokens


@pytest.mark.slow
@pytest.mark.parametrize("encoder, decoder, options, lora_on", TRAINING_CASES.values(), ids=TRAINING_CASES)
def test_training_with_frozen_or_lora_backbones(built, tmp_path, capsys, repo_root, encoder, decoder, options,
                                                lora_on):
    folder, out = built[encoder, decoder], tmp_path / "trained"
    code = main(["optimus", "train", str(folder), "--train-file", str(repo_root / SNLI_TRAIN), "--output-dir",
                 str(out), "--max-steps", "30", "--batch-size", "8", "--logging-steps", "10", "--learning-rate",
                 "2e-2", "--max-length", "20", *options])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    initial, trained = AutoModel.from_pretrained(folder), AutoModel.from_pretrained(out)
    tokenizer = AutoProcessor.from_pretrained(folder).decoder_tokenizer
    added = [tokenizer.convert_tokens_to_ids(token) for token in ("<PAD>", "<BOS>", "<EOS>") if token in
             (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token)]

    total = initial.num_parameters()
    trainable = expected_trainable(encoder, decoder, lora_on, len(added))
    assert (summary["trainable_parameters"], summary["parameters"]) == (trainable, total)
    assert summary["trainable_fraction"] == pytest.approx(trainable / total, abs=1e-6)
    card = " ".join((out / "README.md").read_text().split())
    assert f"Trained {trainable:,} of the model's {total:,} parameters ({100 * trainable / total:.2f}%)" in card

    # what was frozen is bitwise unchanged; the latent projections trained; LoRA merged into its projections; the
    # added tokens' embeddings (LoRA runs) trained, and only theirs
    before, after = initial.state_dict(), trained.state_dict()
    assert before.keys() == after.keys() and not (out / "adapter_config.json").exists()
    types = {"encoder": encoder, "decoder": decoder}
    for name, tensor in before.items():
        side, module = name.split(".", 1)[0], name.rsplit(".", 2)[-2]
        if side in ("to_latent", "latent_to_memory", "latent_to_embedding"):
            assert not torch.equal(after[name], tensor), name
        elif side in lora_on and module in ADAPTED[types[side]] and name.endswith(".weight"):
            assert not torch.equal(after[name], tensor), name
        elif lora_on and (name == "lm_head.weight" or name.endswith(("wte.weight", "embed_tokens.weight"))):
            others = [row for row in range(tensor.shape[0]) if row not in added]
            assert torch.equal(after[name][others], tensor[others]), name
            if name == "lm_head.weight":
                assert not torch.equal(after[name][added], tensor[added])
        else:
            assert torch.equal(after[name], tensor), name

    history = json.loads((out / "log_history.json").read_text())
    losses = [entry["loss_rec"] for entry in history if "loss_rec" in entry]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2]

    processor = AutoProcessor.from_pretrained(out)
    batch = processor(["a man is playing a guitar ."])
    mean, _, _ = trained.eval().encode(batch["input_ids"], batch["attention_mask"])
    tokens = trained.generate(latent_z=mean, max_new_tokens=5, do_sample=False)
    assert tokens.shape[0] == 1 and 1 < tokens.shape[1] <= 6 and isinstance(processor.batch_decode(tokens)[0], str)


@pytest.mark.slow
def test_a_lora_run_ships_as_an_adapter_that_rebuilds_the_trained_model(backbones, tmp_path):
    """`save_backbones_adapter` + `optimus_from_backbones_and_adapter`: the trained model again from the two
    backbones and a folder a fraction of its size (LoRA weights, latent projections, the added tokens' rows)."""
    from datasets import Dataset

    from hf_ext.models.optimus.backbones import (
        optimus_from_backbones,
        optimus_from_backbones_and_adapter,
        save_backbones_adapter,
    )
    from hf_ext.models.optimus.training import finetune_optimus, freeze_or_adapt

    encoder, decoder = str(backbones / "bert"), str(backbones / "llama")
    model, processor = optimus_from_backbones(encoder, decoder, latent_size=LATENT, encoder_pooling="mean", beta=0.5)
    trained, _ = freeze_or_adapt(model, processor, lora_on=("encoder", "decoder"), lora_r=4)
    texts = Path(SNLI_TRAIN).read_text(encoding="utf-8").splitlines()
    finetune_optimus(trained, processor, Dataset.from_dict({"text": texts}), tmp_path / "run", max_steps=6,
                     batch_size=8, learning_rate=1e-2, seed=0, max_length=32, print_logs=False, disable_tqdm=True)
    trainable = sum(p.numel() for p in trained.parameters() if p.requires_grad)
    save_backbones_adapter(trained, tmp_path / "adapter", encoder, decoder)
    merged = trained.merge_and_unload().eval()
    rebuilt, rebuilt_processor = optimus_from_backbones_and_adapter(tmp_path / "adapter")

    batch = processor(texts[:4], max_length=32)
    with torch.no_grad():
        expected, got = merged(**batch), rebuilt(**rebuilt_processor(texts[:4], max_length=32))
    assert torch.allclose(got.mean, expected.mean, atol=1e-5)
    assert torch.allclose(got.logits, expected.logits, atol=1e-4)
    # the run moved the model away from the backbones: the check compares trained weights, not the starting ones
    untrained, _ = optimus_from_backbones(encoder, decoder, latent_size=LATENT, encoder_pooling="mean", beta=0.5)
    with torch.no_grad():
        assert not torch.allclose(untrained(**batch).logits, expected.logits, atol=1e-3)
    adapter_bytes = sum(path.stat().st_size for path in (tmp_path / "adapter").iterdir())
    assert adapter_bytes < 4 * rebuilt.num_parameters()  # less than the float32 model
    # its card (the model's, in its adapter form) says what it holds and how to rebuild, not PEFT's empty template
    card = (tmp_path / "adapter" / "README.md").read_text(encoding="utf-8")
    assert "More Information Needed" not in card and f"{trainable:,} parameters" in card
    assert f'optimus_from_backbones_and_adapter("{tmp_path / "adapter"}", encoder="{encoder}"' in card
    assert "(rank 4)" in card and "`latent_to_memory`" in card
    # `hf-ext optimus init ENCODER DECODER OUT --adapter DIR`: the same model as a folder every command reads
    assert main(["optimus", "init", encoder, decoder, str(tmp_path / "folder"), "--adapter",
                 str(tmp_path / "adapter")]) == 0
    folder_model = OptimusModel.from_pretrained(tmp_path / "folder").eval()
    with torch.no_grad():
        from_folder = folder_model(**OptimusProcessor.from_pretrained(tmp_path / "folder")(texts[:4], max_length=32))
    assert torch.allclose(from_folder.logits, expected.logits, atol=1e-4)
    folder_card = " ".join((tmp_path / "folder" / "README.md").read_text(encoding="utf-8").split())
    assert "with the trained adapter `adapter` (`--adapter`)" in folder_card and "untrained" not in folder_card


SHIPPED_ADAPTER = Path("reproductions/results/optimus_real_backbones_adapter")
REAL_TEXT_RESULTS = Path("reproductions/results/optimus_real_backbones.json")
LORA_RUN = "frozen + LoRA"
# the folder `reproductions/optimus_backbones.py DIR` wrote: the real backbones, which CI has not
REAL_BACKBONES = os.environ.get("HF_EXT_BACKBONES")


def shipped_run() -> tuple[dict, dict, dict]:
    """The shipped adapter's settings, and the first seed and its LoRA run of the results it was published with."""
    from hf_ext.models.optimus.backbones import ADAPTER_SETTINGS

    seed = json.loads(REAL_TEXT_RESULTS.read_text(encoding="utf-8"))["per_seed"][0]
    run = next(run for run in seed["runs"] if run["name"] == LORA_RUN)
    return json.loads((SHIPPED_ADAPTER / ADAPTER_SETTINGS).read_text(encoding="utf-8")), seed, run


def test_the_shipped_adapter_is_the_published_lora_run():
    """reproductions/results/optimus_real_backbones_adapter is seed 0's LoRA run of the published real-text results:
    the same backbones, settings, rank and trained parameters."""
    from safetensors import safe_open

    settings, seed, run = shipped_run()
    assert seed["seed"] == 0
    assert (settings["encoder"], settings["decoder"]) == (seed["backbones"]["encoder"], seed["backbones"]["decoder"])
    assert [settings[name] for name in ("latent_size", "beta", "dim_target_kl")] == \
        [seed["settings"][name] for name in ("latent_size", "beta", "dim_target_kl")]
    lora = json.loads((SHIPPED_ADAPTER / "adapter_config.json").read_text(encoding="utf-8"))
    assert lora["r"] == seed["settings"]["lora_rank"]
    with safe_open(SHIPPED_ADAPTER / "adapter_model.safetensors", "pt") as weights:
        stored = sum(torch.Size(weights.get_slice(name).get_shape()).numel() for name in weights.keys())
    assert stored == run["trainable_parameters"]


@pytest.mark.slow
@pytest.mark.skipif(not REAL_BACKBONES, reason="needs the real backbones: run reproductions/optimus_backbones.py DIR, "
                                               "then set HF_EXT_BACKBONES=DIR")
def test_the_shipped_adapter_rebuilds_the_published_reconstructions():
    """Rebuilt on this machine from the two backbones and the adapter (trained on a GPU), the model decodes the
    published held-out sentences to the published reconstructions."""
    from hf_ext.models.optimus import OptimusLatentSpace
    from hf_ext.models.optimus.backbones import optimus_from_backbones_and_adapter

    settings, seed, run = shipped_run()
    model, processor = optimus_from_backbones_and_adapter(
        SHIPPED_ADAPTER, encoder=str(Path(REAL_BACKBONES) / settings["encoder"]),
        decoder=str(Path(REAL_BACKBONES) / settings["decoder"]))
    space = OptimusLatentSpace(model, processor, max_new_tokens=seed["settings"]["max_length"])
    rows = run["reconstructions"]
    assert space.reconstruct([row["input"] for row in rows]) == [row["output"] for row in rows]
