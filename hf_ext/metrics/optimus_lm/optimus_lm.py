"""Language-modelling metrics of a text VAE, as reported by Optimus (Li et al., EMNLP 2020), from per-example
statistics: perplexity from the importance-weighted log-likelihood, -ELBO, KL, mutual information and active units.

The statistics come from `hf_ext.models.optimus.metrics.optimus_lm_statistics` (any VAE can provide them). This script
imports only evaluate, datasets and numpy so that `evaluate.load(path)` works offline.
"""

import math

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """
Aggregates per-example statistics of a text VAE into the metrics of the Optimus paper, with the definitions of the
original code (`calc_iwnll`, `calc_mi`, `calc_au` in ChunyuanLI/Optimus `code/examples/big_ae/utils.py`):

- perplexity: exp(-sum(log_likelihood) / sum(num_words)), the importance-weighted estimate of log p(x) per word;
- nll: -mean(log_likelihood), the importance-weighted negative log-likelihood per sentence;
- neg_elbo: mean(reconstruction_nll + kl);
- reconstruction_nll, kl: their means per sentence;
- mi: mutual information I(x; z) = E_x[E_q(z|x) log q(z|x)] - E_z[log q(z)], with the aggregate posterior
  q(z) = mean_j q(z | x_j) evaluated at one sample z_i ~ q(z | x_i) per example;
- active_units: latent dimensions whose posterior mean varies over the data (unbiased variance) by at least
  `au_threshold` (default 0.01).
"""

_KWARGS_DESCRIPTION = """
Args (one entry per example):
    log_likelihood (`float`): importance-weighted estimate of log p(x).
    reconstruction_nll (`float`): -log p(x | z) averaged over posterior samples z.
    kl (`float`): KL(q(z | x) || p(z)).
    num_words (`int`): tokens the perplexity is normalised by.
    posterior_mean (`list[float]`), posterior_logvar (`list[float]`): the Gaussian q(z | x).
    latent_sample (`list[float]`): one sample from q(z | x).
    au_threshold (`float`, defaults to 0.01): variance a dimension's posterior mean needs to count as active.
Returns:
    perplexity, nll, neg_elbo, reconstruction_nll, kl, mi, active_units.
"""

_CITATION = """
@inproceedings{li2020optimus,
  title={Optimus: Organizing Sentences via Pre-trained Modeling of a Latent Space},
  author={Li, Chunyuan and Gao, Xiang and Li, Yuan and Peng, Baolin and Li, Xiujun and Zhang, Yizhe and Gao, Jianfeng},
  booktitle={EMNLP},
  year={2020}
}
"""

# rows of the (samples x examples) log-density matrix computed at a time, to bound memory on large test sets
_MI_CHUNK = 256


def _log_gaussian(z, mean, logvar):
    """log N(z_i; mean_j, exp(logvar_j)) for every pair: z [n, d], mean/logvar [m, d] -> [n, m]."""
    dim = mean.shape[-1]
    squared = ((z[:, None, :] - mean[None]) ** 2 / np.exp(logvar)[None]).sum(-1)
    return -0.5 * squared - 0.5 * (dim * math.log(2 * math.pi) + logvar.sum(-1))[None]


def _logsumexp(values, axis):
    peak = values.max(axis=axis, keepdims=True)
    return (peak + np.log(np.exp(values - peak).sum(axis=axis, keepdims=True))).squeeze(axis)


def mutual_information(mean: np.ndarray, logvar: np.ndarray, latent_sample: np.ndarray) -> float:
    """The original's aggregate-posterior estimate of I(x; z)."""
    count, dim = mean.shape
    neg_entropy = np.mean(-0.5 * dim * math.log(2 * math.pi) - 0.5 * (1 + logvar).sum(-1))
    log_qz = np.concatenate([
        _logsumexp(_log_gaussian(latent_sample[start:start + _MI_CHUNK], mean, logvar), axis=1) - math.log(count)
        for start in range(0, count, _MI_CHUNK)
    ])
    return float(neg_entropy - log_qz.mean())


def active_units(mean: np.ndarray, threshold: float) -> int:
    """Dimensions whose posterior mean has an unbiased variance over the data of at least `threshold`."""
    return int((mean.var(axis=0, ddof=1) >= threshold).sum())


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class OptimusLM(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({
                "log_likelihood": datasets.Value("float64"),
                "reconstruction_nll": datasets.Value("float64"),
                "kl": datasets.Value("float64"),
                "num_words": datasets.Value("int64"),
                "posterior_mean": datasets.Sequence(datasets.Value("float64")),
                "posterior_logvar": datasets.Sequence(datasets.Value("float64")),
                "latent_sample": datasets.Sequence(datasets.Value("float64")),
            }),
            reference_urls=["https://github.com/ChunyuanLI/Optimus"],
        )

    def _compute(self, log_likelihood, reconstruction_nll, kl, num_words, posterior_mean, posterior_logvar,
                 latent_sample, au_threshold=0.01):
        log_likelihood = np.asarray(log_likelihood, dtype=np.float64)
        reconstruction_nll = np.asarray(reconstruction_nll, dtype=np.float64)
        kl = np.asarray(kl, dtype=np.float64)
        mean = np.asarray(posterior_mean, dtype=np.float64)
        logvar = np.asarray(posterior_logvar, dtype=np.float64)
        sample = np.asarray(latent_sample, dtype=np.float64)
        if len(log_likelihood) < 2:
            raise ValueError("the Optimus LM metrics need at least 2 examples (active units use a variance over data)")
        if mean.ndim != 2 or mean.shape != logvar.shape or mean.shape != sample.shape:
            raise ValueError("posterior_mean, posterior_logvar and latent_sample need one equal length per example")
        return {
            "perplexity": float(np.exp(-log_likelihood.sum() / np.sum(num_words))),
            "nll": float(-log_likelihood.mean()),
            "neg_elbo": float((reconstruction_nll + kl).mean()),
            "reconstruction_nll": float(reconstruction_nll.mean()),
            "kl": float(kl.mean()),
            "mi": mutual_information(mean, logvar, sample),
            "active_units": active_units(mean, au_threshold),
        }
