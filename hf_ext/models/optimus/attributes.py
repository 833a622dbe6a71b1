"""Latent attribute operators: small classifiers on Optimus' latent z, trained from a handful of labelled sentences
on a frozen model, and what they steer: guided sampling and editing (the method of LatentOps, Liu et al., EMNLP
2023, on Optimus' latent space).

An operator is a folder `latent_attributes/<name>/` (`attribute.json`: the labels, the latent size and the
fingerprint of the model it was trained on; `classifier.safetensors`: the weights). Kept inside a model folder, the
operators travel with it to the Hub; several compose. Loading needs torch, safetensors and huggingface_hub only.

Sampling follows LatentOps' ODE sampler: the attributes define an energy-based distribution on the latent,
p(z | a) ∝ p(z) prod_i p(a_i | z), and samples come from the probability-flow ODE of the variance-preserving SDE
(beta linear from 0.1 to 20, as LatentOps), integrated from t = 1 (a draw from p(z)) to t = 0. LatentOps takes the
score of the time-0 energy at every t, so that p(z)'s term cancels the drift's own and the flow is
du/dt = -1/2 beta(t) grad_u sum_i log p(a_i | z(u)) in the coordinates u where p(z) is a standard normal: each latent
climbs the classifiers' log-probabilities and stops moving where they saturate, near where it started.

One difference, and why: LatentOps' p(z) is the prior N(0, I), assuming the VAE's aggregate posterior matches it.
A small Optimus' does not (in one demo model the posterior means lie around a point 2.6 from the origin, with
per-dimension spreads from 0.05 to 0.9; prior samples decode to well-formed sentences 28% of the time). Here p(z)
is instead a Gaussian fitted to the posterior means of the sentences the operators were trained on (each operator
stores its fit; several are averaged), z = mean + L u with L its Cholesky factor: sampling starts where sentences
are, and the flow's steps have the scale of their spread (the classifiers read whitened latents too).

Editing runs the same flow from a sentence's posterior mean, with every other loaded attribute held at the label its
classifier gives the sentence (LatentOps' editing keeps the other attributes so); the flow's end is the edited
latent.

A second method, `gaussian`, stays on the data: each operator also stores a Gaussian per label fitted to the same
labelled sentences (the label's mean of posterior means; one covariance shared by the labels, the pooled
within-label covariance shrunk by `LABEL_SHRINKAGE` toward the operator's whole-data fit). Guided sampling draws
from the requested label's Gaussian (at `GAUSSIAN_TEMPERATURE` of its spread: nearer the label's mean, more samples
carry the label), each draw with a random label of every other loaded operator (`label_mixture_latents`: the other
parts' clusters rather than the point between them); several attributes combine as p(z | a, b) ∝ p(z | a) p(z | b) /
p(z), the same composition as the flow's energy (attributes independent given z) written with Gaussians: precisions
add, the base p(z)'s precision is taken out once per extra attribute, so that the variance the labels share is not
counted twice (a plain product of the label Gaussians would shrink the samples' spread with every attribute).
Editing is the Optimus paper's latent arithmetic: the latent moves by the difference of the target label's mean and
the mean of the label the sentence has (the nearest label mean under the shared covariance); with `keep_others` the
move loses its components along the other operators' label means (the directions their labels differ in), meant to
keep their parts; measured on the demo models it keeps them less often than the plain move, so it is off by default.

A third method, `conditional`, is the Optimus paper's own label-conditional generation as its released code does it
(the fine-tuning is in `conditional`): not an operator on a frozen model's z but a fine-tuned model with a learned
embedding per label added to z; its operators (`ConditionalAttribute`) hold those embeddings (`attribute.json` says
`"method": "conditional"`) and live in the fine-tuned model's folder. The loader reads both kinds; each method works
with its own kind.
"""

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch
from torch import nn

if TYPE_CHECKING:
    from .modeling_optimus import OptimusModel

