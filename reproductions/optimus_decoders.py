"""Optimus with other decoders (issue "Optimus on any encoder and any causal language model"): the demo's recipe,
on CPU, with a tiny GPT-2 decoder (the paper's kind), a tiny Llama-style decoder (rotary positions, grouped-query
attention: 4 heads sharing 2 key/value heads, RMSNorm, gated MLP) and a tiny Qwen2-style one (the same, with biased
query/key/value projections), each behind the same tiny BERT encoder, trained from scratch.

Recipe and data: those of `hf-ext demo` (`hf_ext/models/optimus/demo.py`): the 40 sentences bundled with hf-ext and
216 recombined from their parts, tokenizers trained on them, latent size 16, width 64, 2 layers, no dropout, the
original's cyclical schedule (beta 0 for a quarter of the run, a ramp to 0.5 over the next quarter) with 3 nats of
free bits per dimension, 5,000 steps of 16 sentences. Measured on the 40 bundled sentences, as the demo does:
reconstruction word accuracy (greedy decoding from the posterior mean), KL, active units and mutual information
(`evaluate_optimus_lm`), trainable parameters and training seconds. The sentences are training sentences: this
compares how well each decoder learns through the latent, not generalisation.

    python reproductions/optimus_decoders.py --jobs 2 --threads 1 \\
        --output reproductions/results/optimus_decoders.json --plot docs/images/optimus_decoders.png
"""

import random
import tempfile
import time
from pathlib import Path

import torch
from common import holds, main, markdown_table, reproduction_parser, spread, values
from datasets import Dataset
from transformers import AutoConfig, BertConfig, BertTokenizer, GPT2Config, GPT2Tokenizer

from hf_ext.models.optimus import OptimusConfig, OptimusLatentSpace, OptimusModel, OptimusProcessor
from hf_ext.models.optimus.demo import (
    BATCH_SIZE,
    BETA,
    BUNDLED_REPEATS,
    DIM_TARGET_KL,
    LEARNING_RATE,
    MODEL_SIZES,
    RATIO_INCREASE,
    RATIO_ZERO,
    WARMUP_STEPS,
    recombined_sentences,
)
from hf_ext.models.optimus.metrics import evaluate_optimus_lm, word_accuracy
from hf_ext.models.optimus.training import finetune_optimus
from hf_ext.sample_text import bundled_sentences, train_bert_vocab, train_gpt2_bpe

RESULT_KEYS = ["settings", "decoders"]  # of each seed

DECODERS = ("gpt2", "llama", "qwen2")
STEPS, QUICK_STEPS = 5000, 60
KEY_VALUE_HEADS = 2  # of the 4 heads: grouped-query attention in the rotary decoders
# the rotary decoders' gated MLP, about 8/3 of the width as Llama's, so that their size stays near GPT-2's 4x MLP
INTERMEDIATE_SIZE = 172
MAX_POSITIONS = 64
METRIC_SAMPLES = 10  # as the demo


def build_processor(folder: Path) -> OptimusProcessor:
    """The demo's tokenizers, trained on the bundled sentences: a word-level BERT vocabulary and a byte-level BPE
    (every decoder reads the same one: a tokenizer does not depend on the architecture)."""
    sentences = bundled_sentences()
    train_bert_vocab(sentences, folder / "encoder")
    train_gpt2_bpe(sentences, folder / "decoder", vocab_size=MODEL_SIZES["decoder_vocab_size"])
    decoder = GPT2Tokenizer(vocab=str(folder / "decoder" / "vocab.json"), merges=str(folder / "decoder" / "merges.txt"))
    OptimusProcessor.add_decoder_special_tokens(decoder)
    return OptimusProcessor(tokenizer=BertTokenizer(vocab=str(folder / "encoder" / "vocab.txt")),
                            decoder_tokenizer=decoder)


