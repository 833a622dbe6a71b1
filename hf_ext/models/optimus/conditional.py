"""The Optimus paper's label-conditional generation (its Section 5.3) as the original's released code does it, method
`conditional` of `attributes`: the autoencoder is fine-tuned with a learned embedding of each sentence's label added
to z before the decoder; samples decode a drawn z plus the requested labels' embeddings, and an edit decodes a
sentence's z plus the target label's embedding.

What the original does (ChunyuanLI/Optimus `code/examples/big_ae/modules/cara.py`, the `CARA` module, trained by
`run_lm_vae_label_ctrl_gen.py`):

- nothing is frozen: every parameter of `CARA` (encoder, decoder, a new projection to z, the label embedding) is in
  its AdamW (lr 5e-6, one epoch over Yelp's 444K sentences, all labelled: no unlabelled data);
- z is `linear(pooled)`, a new projection without variance or KL term (an autoencoder, not the VAE), and the decoder
  reads `z + label_embedding(label)` through Optimus' latent projections; the embedding has `padding_idx=0`, so the
  first label's embedding is zero and never trained;
- the loss is `loss_rec + 0.0 * (...)`: the latent discriminator, the generator of z, the latent classifier meant to
  take the label out of z and the classifier of sentences are built but never trained;
- generation decodes `latent_generator(noise) + embedding(label)`, the generator an untrained linear layer of
  N(0, I) noise; transfer (editing) decodes `z + embedding(other label)`, binary labels only (more raise
  `NotImplementedError`).

What differs here, and why: z stays Optimus' posterior, trained with its KL term (`finetune_optimus`' KL-weight
schedule and free bits), because sampling needs a distribution of z that the untrained generator does not give;
every label has an embedding (no zero label) and each attribute its own table, the embeddings of a sentence's labels
summed (a sentence labelled for one attribute adds nothing for the others); samples draw z from a Gaussian fitted to
the fine-tuned model's posterior means of the training sentences (the flow's p(z), for the reason `attributes`
gives) instead. Like the original, the whole model trains, on the labelled sentences only (the other methods'
budget); the fine-tuned model is a new model folder that holds its operators (`latent_attributes/NAME/`:
`attribute.json` with `"method": "conditional"`, `label_embedding.safetensors`; the class, sampling and editing are
in `attributes`, which loads every kind of operator).
"""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from .attributes import NO_LABEL, ConditionalAttribute, gaussian_scale, label_offset, latent_fingerprint

if TYPE_CHECKING:
    from .latent_space import OptimusLatentSpace
    from .modeling_optimus import OptimusModel, OptimusOutput
    from .processing_optimus import OptimusProcessor
    from .training import OptimusTrainer

# the fine-tuning: the demo's batch, half its learning rate; on seed 0's demo model of
# reproductions/optimus_guided.py, samples matched the requested place 0.38, 0.83, 0.88 after 300 steps at 2e-4, 600
# and 1,500 at 1e-3 (the subject 0.31, 0.28, 0.29), edits succeeded 0.07, 0.12, 0.17
STEPS = 600
BATCH_SIZE = 16
LEARNING_RATE = 1e-3


class LabelConditionalOptimus(nn.Module):
    """What the fine-tuning trains: an `OptimusModel` whose decoder reads z plus the embeddings of each sentence's
    labels (`attribute_labels`: [batch, attributes] label ids, `NO_LABEL` where a sentence has none), with Optimus'
    loss (reconstruction plus beta times the KL, as `OptimusModel.forward` computes it). `config` and `beta` are the
    model's, for `OptimusTrainer` and its KL-weight schedule."""

    def __init__(self, optimus: "OptimusModel", attributes: Sequence[ConditionalAttribute]) -> None:
        super().__init__()
        self.optimus = optimus
        self.attributes = nn.ModuleList(attributes)

    @property
    def config(self) -> Any:
        return self.optimus.config

    @property
    def beta(self) -> float:
        return self.optimus.beta

    @beta.setter
    def beta(self, value: float) -> None:
        self.optimus.beta = value

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                attribute_labels: torch.Tensor) -> "OptimusOutput":
        from .modeling_optimus import OptimusOutput, kl_divergence

        model, config = self.optimus, self.optimus.config
        mean, logvar, _ = model.encode(input_ids, attention_mask)
        if config.fb_mode == 2:  # as OptimusModel.forward: the deterministic connection fixes the variance to 1
            logvar = torch.zeros_like(logvar)
        latent_z = model.reparameterize(mean, logvar) if self.training else mean
        attributes = cast(list[ConditionalAttribute], list(self.attributes))
        decoded = model(labels=labels, latent_z=latent_z + label_offset(attributes, attribute_labels))
        # as OptimusModel.forward: plain KL while the schedule holds beta at 0
        loss_kl = kl_divergence(mean, logvar, 0 if (config.fb_mode == 1 and model.beta == 0) else config.fb_mode,
                                config.dim_target_kl)
        return OptimusOutput(loss=decoded.loss + model.beta * loss_kl.mean(), loss_rec=decoded.loss_rec,
                             loss_kl=loss_kl, logits=decoded.logits, latent_z=latent_z, mean=mean, logvar=logvar)