ATTRIBUTES_FOLDER = "latent_attributes"
CONFIG_NAME = "attribute.json"
WEIGHTS_NAME = "classifier.safetensors"
NAME_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
# LatentOps' variance-preserving SDE: beta(t) = BETA_MIN + t (BETA_MAX - BETA_MIN), t in [0, 1]
BETA_MIN, BETA_MAX = 0.1, 20.0
# Heun steps over t: a fixed count fixes each sample's cost; at the start (beta near 20) the drift is stiff where a
# classifier is sharp, and fewer steps (20) overshoot into latents that decode to no sentence
FLOW_STEPS = 100
HIDDEN_SIZE = 64
TRAINING_STEPS = 300
POSTERIOR_SAMPLES = 8  # latents drawn from each labelled sentence's posterior to train on, beside its mean
SHRINKAGE = 0.05  # of the fitted covariance towards the identity times its mean variance
# of the labels' shared covariance towards the whole-data fit, enough to keep it invertible for fewer sentences than
# dimensions and no more: on two demo models (20 sentences per label, latent 16) guided samples matched the requested
# part less often with every step of 0, 0.02, 0.1, 0.2, 0.5 (subject 1.00, 0.93, 0.68, 0.52, 0.35 in one)
LABEL_SHRINKAGE = 0.005
# the spread of the `gaussian` method's draws, a share of the label Gaussian's: on the three demo models of
# reproductions/optimus_guided.py, 1.0, 0.7, 0.5, 0.3 matched the requested subject 0.75-0.97, 0.82-1.00, 0.97-1.00,
# 1.00 (the subject and activity together 0.17-0.80, 0.17-0.82, 0.45-0.75, 0.65-0.88), the share of distinct
# samples 0.45-0.85, 0.42-0.72, 0.33-0.65, 0.25-0.42
GAUSSIAN_TEMPERATURE = 0.5
CONDITIONAL = "conditional"  # the method of `conditional`'s fine-tuned label embeddings
METHODS = ("gaussian", "flow", CONDITIONAL)  # of guided sampling and editing
DEFAULT_METHOD = "gaussian"  # of the latent space, the commands and the app: measured better (docs/optimus.md)
FORMAT_VERSION = 2  # of attribute.json: 1 (no version field) held the classifier only, 2 adds the label Gaussians
LABEL_GAUSSIAN_KEYS = ("label_means", "label_scale")
EMBEDDING_NAME = "label_embedding.safetensors"  # of a label-conditional operator
NO_LABEL = -1  # of a sentence that has no label for an attribute (label-conditional training)
# the spread of the `conditional` method's drawn z, a share of the fitted Gaussian's (1: the fit itself)
CONDITIONAL_TEMPERATURE = 1.0


class SentenceEncoder(Protocol):
    """What training an operator reads: an `OptimusLatentSpace` (which imports this module)."""

    model: "OptimusModel"

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]: ...


