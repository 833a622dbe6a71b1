"""Small self-made material: checkpoints written in the original Optimus on-disk format (legacy torch pickles,
original key names, args namespaces), for the demo, tests of configurations other than the fixtures', and the
conversion benchmark."""

import argparse
import json
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...sample_text import bundled_sentences, train_bert_vocab, train_gpt2_bpe
from . import OptimusConfig, OptimusModel
from .conversion import ARGS_FILE, WEIGHTS_FILE, to_original_state_dicts


def tiny_config(encoder_vocab_size: int, decoder_base_vocab_size: int, latent_size: int = 16, hidden_size: int = 64,
                num_layers: int = 2, num_heads: int = 4, max_positions: int = 64, **overrides: Any) -> OptimusConfig:
    """An `OptimusConfig` of the given small sizes; the decoder vocabulary gets `<PAD>`, `<BOS>`, `<EOS>` appended."""
    from transformers import BertConfig, GPT2Config

    v = decoder_base_vocab_size
    return OptimusConfig(
        encoder=BertConfig(vocab_size=encoder_vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                           num_attention_heads=num_heads, intermediate_size=2 * hidden_size,
                           max_position_embeddings=max_positions),
        decoder=GPT2Config(vocab_size=v + 3, n_embd=hidden_size, n_layer=num_layers, n_head=num_heads,
                           n_positions=max_positions, pad_token_id=v, bos_token_id=v + 1, eos_token_id=v + 2),
        latent_size=latent_size,
        **overrides,
    )


def random_model(config: OptimusConfig, seed: int = 0, scale: float | None = 0.2) -> OptimusModel:
    """An `OptimusModel` whose every parameter is random (LayerNorms and biases too, so parity checks see them);
    with `scale=None`, the model's own initialisation (a better start for training)."""
    torch.manual_seed(seed)
    model = OptimusModel(config)
    if scale is None:
        return model.eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * scale
            param.copy_(1 + noise if name.endswith("LayerNorm.weight") or ".ln_" in name and name.endswith(".weight")
                        else noise)
    return model.eval()


def original_args(config: OptimusConfig, **extra: Any) -> argparse.Namespace:
    """The training `argparse.Namespace` the original stores beside its weights."""
    values = dict(
        latent_size=config.latent_size, latent_as_gpt_memory=int(config.latent_as_gpt_memory),
        latent_as_gpt_emb=int(config.latent_as_gpt_emb), beta=np.float64(config.beta),
        dim_target_kl=config.dim_target_kl, fb_mode=1, use_deterministic_connect=config.fb_mode == 2,
        length_weighted_loss=config.length_weighted_loss, ratio_increase=0.25, ratio_zero=0.5,
        encoder_model_type="bert", decoder_model_type="gpt2", device=torch.device("cpu"), do_lower_case=True,
    )
    values.update(extra)
    return argparse.Namespace(**values)


def _legacy_save(obj, path):
    # 2020-era checkpoints predate torch's zip format
    torch.save(obj, path, _use_new_zipfile_serialization=False)


