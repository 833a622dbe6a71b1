"""The Optimus paper's language-modelling metrics: per-example statistics from the model, aggregated by the offline
`optimus_lm` evaluate metric (perplexity, -ELBO, KL, mutual information, active units).

The estimates follow the original code (ChunyuanLI/Optimus `code/examples/big_ae/modules/vae.py` `loss_iw`,
`utils.py` `calc_iwnll`, `calc_mi`, `calc_au`).
"""

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from transformers.trainer_utils import unwrap_peft_model

from ...metrics import load_metric
from . import kl_divergence
from .modeling_optimus import OptimusModel
from .processing_optimus import OptimusProcessor

if TYPE_CHECKING:  # peft is imported only when used
    from peft import PeftModel

STATISTICS = ("log_likelihood", "reconstruction_nll", "kl", "num_words", "posterior_mean", "posterior_logvar",
              "latent_sample")


def _log_normal(z, mean, logvar):
    """log N(z; mean, diag(exp(logvar))), summed over the last dimension."""
    return (-0.5 * ((z - mean) ** 2 / logvar.exp() + logvar + math.log(2 * math.pi))).sum(-1)


@torch.no_grad()
def optimus_lm_statistics(model: "OptimusModel | PeftModel", processor: OptimusProcessor, texts: Iterable[str],
                          batch_size: int = 16, num_samples: int = 100, samples_per_pass: int = 5,
                          max_length: int | None = None, generator: torch.Generator | None = None,
                          ) -> dict[str, list]:
    """Per-example statistics of `texts` under an `OptimusModel` (or a PEFT wrapper of it), as lists keyed by the
    `optimus_lm` metric's inputs:

    - `log_likelihood`: importance-weighted log p(x) = logsumexp_k [log p(x|z_k) + log p(z_k) - log q(z_k|x)]
      - log K over `num_samples` posterior samples, drawn `samples_per_pass` at a time (the original: 100 in passes
      of 5);
    - `reconstruction_nll`: -log p(x|z) averaged over the same samples (summed token cross-entropy);
    - `kl`: plain KL(q(z|x) || N(0, I)) (no free-bits threshold);
    - `num_words`: decoder tokens including `<BOS>` and `<EOS>`, the count the original's perplexity divides by;
    - `posterior_mean`, `posterior_logvar`, and `latent_sample`: one z ~ q(z|x) for the mutual information.

    Random draws, in order, per batch: `num_samples / samples_per_pass` noise tensors of shape
    `[batch, samples_per_pass, latent_size]`, then one `[batch, latent_size]` for `latent_sample` (from `generator`).
    With `fb_mode=2` the posterior variance is 1, as the model trains it.
    """
    if num_samples < 1 or samples_per_pass < 1 or num_samples % samples_per_pass:
        raise ValueError(f"num_samples ({num_samples}) must be a positive multiple of samples_per_pass "
                         f"({samples_per_pass})")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    texts = list(texts)
    core = unwrap_peft_model(model)
    config = core.config
    was_training = model.training
    model.eval()
    stats: dict[str, list[Any]] = {name: [] for name in STATISTICS}
    try:
        for start in range(0, len(texts), batch_size):
            batch = processor(texts[start:start + batch_size], max_length=max_length)
            input_ids = batch["input_ids"].to(core.device)
            labels = batch["labels"].to(core.device)
            mean, logvar, _ = core.encode(input_ids, batch["attention_mask"].to(core.device))
            if config.fb_mode == 2:
                logvar = torch.zeros_like(logvar)
            rows, latent_size = mean.shape
            log_weights, log_likelihoods = [], []
            for _ in range(num_samples // samples_per_pass):
                expanded = (rows, samples_per_pass, latent_size)
                z = core.reparameterize(mean.unsqueeze(1).expand(expanded), logvar.unsqueeze(1).expand(expanded),
                                        generator)
                log_px_z = -model(labels=labels.repeat_interleave(samples_per_pass, 0),
                                  latent_z=z.reshape(-1, latent_size)).loss_rec.view(rows, samples_per_pass)
                log_pz = _log_normal(z, torch.zeros_like(z), torch.zeros_like(z))
                log_qz_x = _log_normal(z, mean.unsqueeze(1), logvar.unsqueeze(1))
                log_likelihoods.append(log_px_z)
                log_weights.append(log_px_z + log_pz - log_qz_x)
            log_likelihood = torch.logsumexp(torch.cat(log_weights, -1), -1) - math.log(num_samples)
            stats["log_likelihood"] += log_likelihood.tolist()
            stats["reconstruction_nll"] += (-torch.cat(log_likelihoods, -1).mean(-1)).tolist()
            stats["kl"] += kl_divergence(mean, logvar).tolist()
            stats["num_words"] += (labels != config.decoder.pad_token_id).sum(-1).tolist()
            stats["posterior_mean"] += mean.tolist()
            stats["posterior_logvar"] += logvar.tolist()
            stats["latent_sample"] += core.reparameterize(mean, logvar, generator).tolist()
    finally:
        model.train(was_training)
    return stats


def word_accuracy(reference: str, output: str) -> float:
    """Share of word positions (words split at whitespace) where `output` has `reference`'s word, over the longer
    of the two: 1.0 only for the same words in the same order; a missing, extra or shifted word costs its places."""
    reference_words, output_words = reference.split(), output.split()
    if not reference_words and not output_words:
        return 1.0
    # the words past the shorter sentence's end match nothing
    matches = sum(a == b for a, b in zip(reference_words, output_words, strict=False))
    return matches / max(len(reference_words), len(output_words))


def evaluate_optimus_lm(model: "OptimusModel | PeftModel", processor: OptimusProcessor, texts: Iterable[str],
                        au_threshold: float = 0.01, **statistics_kwargs: Any) -> dict[str, float]:
    """The paper's LM metrics of `texts`: perplexity, nll, neg_elbo, reconstruction_nll, kl, mi, active_units
    (`statistics_kwargs` go to `optimus_lm_statistics`)."""
    stats = optimus_lm_statistics(model, processor, texts, **statistics_kwargs)
    return load_metric("optimus_lm").compute(**stats, au_threshold=au_threshold)


__all__ = ["STATISTICS", "evaluate_optimus_lm", "optimus_lm_statistics", "word_accuracy"]