def latent_fingerprint(model: "OptimusModel") -> str:
    """A hash of what makes a latent space: the latent size and the encoder's projection to it (at bfloat16
    precision, so that the same model loaded in another float dtype keeps its operators)."""
    weight = model.to_latent.weight.detach().to("cpu", torch.bfloat16).contiguous()
    digest = hashlib.sha256(f"{model.config.latent_size}:{list(weight.shape)}:".encode())
    digest.update(weight.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()[:16]


def write_operator(folder: str | Path, operator: nn.Module, weights_name: str, config: dict[str, Any]) -> Path:
    """An operator's folder: its tensors in `weights_name` (safetensors) and `config` in `attribute.json`."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({key: value.detach().contiguous() for key, value in operator.state_dict().items()},
              folder / weights_name)
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder


class LatentAttribute(nn.Module):
    """A classifier of one attribute on z: p(label | z) by a one-hidden-layer MLP on the latent whitened by the
    Gaussian fit of the latents it was trained on (`latent_mean`, and `latent_scale` its covariance's Cholesky
    factor). Beside it the label Gaussians of the `gaussian` method: `label_means` ([labels, latent]) and
    `label_scale`, the Cholesky factor of their shared covariance (`has_label_gaussians` is False for an operator of
    format 1, saved before they existed)."""

    latent_mean: torch.Tensor
    latent_scale: torch.Tensor
    label_means: torch.Tensor
    label_scale: torch.Tensor

    def __init__(self, name: str, labels: Sequence[str], latent_size: int, hidden_size: int = HIDDEN_SIZE,
                 fingerprint: str = "") -> None:
        super().__init__()
        if not NAME_PATTERN.fullmatch(name):
            raise ValueError(f"attribute name {name!r}: use letters, digits, '_' and '-' (a letter first, at most 64)")
        if len(set(labels)) != len(labels) or len(labels) < 2:
            raise ValueError(f"attribute {name!r} needs at least 2 different labels, got {list(labels)}")
        self.name, self.labels, self.fingerprint = name, list(labels), fingerprint
        self.latent_size, self.hidden_size = latent_size, hidden_size
        self.register_buffer("latent_mean", torch.zeros(latent_size))
        self.register_buffer("latent_scale", torch.eye(latent_size))
        self.register_buffer("label_means", torch.zeros(len(labels), latent_size))
        self.register_buffer("label_scale", torch.eye(latent_size))
        self.has_label_gaussians = True
        self.classifier = nn.Sequential(nn.Linear(latent_size, hidden_size), nn.GELU(),
                                        nn.Linear(hidden_size, len(labels)))

    def forward(self, latent_z: torch.Tensor) -> torch.Tensor:
        """Logits over `labels`."""
        whitened = torch.linalg.solve_triangular(self.latent_scale, (latent_z - self.latent_mean).T, upper=False).T
        return self.classifier(whitened)

    def label_id(self, label: str) -> int:
        if label not in self.labels:
            raise ValueError(f"attribute {self.name!r} has no label {label!r}; its labels: "
                             f"{', '.join(map(repr, self.labels))}")
        return self.labels.index(label)

    @torch.no_grad()
    def predict(self, latent_z: torch.Tensor) -> list[str]:
        return [self.labels[index] for index in self(latent_z.float()).argmax(-1).tolist()]

    def require_label_gaussians(self) -> None:
        if not self.has_label_gaussians:
            raise ValueError(f"operator {self.name!r} was saved before label Gaussians existed (format 1): retrain it "
                             "(`hf-ext optimus attribute train ... --overwrite`) or use method='flow'")

    @torch.no_grad()
    def nearest_label(self, latent_z: torch.Tensor) -> torch.Tensor:
        """Each row's label id by the label Gaussians: the nearest label mean under their shared covariance."""
        self.require_label_gaussians()
        offsets = latent_z.float()[:, None, :] - self.label_means[None]  # [rows, labels, latent]
        whitened = torch.linalg.solve_triangular(self.label_scale, offsets.reshape(-1, self.latent_size).T,
                                                 upper=False).T
        return whitened.square().sum(-1).reshape(len(latent_z), -1).argmin(-1)

    def save(self, folder: str | Path) -> Path:
        """Write `folder/attribute.json` and `folder/classifier.safetensors`."""
        return write_operator(folder, self, WEIGHTS_NAME, {
            "format_version": FORMAT_VERSION, "name": self.name, "labels": self.labels,
            "latent_size": self.latent_size, "hidden_size": self.hidden_size, "model_fingerprint": self.fingerprint})

    @classmethod
    def load(cls, folder: str | Path) -> "LatentAttribute":
        from safetensors.torch import load_file

        folder = Path(folder)
        try:
            config = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
            attribute = cls(config["name"], config["labels"], int(config["latent_size"]), int(config["hidden_size"]),
                            config["model_fingerprint"])
            version = int(config.get("format_version", 1))
            if version > FORMAT_VERSION:
                raise ValueError(f"format version {version} is newer than this hf-ext reads ({FORMAT_VERSION})")
            # format 1 lacks the label Gaussians only: anything else missing is an error
            missing = attribute.load_state_dict(load_file(folder / WEIGHTS_NAME), strict=version > 1).missing_keys
            if sorted(missing) not in ([], sorted(LABEL_GAUSSIAN_KEYS)):
                raise ValueError(f"missing weights: {', '.join(missing)}")
            attribute.has_label_gaussians = not missing
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
            raise ValueError(f"{folder} is not a readable latent attribute operator "
                             f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})") from None
        return attribute.eval()