def write_original_checkpoint(root: str | Path, model: OptimusModel, step: int = 1,
                              tokenizer_dirs: Iterable[str | Path] | None = None, full: bool = True, split: bool = True,
                              args: argparse.Namespace | None = None) -> Path:
    """Write `model` the way the original `save_checkpoint` does under `root`: `checkpoint-encoder-{step}/`,
    `checkpoint-decoder-{step}/` (weights, config.json, args) and `checkpoint-full-{step}/training.bin`."""
    root = Path(root)
    config = model.config
    args = args if args is not None else original_args(config)
    encoder_state, decoder_state = to_original_state_dicts(
        {k: v.detach().clone() for k, v in model.state_dict().items()}, config.tie_word_embeddings)
    n_ctx = config.decoder.n_positions
    causal = torch.tril(torch.ones(n_ctx, n_ctx)).view(1, 1, n_ctx, n_ctx)
    for layer in range(config.decoder.n_layer):  # the original's causal-mask buffers are part of its state dict
        decoder_state[f"transformer.h.{layer}.attn.bias"] = causal
    if split:
        encoder_dir, decoder_dir = root / f"checkpoint-encoder-{step}", root / f"checkpoint-decoder-{step}"
        for folder, state, cfg in ((encoder_dir, encoder_state, _original_bert_config(config)),
                                   (decoder_dir, decoder_state, _original_gpt2_config(config))):
            folder.mkdir(parents=True, exist_ok=True)
            _legacy_save(state, folder / WEIGHTS_FILE)
            _legacy_save(args, folder / ARGS_FILE)
            (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        if tokenizer_dirs is not None:
            for src, dst in zip(tokenizer_dirs, (encoder_dir, decoder_dir), strict=True):
                for file in Path(src).iterdir():
                    (dst / file.name).write_bytes(file.read_bytes())
    if full:
        full_dir = root / f"checkpoint-full-{step}"
        full_dir.mkdir(parents=True, exist_ok=True)
        state = {**{f"encoder.{k}": v for k, v in encoder_state.items()},
                 **{f"decoder.{k}": v for k, v in decoder_state.items()}}
        _legacy_save({"iter": step, "model_state_dict": state, "optimizer_state_dict": {},
                      "beta": np.float64(config.beta), "args": args}, full_dir / "training.bin")
    return root


def _original_bert_config(config):
    enc = config.encoder
    return {"attention_probs_dropout_prob": enc.attention_probs_dropout_prob, "finetuning_task": None,
            "hidden_act": enc.hidden_act, "hidden_dropout_prob": enc.hidden_dropout_prob,
            "hidden_size": enc.hidden_size, "initializer_range": enc.initializer_range,
            "intermediate_size": enc.intermediate_size, "layer_norm_eps": enc.layer_norm_eps,
            "max_position_embeddings": enc.max_position_embeddings, "num_attention_heads": enc.num_attention_heads,
            "num_hidden_layers": enc.num_hidden_layers, "num_labels": 2, "output_attentions": False,
            "output_hidden_states": False, "pruned_heads": {}, "torchscript": False,
            "type_vocab_size": enc.type_vocab_size, "vocab_size": enc.vocab_size}


def _original_gpt2_config(config):
    dec = config.decoder
    return {"attn_pdrop": dec.attn_pdrop, "embd_pdrop": dec.embd_pdrop, "finetuning_task": None,
            "initializer_range": dec.initializer_range, "latent_size": config.latent_size,
            "layer_norm_epsilon": dec.layer_norm_epsilon, "n_ctx": dec.n_positions, "n_embd": dec.n_embd,
            "n_head": dec.n_head, "n_layer": dec.n_layer, "n_positions": dec.n_positions, "num_labels": 1,
            "output_attentions": False, "output_hidden_states": False, "pruned_heads": {},
            "resid_pdrop": dec.resid_pdrop, "torchscript": False, "vocab_size": dec.vocab_size}


def write_sample_checkpoint(root: str | Path, seed: int = 0, latent_size: int = 16, hidden_size: int = 64,
                            num_layers: int = 2, num_heads: int = 4, step: int = 1, weight_scale: float | None = 0.2,
                            decoder_vocab_size: int = 300, **config_overrides: Any) -> OptimusModel:
    """A complete original-format Optimus output folder with tokenizers trained on the bundled sentences (the
    encoder's holds all their words; the decoder's byte-level BPE has `decoder_vocab_size` entries at most)."""
    sentences = bundled_sentences()
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = Path(tmp)
        train_bert_vocab(sentences, tok_dir / "encoder")
        base_vocab = train_gpt2_bpe(sentences, tok_dir / "decoder", vocab_size=decoder_vocab_size)
        encoder_vocab = len((tok_dir / "encoder" / "vocab.txt").read_text(encoding="utf-8").splitlines())
        config = tiny_config(encoder_vocab, base_vocab, latent_size=latent_size, hidden_size=hidden_size,
                             num_layers=num_layers, num_heads=num_heads, **config_overrides)
        model = random_model(config, seed=seed, scale=weight_scale)
        write_original_checkpoint(root, model, step=step,
                                  tokenizer_dirs=(tok_dir / "encoder", tok_dir / "decoder"))
    return model