def optimus_config(kind: str, processor: OptimusProcessor) -> OptimusConfig:
    """The demo's sizes with a decoder of `kind`, no dropout anywhere."""
    hidden, layers, heads = MODEL_SIZES["hidden_size"], MODEL_SIZES["num_layers"], MODEL_SIZES["num_heads"]
    tok = processor.decoder_tokenizer
    special = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                   eos_token_id=tok.eos_token_id)
    encoder = BertConfig(vocab_size=len(processor.tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, intermediate_size=2 * hidden, max_position_embeddings=MAX_POSITIONS,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if kind == "gpt2":
        decoder = GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=MAX_POSITIONS, resid_pdrop=0.0,
                             embd_pdrop=0.0, attn_pdrop=0.0, **special)
    else:
        decoder = AutoConfig.for_model(kind, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                       num_key_value_heads=KEY_VALUE_HEADS, intermediate_size=INTERMEDIATE_SIZE,
                                       max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True, **special)
    return OptimusConfig(encoder=encoder, decoder=decoder, latent_size=MODEL_SIZES["latent_size"], beta=BETA,
                         dim_target_kl=DIM_TARGET_KL, length_weighted_loss=False)


def train_and_measure(kind: str, processor: OptimusProcessor, texts: list[str], steps: int, seed: int,
                      folder: Path) -> dict:
    torch.manual_seed(seed)
    model = OptimusModel(optimus_config(kind, processor))
    started = time.perf_counter()
    trainer = finetune_optimus(model, processor, Dataset.from_dict({"text": texts}), folder, max_steps=steps,
                               batch_size=BATCH_SIZE, learning_rate=LEARNING_RATE, ratio_zero=RATIO_ZERO,
                               ratio_increase=RATIO_INCREASE, logging_steps=max(1, steps // 40),
                               warmup_steps=min(WARMUP_STEPS, steps // 10), seed=seed, print_logs=False,
                               disable_tqdm=True)
    seconds = time.perf_counter() - started
    model.eval()
    sentences = bundled_sentences()
    outputs = OptimusLatentSpace(model, processor, max_new_tokens=24).reconstruct(sentences)
    accuracies = [word_accuracy(source, output) for source, output in zip(sentences, outputs, strict=True)]
    metrics = evaluate_optimus_lm(model, processor, sentences, num_samples=METRIC_SAMPLES,
                                  samples_per_pass=METRIC_SAMPLES, generator=torch.Generator().manual_seed(seed))
    return {
        "decoder": kind,
        "parameters": model.num_parameters(),
        "decoder_parameters": model.decoder.num_parameters(),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "word_accuracy": sum(accuracies) / len(accuracies),
        "exact": sum(accuracy == 1 for accuracy in accuracies),
        "kl": metrics["kl"], "active_units": metrics["active_units"], "mi": metrics["mi"],
        "perplexity": metrics["perplexity"],
        "training_seconds": round(seconds, 1),
        "reconstructions": [{"input": s, "output": o} for s, o in zip(sentences[:4], outputs[:4], strict=True)],
        "curve": [{"step": entry["step"], "loss_rec": entry["loss_rec"], "kl": entry["kl"]}
                  for entry in trainer.state.log_history if "loss_rec" in entry],
    }


def run(args) -> dict:
    """One seed: each decoder trained with the demo's recipe and measured."""
    steps = QUICK_STEPS if args.quick else STEPS
    texts = bundled_sentences() * BUNDLED_REPEATS + recombined_sentences()
    random.Random(args.seed).shuffle(texts)
    decoders = {}
    with tempfile.TemporaryDirectory() as scratch:
        processor = build_processor(Path(scratch) / "tokenizers")
        for kind in DECODERS:
            print(f"seed {args.seed}: training the {kind} decoder ({steps} steps)", flush=True)
            decoders[kind] = train_and_measure(kind, processor, texts, steps, args.seed, Path(scratch) / kind)
    return {"settings": {"steps": steps, "batch_size": BATCH_SIZE, "learning_rate": LEARNING_RATE, "beta": BETA,
                         "dim_target_kl": DIM_TARGET_KL, "key_value_heads": KEY_VALUE_HEADS,
                         "intermediate_size": INTERMEDIATE_SIZE, **MODEL_SIZES},
            "decoders": decoders}


def claims(results: dict) -> list[tuple[str, object]]:
    latent_size = results["per_seed"][0]["settings"]["latent_size"]

    def figure(seed, kind, key):
        return seed["decoders"][kind][key]

    return [
        ("every decoder reconstructs the bundled sentences with mean word accuracy >= 0.9",
         lambda seed: all(figure(seed, kind, "word_accuracy") >= 0.9 for kind in DECODERS)),
        ("every decoder keeps the latent in use (all units active, KL > 1 nat)",
         lambda seed: all(figure(seed, kind, "active_units") == latent_size and figure(seed, kind, "kl") > 1
                          for kind in DECODERS)),
        ("the rotary decoders reconstruct within 5 points of GPT-2",
         lambda seed: all(figure(seed, kind, "word_accuracy") >= figure(seed, "gpt2", "word_accuracy") - 0.05
                          for kind in DECODERS[1:])),
    ]


def tables(results: dict) -> str:
    latent_size = results["per_seed"][0]["settings"]["latent_size"]

    def cell(kind, key, digits=2, scale=1.0):
        return spread(values(results, lambda seed: seed["decoders"][kind][key]), digits, scale)

    rows = [[kind, f"{results['per_seed'][0]['decoders'][kind]['trainable_parameters']:,}",
             cell(kind, "word_accuracy", 1, 100) + " %", cell(kind, "exact", 1) + " / 40", cell(kind, "kl", 1),
             f"{cell(kind, 'active_units', 1)} / {latent_size}", cell(kind, "mi", 2),
             cell(kind, "training_seconds", 0)] for kind in DECODERS]
    figures = markdown_table(["decoder", "trainable parameters", "word accuracy", "exact", "KL (nats)",
                              "active units", "MI (nats)", "training seconds"], rows)
    claim_rows = [[claim, holds(results, test)] for claim, test in claims(results)]
    return figures + "\n\n" + markdown_table(["claim", "holds in (seeds)"], claim_rows)


def draw(pyplot, results: dict, path: Path) -> None:
    """Each decoder's reconstruction loss and KL over training (the first seed)."""
    figure, (loss_axis, kl_axis) = pyplot.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
    for kind in DECODERS:
        curve = results["per_seed"][0]["decoders"][kind]["curve"]
        steps = [entry["step"] for entry in curve]
        loss_axis.plot(steps, [entry["loss_rec"] for entry in curve], label=kind)
        kl_axis.plot(steps, [entry["kl"] for entry in curve], label=kind)
    loss_axis.set(title="reconstruction loss (nats per sentence)", xlabel="step", yscale="log")
    kl_axis.set(title="KL(q(z|x) || p(z)) (nats)", xlabel="step")
    for axis in (loss_axis, kl_axis):
        axis.legend()
    figure.suptitle(f"Optimus with three decoders, the demo's recipe (seed {results['per_seed'][0]['seed']})")
    figure.savefig(path, dpi=100)


if __name__ == "__main__":
    main(reproduction_parser(__doc__), run, tables, draw)