class ConditionalAttribute(nn.Module):
    """One attribute's label embeddings (`embedding`: [labels, latent], added to z before the decoder) for the model
    they were fine-tuned with (`fingerprint`), and the Gaussian fit of that model's posterior means of the training
    sentences that samples draw z from (`latent_mean`, `latent_scale` its covariance's Cholesky factor)."""

    latent_mean: torch.Tensor
    latent_scale: torch.Tensor

    def __init__(self, name: str, labels: Sequence[str], latent_size: int, fingerprint: str = "") -> None:
        super().__init__()
        if not NAME_PATTERN.fullmatch(name):
            raise ValueError(f"attribute name {name!r}: use letters, digits, '_' and '-' (a letter first, at most 64)")
        if len(set(labels)) != len(labels) or len(labels) < 2:
            raise ValueError(f"attribute {name!r} needs at least 2 different labels, got {list(labels)}")
        self.name, self.labels, self.fingerprint, self.latent_size = name, list(labels), fingerprint, latent_size
        self.embedding = nn.Embedding(len(labels), latent_size)  # N(0, 1) at first, as the original's
        self.register_buffer("latent_mean", torch.zeros(latent_size))
        self.register_buffer("latent_scale", torch.eye(latent_size))

    def label_id(self, label: str) -> int:
        if label not in self.labels:
            raise ValueError(f"attribute {self.name!r} has no label {label!r}; its labels: "
                             f"{', '.join(map(repr, self.labels))}")
        return self.labels.index(label)

    def save(self, folder: str | Path) -> Path:
        """Write `folder/attribute.json` and `folder/label_embedding.safetensors`."""
        return write_operator(folder, self, EMBEDDING_NAME, {
            "format_version": FORMAT_VERSION, "method": CONDITIONAL, "name": self.name, "labels": self.labels,
            "latent_size": self.latent_size, "model_fingerprint": self.fingerprint})

    @classmethod
    def load(cls, folder: str | Path) -> "ConditionalAttribute":
        from safetensors.torch import load_file

        folder = Path(folder)
        try:
            config = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
            version = int(config["format_version"])
            if version > FORMAT_VERSION:
                raise ValueError(f"format version {version} is newer than this hf-ext reads ({FORMAT_VERSION})")
            attribute = cls(config["name"], config["labels"], int(config["latent_size"]), config["model_fingerprint"])
            attribute.load_state_dict(load_file(folder / EMBEDDING_NAME))
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
            raise ValueError(f"{folder} is not a readable label-conditional operator "
                             f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})") from None
        return attribute.eval()


def label_offset(attributes: Sequence[ConditionalAttribute], label_ids: torch.Tensor) -> torch.Tensor:
    """The sum of each row's label embeddings ([rows, latent]); `label_ids` [rows, attributes], `NO_LABEL` adding
    nothing."""
    offset = torch.zeros(len(label_ids), attributes[0].latent_size, device=label_ids.device)
    for column, attribute in enumerate(attributes):
        ids = label_ids[:, column]
        offset = offset + attribute.embedding(ids.clamp(min=0)) * (ids != NO_LABEL)[:, None]
    return offset


def requested_offset(resolved: Sequence[tuple[ConditionalAttribute, int]], rows: int,
                     device: torch.device | str) -> torch.Tensor:
    """The requested labels' embeddings, summed, for `rows` latents."""
    with torch.no_grad():
        return label_offset([attribute for attribute, _ in resolved],
                            torch.tensor([[label for _, label in resolved]] * rows, device=device))


def conditional_latents(resolved: Sequence[tuple[ConditionalAttribute, int]], num_samples: int,
                        generator: torch.Generator | None = None, device: torch.device | str = "cpu",
                        temperature: float = CONDITIONAL_TEMPERATURE) -> torch.Tensor:
    """Draws of z from the requested operators' Gaussian fit (averaged; `temperature` scales its spread) plus the
    requested labels' embeddings: what the decoder reads to generate with those labels."""
    operators = [attribute for attribute, _ in resolved]
    mean = torch.stack([attribute.latent_mean for attribute in operators]).mean(0)
    covariance = torch.stack([attribute.latent_scale @ attribute.latent_scale.T for attribute in operators]).mean(0)
    noise = torch.randn((num_samples, len(mean)), generator=generator, device=device)
    return mean + temperature * noise @ torch.linalg.cholesky(covariance).T + requested_offset(resolved, num_samples,
                                                                                               device)


def conditional_edited_latents(resolved: Sequence[tuple[ConditionalAttribute, int]],
                               latent_z: torch.Tensor) -> torch.Tensor:
    """Each sentence's z plus the target labels' embeddings (the original's transfer: the sentence's own label's
    embedding, which its reconstruction would add, swapped for the target's)."""
    return latent_z.float() + requested_offset(resolved, len(latent_z), latent_z.device)


def load_operator(folder: Path) -> LatentAttribute | ConditionalAttribute:
    """The operator in `folder`, of the kind its `attribute.json` names (a classifier unless `"method":
    "conditional"`)."""
    try:
        method = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8")).get("method")
    except (OSError, ValueError, AttributeError):
        method = None  # LatentAttribute.load says what is wrong
    if method == CONDITIONAL:
        return ConditionalAttribute.load(folder)
    return LatentAttribute.load(folder)


def attributes_folder(source: str | Path) -> Path | None:
    """The `latent_attributes/` folder of a local folder, or of a Hub repo's snapshot (only that folder is
    downloaded); None where there is none."""
    local = Path(source)
    if local.is_dir():
        folder = local / ATTRIBUTES_FOLDER
        return folder if folder.is_dir() else None
    from huggingface_hub import snapshot_download

    folder = Path(snapshot_download(str(source), allow_patterns=[f"{ATTRIBUTES_FOLDER}/*"])) / ATTRIBUTES_FOLDER
    return folder if folder.is_dir() else None