def labelled_rows(labelled: Mapping[str, tuple[Sequence[str], Sequence[str]]],
                  ) -> tuple[dict[str, list[str]], list[str], list[list[int]]]:
    """Each attribute's sorted labels, and the distinct sentences with their label ids per attribute (`NO_LABEL`
    where a sentence has none); a ValueError for a sentence given two labels of one attribute."""
    names = {name: sorted(set(labels)) for name, (_, labels) in labelled.items()}
    rows: dict[str, list[int]] = {}
    for column, (name, (texts, labels)) in enumerate(labelled.items()):
        if len(texts) != len(labels) or not texts:
            raise ValueError(f"attribute {name!r}: need one label per sentence, got {len(texts)} sentences and "
                             f"{len(labels)} labels")
        for text, label in zip(texts, labels, strict=True):
            row = rows.setdefault(text, [NO_LABEL] * len(labelled))
            if row[column] not in (NO_LABEL, names[name].index(label)):
                raise ValueError(f"attribute {name!r}: the sentence {text!r} is labelled both "
                                 f"{names[name][row[column]]!r} and {label!r}")
            row[column] = names[name].index(label)
    return names, list(rows), list(rows.values())


def train_label_conditional(model: "OptimusModel", processor: "OptimusProcessor",
                            labelled: Mapping[str, tuple[Sequence[str], Sequence[str]]], output_dir: str | Path,
                            steps: int = STEPS, batch_size: int = BATCH_SIZE, learning_rate: float = LEARNING_RATE,
                            seed: int = 0, **training_kwargs: Any,
                            ) -> tuple[dict[str, ConditionalAttribute], "OptimusTrainer"]:
    """Fine-tune all of `model` (in place) with one label embedding table per attribute of `labelled`
    (`{name: (sentences, labels)}`) added to z, by `finetune_optimus` (the Trainer working in `output_dir`); then fit
    the Gaussian of its posterior means of the sentences. Returns the operators, by name, and the trainer."""
    from datasets import Dataset

    from .latent_space import OptimusLatentSpace
    from .training import finetune_optimus

    if not labelled:
        raise ValueError("no attributes to train: give at least one attribute's labelled sentences")
    names, texts, label_ids = labelled_rows(labelled)
    torch.manual_seed(seed)
    attributes = [ConditionalAttribute(name, labels, model.config.latent_size) for name, labels in names.items()]
    conditional = LabelConditionalOptimus(model, attributes).to(model.device)
    dataset = Dataset.from_dict({"text": texts, "attribute_labels": label_ids})
    trainer = finetune_optimus(conditional, processor, dataset, output_dir, max_steps=steps, batch_size=batch_size,
                               learning_rate=learning_rate, seed=seed, print_logs=False,
                               data_collator=LabelledOptimusCollator(processor), **training_kwargs)
    model.eval()
    fit_latent_gaussian(OptimusLatentSpace(model, processor), texts, attributes)
    return {attribute.name: attribute.eval() for attribute in attributes}, trainer


def fit_latent_gaussian(space: "OptimusLatentSpace", texts: Sequence[str],
                        attributes: Sequence[ConditionalAttribute]) -> None:
    """Each operator's `latent_mean`, `latent_scale` (the Gaussian fit of the posterior means of `texts`) and
    `fingerprint`, of the fine-tuned model."""
    means = torch.cat([space.encode(list(texts[start:start + 64]))[0].float() for start in range(0, len(texts), 64)])
    scale = gaussian_scale(means)
    for attribute in attributes:
        attribute.latent_mean.copy_(means.mean(0))
        attribute.latent_scale.copy_(scale)
        attribute.fingerprint = latent_fingerprint(space.model)


class LabelledOptimusCollator:
    """`OptimusDataCollator`'s batch plus `attribute_labels`, the rows' label ids per attribute."""

    def __init__(self, processor: "OptimusProcessor", text_column: str = "text") -> None:
        from .training import OptimusDataCollator

        self.texts = OptimusDataCollator(processor, text_column)
        self.text_column = text_column  # OptimusTrainer keeps this dataset column for the collator

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return {**self.texts(features),
                "attribute_labels": torch.tensor([feature["attribute_labels"] for feature in features])}


__all__ = ["LabelConditionalOptimus", "LabelledOptimusCollator", "labelled_rows", "train_label_conditional"]
