"""SMART adversarial regularisation (Jiang et al., ACL 2020) as MT-DNN's original runs it (`--adv_train`).

Facts from namisan/mt-dnn (HEAD 3228e7c): `mt_dnn/perturbation.py` (`SmartPerturbation`), `mt_dnn/loss.py`
(`stable_kl`, `SymKlCriterion`, `MseCriterion`), `mt_dnn/model.py` (`loss + adv_alpha * adv_loss`) and
`mt_dnn/matcher.py` (what the perturbed forward computes):

- The perturbed input is the output of the encoder's embedding module for the batch (`fwd_type=1`:
  `bert.embeddings(input_ids, token_type_ids)`, dropout included in training), fed back to the encoder as
  `inputs_embeds` (`fwd_type=2`). Encoders add their position (and segment) embeddings to `inputs_embeds`, so those
  are added a second time, with a second LayerNorm: that is what the original trains, and what this port computes.
- Noise starts as `N(0, 1) * adv_noise_var`; each of `adv_k` steps takes the gradient of the divergence between the
  perturbed and the clean (detached) logits (a stable symmetric-KL term for classification and ranking, a summed
  squared error for regression), moves the noise by `adv_step_size` times it and normalises the result
  (`adv_p_norm`: `inf` divides by the largest absolute value, `l2` by the norm, `l1` takes the sign; per token, or per
  sentence with `adv_norm_level` > 0, each plus `adv_epsilon`). A non-finite gradient ends the step with no
  adversarial loss, as the original returns 0.
- The adversarial loss is the task's `adv_loss` criterion between the clean logits and the final perturbed ones:
  `SymKlCriterion` for classification and ranking, `MseCriterion` for regression; training adds
  `adv_alpha` times it to the task loss.

Where the original breaks, this port computes what its code means: only `inf` per-token normalisation runs there
(the other norms end in an unbound variable), its regression criterion broadcasts `(B,)` against `(B, 1)` into a
`(B, B)` mean, and its ranking path compares grouped logits with ungrouped ones. Here every norm works, regression
compares scores row by row and ranking compares the grouped `(B, K)` scores on both sides.
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F

if TYPE_CHECKING:
    from .modeling_mtdnn import MTDNNModel

NORMS = ("inf", "l2", "l1")
SMART_TASK_TYPES = ("classification", "regression", "ranking")  # the original's SmartPerturbation asserts these


@dataclass(frozen=True)
class SmartSettings:
    """The original's `--adv_*` options (train.py defaults)."""

    alpha: float = 1.0  # --adv_alpha: weight of the adversarial loss
    k: int = 1  # --adv_k: ascent steps on the noise
    step_size: float = 1e-5  # --adv_step_size
    noise_var: float = 1e-5  # --adv_noise_var: scale of the initial noise
    epsilon: float = 1e-6  # --adv_epsilon: added to the norm
    p_norm: str = "inf"  # --adv_p_norm: inf, l2 or l1
    norm_level: int = 0  # --adv_norm_level: 0 per token, > 0 per sentence

    def __post_init__(self) -> None:
        if self.p_norm not in NORMS:
            raise ValueError(f"adv_p_norm must be one of {', '.join(NORMS)}, got {self.p_norm!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"adv_k must be a positive integer, got {self.k!r}")
        for name in ("alpha", "step_size", "noise_var", "epsilon"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"adv_{name} must be a finite number >= 0, got {value!r}")


def stable_kl(logits: torch.Tensor, target: torch.Tensor, epsilon: float = 1e-6, reduce: bool = True,
              ) -> torch.Tensor:
    """The original's `stable_kl`: a KL term between the softmaxes of two logit tensors, computed on log-odds."""
    logits = logits.view(-1, logits.size(-1)).float()
    target = target.view(-1, target.size(-1)).float()
    p = F.log_softmax(logits, 1).exp()
    y = F.log_softmax(target, 1).exp()
    rp = -(1.0 / (p + epsilon) - 1 + epsilon).detach().log()
    ry = -(1.0 / (y + epsilon) - 1 + epsilon).detach().log()
    total = (p * (rp - ry) * 2).sum()
    return total / logits.size(0) if reduce else total


def symmetric_kl(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The original's `SymKlCriterion`: KL(target || logits) + KL(logits || target), each side's target detached."""
    logits, target = logits.float(), target.float()
    return (F.kl_div(F.log_softmax(logits, -1), F.softmax(target.detach(), -1), reduction="batchmean")
            + F.kl_div(F.log_softmax(target, -1), F.softmax(logits.detach(), -1), reduction="batchmean"))


def _normalize(delta: torch.Tensor, settings: SmartSettings) -> torch.Tensor:
    dims: tuple[int, ...] = (-2, -1) if settings.norm_level > 0 else (-1,)
    if settings.p_norm == "l1":
        return delta.sign()
    if settings.p_norm == "l2":
        return delta / (torch.norm(delta, dim=dims, keepdim=True) + settings.epsilon)
    return delta / (delta.abs().amax(dims, keepdim=True) + settings.epsilon)


def embedding_output(model: "MTDNNModel", input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                     ) -> torch.Tensor:
    """The encoder's embedding module on the batch: the original's `fwd_type=1`."""
    embeddings = model.bert.embeddings
    assert isinstance(embeddings, torch.nn.Module)  # the encoder's embedding layer (a submodule, not a tensor)
    if model.encoder_reads_segments and token_type_ids is not None:
        return embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
    return embeddings(input_ids=input_ids)


def adversarial_loss(model: "MTDNNModel", spec: dict[str, Any], logits: torch.Tensor,
                     inputs: dict[str, Any], settings: SmartSettings) -> torch.Tensor | None:
    """SMART's adversarial loss of one batch of task `spec` (a task of `model.config`), given the clean `logits` of
    the same batch from `model` (an `MTDNNModel`) in its current mode; None where the noise's gradient is not
    finite. `inputs` hold `input_ids`, and optionally `token_type_ids`, `attention_mask`, `premise_mask`,
    `hypothesis_mask`, `group_size`."""
    if spec["type"] not in SMART_TASK_TYPES:
        raise ValueError(f"SMART covers {', '.join(SMART_TASK_TYPES)} tasks, as the original's SmartPerturbation; "
                         f"task {spec['name']} is {spec['type']}")
    input_ids = inputs["input_ids"]
    token_type_ids = inputs.get("token_type_ids")
    attention_mask = inputs.get("attention_mask")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    ranking, regression = spec["type"] == "ranking", spec["type"] == "regression"
    group_size = inputs.get("group_size") or spec.get("group_size")

    def perturbed_logits(embedded):
        sequence = model.encode(inputs_embeds=embedded, attention_mask=attention_mask,
                                token_type_ids=token_type_ids).last_hidden_state
        scores = model.head_logits(spec["name"], sequence, token_type_ids, attention_mask, inputs.get("premise_mask"),
                                   inputs.get("hypothesis_mask"))[0]
        return scores.view(-1, group_size) if ranking else scores

    clean = logits
    if ranking:
        assert group_size is not None  # a ranking task has one (its default: 2)
        clean = logits.view(-1, group_size)
    embed = embedding_output(model, input_ids, token_type_ids)
    noise = (embed.detach().new_empty(embed.shape).normal_(0, 1) * settings.noise_var).requires_grad_()
    for _ in range(settings.k):
        adversarial = perturbed_logits(embed + noise)
        if regression:
            divergence = F.mse_loss(adversarial, clean.detach(), reduction="sum")
        else:
            divergence = stable_kl(adversarial, clean.detach(), reduce=False)
        (gradient,) = torch.autograd.grad(divergence, noise, retain_graph=False)
        if not torch.isfinite(gradient.norm()):
            return None
        noise = _normalize(noise + gradient * settings.step_size, settings).detach().requires_grad_()
    adversarial = perturbed_logits(embed + noise)
    if regression:
        return F.mse_loss(clean.view(-1), adversarial.view(-1))
    return symmetric_kl(clean, adversarial)


__all__ = ["NORMS", "SMART_TASK_TYPES", "SmartSettings", "adversarial_loss", "embedding_output", "stable_kl",
           "symmetric_kl"]