def load_latent_attributes(source: str | Path, model: "OptimusModel",
                           ) -> dict[str, LatentAttribute | ConditionalAttribute]:
    """The operators stored in `source` (a model folder, a folder holding operators or a Hub repo id), by name:
    classifiers and label-conditional embeddings (`load_operator`); operators trained on another model (another
    latent size or fingerprint) are refused."""
    folder = attributes_folder(source)
    if folder is None:
        raise ValueError(f"{source} holds no latent attribute operators ({ATTRIBUTES_FOLDER}/): train one with "
                         "`hf-ext optimus attribute train`")
    fingerprint = latent_fingerprint(model)
    operators: dict[str, LatentAttribute | ConditionalAttribute] = {}
    for path in sorted(folder.iterdir()):
        if not (path / CONFIG_NAME).is_file():  # a staging folder of a run in progress, or something else
            continue
        attribute = load_operator(path)
        if attribute.latent_size != model.config.latent_size:
            raise ValueError(f"operator {attribute.name!r} ({path}) is for a latent size of {attribute.latent_size}, "
                             f"the model's is {model.config.latent_size}")
        if attribute.fingerprint != fingerprint:
            raise ValueError(f"operator {attribute.name!r} ({path}) was trained on another model (fingerprint "
                             f"{attribute.fingerprint}, this model's is {fingerprint})")
        operators[attribute.name] = attribute.to(model.device)
    if not operators:
        raise ValueError(f"{folder} holds no latent attribute operators")
    return operators


def train_latent_attribute(space: SentenceEncoder, texts: Sequence[str], labels: Sequence[str], name: str,
                           hidden_size: int = HIDDEN_SIZE, steps: int = TRAINING_STEPS,
                           posterior_samples: int = POSTERIOR_SAMPLES, learning_rate: float = 1e-2,
                           weight_decay: float = 1e-2, seed: int = 0) -> LatentAttribute:
    """A classifier of `labels` on the latents of `texts`, the model frozen: trained on each sentence's posterior mean
    and `posterior_samples` draws from its posterior (so that it covers the region the sentence decodes from), full
    batch with AdamW (a few hundred steps on a few hundred latents: no Trainer needed)."""
    if len(texts) != len(labels) or not texts:
        raise ValueError(f"need one label per sentence, got {len(texts)} sentences and {len(labels)} labels")
    names = sorted(set(labels))
    attribute = LatentAttribute(name, names, space.model.config.latent_size, hidden_size,
                                latent_fingerprint(space.model)).to(space.model.device)
    means, logvars = [], []
    for start in range(0, len(texts), 64):
        mean, logvar = space.encode(list(texts[start:start + 64]))
        means.append(mean.float())
        logvars.append(logvar.float())
    mean, std = torch.cat(means), torch.cat(logvars).mul(0.5).exp()
    attribute.latent_mean.copy_(mean.mean(0))
    attribute.latent_scale.copy_(gaussian_scale(mean))
    label_ids = torch.tensor([names.index(label) for label in labels], device=mean.device)
    fit_label_gaussians(attribute, mean, label_ids)
    generator = torch.Generator(device=mean.device).manual_seed(seed)
    noise = torch.randn((posterior_samples, *mean.shape), generator=generator, device=mean.device)
    latents = torch.cat([mean, (mean + std * noise).flatten(0, 1)])
    targets = label_ids.repeat(posterior_samples + 1)
    torch.manual_seed(seed)
    for layer in attribute.classifier:
        if isinstance(layer, nn.Linear):
            layer.reset_parameters()
    optimizer = torch.optim.AdamW(attribute.parameters(), lr=learning_rate, weight_decay=weight_decay)
    attribute.train()
    with torch.enable_grad():
        for _ in range(steps):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(attribute(latents), targets)
            loss.backward()
            optimizer.step()
    return attribute.eval()


def gaussian_scale(latents: torch.Tensor) -> torch.Tensor:
    """The Cholesky factor of the covariance of `latents` ([n, d]), shrunk towards a multiple of the identity by
    `SHRINKAGE` of its mean variance, so that it stays invertible for fewer sentences than dimensions."""
    covariance = torch.cov(latents.T.double()) if len(latents) > 1 else torch.zeros(latents.shape[1], latents.shape[1])
    level = max(covariance.diagonal().mean().item(), 1e-6)
    eye = torch.eye(len(covariance), dtype=covariance.dtype, device=covariance.device)
    return torch.linalg.cholesky((1 - SHRINKAGE) * covariance + SHRINKAGE * level * eye).to(latents.dtype)


def fit_label_gaussians(attribute: LatentAttribute, means: torch.Tensor, label_ids: torch.Tensor) -> None:
    """The label Gaussians of `attribute` from posterior means ([n, latent]) and their label ids: each label's mean,
    and the pooled within-label covariance shrunk by `LABEL_SHRINKAGE` toward the whole-data fit (`latent_scale`)."""
    count = len(attribute.labels)
    label_means = torch.stack([means[label_ids == label].mean(0) if (label_ids == label).any()
                               else attribute.latent_mean for label in range(count)])
    centred = (means - label_means[label_ids]).double()
    within = centred.T @ centred / max(1, len(means) - count)
    whole = (attribute.latent_scale @ attribute.latent_scale.T).double()
    covariance = (1 - LABEL_SHRINKAGE) * within + LABEL_SHRINKAGE * whole
    attribute.label_means.copy_(label_means)
    attribute.label_scale.copy_(torch.linalg.cholesky(covariance).to(means.dtype))


def latent_base(operators: Iterable[LatentAttribute]) -> tuple[torch.Tensor, torch.Tensor]:
    """p(z) of the flow: the average of the operators' Gaussian fits, as (mean, Cholesky factor)."""
    operators = list(operators)
    mean = torch.stack([attribute.latent_mean for attribute in operators]).mean(0)
    covariance = torch.stack([attribute.latent_scale @ attribute.latent_scale.T for attribute in operators]).mean(0)
    return mean, torch.linalg.cholesky(covariance)


class LabelledOperator(Protocol):
    """What a request resolves against: an operator of either kind."""

    def label_id(self, label: str) -> int: ...


Operator = TypeVar("Operator", bound=LabelledOperator)


def resolve_request(operators: Mapping[str, Operator], request: Mapping[str, str]) -> list[tuple[Operator, int]]:
    """`(operator, label id)` of each requested `{attribute: label}`; a clear ValueError for an empty request, an
    unknown attribute or a label its operator does not know."""
    if not request:
        raise ValueError("no attributes requested: name at least one as attribute=label")
    resolved = []
    for name, label in request.items():
        if name not in operators:
            raise ValueError(f"unknown attribute {name!r}; the operators are: {', '.join(sorted(operators)) or 'none'}")
        resolved.append((operators[name], operators[name].label_id(label)))
    return resolved


def parse_request(pairs: Iterable[str]) -> dict[str, str]:
    """`{attribute: label}` of `attribute=label` strings; a clear ValueError for a pair without `=` and for an
    attribute given two different labels."""
    request: dict[str, str] = {}
    for pair in pairs:
        name, equals, label = pair.partition("=")
        name, label = name.strip(), label.strip()
        if not equals or not name or not label:
            raise ValueError(f"{pair!r}: write an attribute as name=label")
        if request.get(name, label) != label:
            raise ValueError(f"contradictory request: attribute {name!r} asked to be both {request[name]!r} and "
                             f"{label!r}")
        request[name] = label
    return request


def log_probability(terms: Sequence[tuple[LatentAttribute, torch.Tensor]], latent_z: torch.Tensor) -> torch.Tensor:
    """sum_i log p(a_i | z) of each row, `terms` giving each operator with each row's label id."""
    return sum((attribute(latent_z).log_softmax(-1).gather(-1, label_ids[:, None]).squeeze(-1)
                for attribute, label_ids in terms), torch.zeros(len(latent_z), device=latent_z.device))


def attribute_flow(latent_z: torch.Tensor, terms: Sequence[tuple[LatentAttribute, torch.Tensor]],
                   scale: torch.Tensor, steps: int = FLOW_STEPS, strength: float = 1.0, keep_path: bool = False,
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """LatentOps' ODE in the coordinates u of z = mean + scale u, du/dt = -1/2 beta(t) strength grad_u
    sum_i log p(a_i | z), from t = 1 to t = 0 by Heun's method; the final latents, and every step's latents with
    `keep_path`."""
    preconditioner = scale @ scale.T  # dz/dt = scale du/dt, grad_u = scale^T grad_z

    def drift(z, t):
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            gradient, = torch.autograd.grad(log_probability(terms, z).sum(), z)
        return -0.5 * (BETA_MIN + t * (BETA_MAX - BETA_MIN)) * strength * gradient @ preconditioner

    z = latent_z.detach().float()
    path = [z] if keep_path else []
    times = torch.linspace(1.0, 0.0, steps + 1).tolist()
    for t, t_next in zip(times[:-1], times[1:], strict=True):
        step = t_next - t
        slope = drift(z, t)
        predicted = z + step * slope
        z = (z + step * 0.5 * (slope + drift(predicted, t_next))).detach()
        if keep_path:
            path.append(z)
    return z, path


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; the methods are: {', '.join(METHODS)}")


def default_method(operators: Mapping[str, object], request: Iterable[str] | None = None) -> str:
    """`conditional` where every requested operator (all of them without a request) is a label-conditional one,
    else `DEFAULT_METHOD`."""
    kinds = [not isinstance(operators[name], LatentAttribute) for name in (operators if request is None else request)
             if name in operators]
    return CONDITIONAL if kinds and all(kinds) else DEFAULT_METHOD


def operators_of_method(operators: Mapping[str, LabelledOperator], request: Mapping[str, str], method: str) -> dict:
    """The operators `method` works with: the label-conditional ones for `conditional`, the classifiers for the
    others; a ValueError for what `resolve_request` refuses and where a requested attribute's operator is of the
    other kind."""
    check_method(method)
    resolve_request(operators, request)
    conditional = method == CONDITIONAL
    for name in request:
        if name in operators and isinstance(operators[name], LatentAttribute) == conditional:
            raise ValueError(
                f"operator {name!r} is a classifier on z (methods gaussian and flow): method 'conditional' needs the "
                "label embeddings of a model fine-tuned by `hf-ext optimus attribute train --method conditional`"
                if conditional else f"operator {name!r} holds the label embeddings of a fine-tuned model: use method "
                f"'conditional' (method {method!r} needs a classifier on z)")
    return {name: operator for name, operator in operators.items()
            if isinstance(operator, LatentAttribute) != conditional}


def label_gaussian(resolved: Sequence[tuple[LatentAttribute, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, Cholesky factor) of p(z | a_1 ... a_k) ∝ prod_i p(z | a_i) / p(z)^(k - 1), with p(z) the requested
    operators' base (`latent_base`). Its precision's eigenvalues are floored at the base precision's smallest, so
    that no direction spreads wider than the base (a guard: each label's covariance lies within the base's when
    both are fitted on the same sentences, and the precision is positive then)."""
    for attribute, _ in resolved:
        attribute.require_label_gaussians()
    base_mean, base_scale = (tensor.double() for tensor in latent_base(attribute for attribute, _ in resolved))
    base_precision = torch.cholesky_inverse(base_scale)
    extra = len(resolved) - 1
    precision, weighted = -extra * base_precision, -extra * base_precision @ base_mean
    for attribute, label in resolved:
        label_precision = torch.cholesky_inverse(attribute.label_scale.double())
        precision = precision + label_precision
        weighted = weighted + label_precision @ attribute.label_means[label].double()
    values, vectors = torch.linalg.eigh((precision + precision.T) / 2)
    values = values.clamp(min=torch.linalg.eigvalsh(base_precision).min().item())
    covariance = vectors @ torch.diag(1 / values) @ vectors.T
    mean = covariance @ weighted
    scale = torch.linalg.cholesky((covariance + covariance.T) / 2)
    dtype = resolved[0][0].label_means.dtype
    return mean.to(dtype), scale.to(dtype)


def label_mixture_latents(resolved: Sequence[tuple[LatentAttribute, int]], others: Sequence[LatentAttribute],
                          num_samples: int, latent_size: int, generator: torch.Generator | None,
                          device: torch.device | str, temperature: float) -> torch.Tensor:
    """The `gaussian` method's draws: each sample gets a label of every operator in `others` (the loaded ones not
    requested) uniformly at random, then comes from the Gaussian of the requested labels and those
    (`label_gaussian`), its spread scaled by `temperature`: p(z | a) as the mixture over the other attributes'
    labels of p(z | a, b). Why: one Gaussian per requested label spans the clusters of the other parts' labels, and
    its centre lies between them, where a decoder need not read any label (on a model whose reconstructions keep all
    three demo parts, most of the place's label means decoded to another place)."""
    drawn = torch.stack([torch.randint(len(attribute.labels), (num_samples,), generator=generator, device=device)
                         for attribute in others], 1) if others else torch.zeros((num_samples, 0), dtype=torch.long,
                                                                                 device=device)
    noise = torch.randn((num_samples, latent_size), generator=generator, device=device)
    latents = torch.empty_like(noise)
    for combination in (drawn.unique(dim=0) if others else drawn[:1]):
        rows = (drawn == combination).all(1)
        mean, scale = label_gaussian([*resolved, *zip(others, combination.tolist(), strict=True)])
        latents[rows] = mean + temperature * noise[rows] @ scale.T
    return latents


def guided_latents(operators: Mapping[str, LatentAttribute | ConditionalAttribute], request: Mapping[str, str],
                   num_samples: int, latent_size: int, generator: torch.Generator | None = None,
                   steps: int = FLOW_STEPS, strength: float = 1.0, device: torch.device | str = "cpu",
                   method: str = "flow", temperature: float | None = None) -> torch.Tensor:
    """`num_samples` latents of p(z | request): with method `flow`, draws from p(z) carried by the flow; with
    `gaussian`, draws from the requested labels' Gaussian with a random label of every other loaded operator
    (`label_mixture_latents`), its spread scaled by `temperature`
    (default `GAUSSIAN_TEMPERATURE`); with `conditional`, draws of z plus the labels' embeddings
    (`conditional_latents`, `temperature` its default `CONDITIONAL_TEMPERATURE`)."""
    of_method = operators_of_method(operators, request, method)
    if method == CONDITIONAL:
        return conditional_latents(resolve_request(of_method, request), num_samples, generator, device,
                                   CONDITIONAL_TEMPERATURE if temperature is None else temperature)
    resolved = resolve_request(of_method, request)
    temperature = GAUSSIAN_TEMPERATURE if temperature is None else temperature
    if method == "gaussian":
        others = [attribute for name, attribute in of_method.items() if name not in request]
        return label_mixture_latents(resolved, others, num_samples, latent_size, generator, device, temperature)
    mean, scale = latent_base(of_method.values())
    start = mean + torch.randn((num_samples, latent_size), generator=generator, device=device) @ scale.T
    terms = [(attribute, torch.full((num_samples,), label, device=device)) for attribute, label in resolved]
    return attribute_flow(start, terms, scale, steps, strength)[0]


def arithmetic_edited_latents(operators: Mapping[str, LatentAttribute], latent_z: torch.Tensor,
                               request: Mapping[str, str], keep_others: bool = False) -> torch.Tensor:
    """The `gaussian` method's edit: each latent moved by the target label's mean minus that of its nearest label,
    for every requested attribute; with `keep_others`, the move projected off the span of the other operators'
    centred label means."""
    resolved = resolve_request(operators, request)
    latent_z = latent_z.float()
    move = torch.zeros_like(latent_z)
    for attribute, label in resolved:
        current = attribute.nearest_label(latent_z)
        move = move + attribute.label_means[label] - attribute.label_means[current]
    others = [attribute for name, attribute in operators.items() if name not in request]
    if keep_others and others:
        for attribute in others:
            attribute.require_label_gaussians()
        directions = torch.cat([attribute.label_means - attribute.label_means.mean(0) for attribute in others])
        basis, singular, _ = torch.linalg.svd(directions.T.double(), full_matrices=False)
        basis = basis[:, singular > singular.max() * 1e-6].to(move.dtype)
        move = move - (move @ basis) @ basis.T
    return latent_z + move


def edited_latents(operators: Mapping[str, LatentAttribute], latent_z: torch.Tensor, request: Mapping[str, str],
                   steps: int = FLOW_STEPS, strength: float = 1.0, keep_path: bool = False,
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The latents moved to the requested labels, every other operator's attribute held at its label there."""
    resolved = resolve_request(operators, request)
    rows = len(latent_z)
    terms = [(attribute, torch.full((rows,), label, device=latent_z.device)) for attribute, label in resolved]
    for name, attribute in operators.items():
        if name not in request:
            with torch.no_grad():
                terms.append((attribute, attribute(latent_z.float()).argmax(-1)))
    return attribute_flow(latent_z, terms, latent_base(operators.values())[1], steps, strength, keep_path)


__all__ = ["ATTRIBUTES_FOLDER", "CONDITIONAL", "ConditionalAttribute", "LatentAttribute", "conditional_edited_latents",
           "conditional_latents", "label_offset", "label_mixture_latents", "attribute_flow", "edited_latents",
           "guided_latents",
           "arithmetic_edited_latents", "check_method", "default_method", "fit_label_gaussians", "label_gaussian",
           "latent_fingerprint", "load_latent_attributes", "load_operator", "operators_of_method", "parse_request",
           "resolve_request", "train_latent_attribute", "DEFAULT_METHOD", "METHODS"]
