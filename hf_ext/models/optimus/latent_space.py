"""Sentence-level operations in Optimus' latent space: encode, reconstruct, sample, interpolate, analogy, and with
latent attribute operators (`attributes`) guided sampling and editing."""

from collections.abc import Iterable
from typing import Any

import torch

from .modeling_optimus import OptimusModel
from .processing_optimus import OptimusProcessor


class OptimusLatentSpace:
    """An `OptimusModel` with its `OptimusProcessor`, working on text. Posterior means stand for sentences, as in the
    original's `run_latent_generation.py`; decoding is `generate()` from `<BOS>` (greedy unless told otherwise)."""

    def __init__(self, model: OptimusModel, processor: OptimusProcessor, max_new_tokens: int = 32,
                 **generation_kwargs: Any) -> None:
        # the decoder's positions bound the output; the latent memory slot takes position 0
        limit = model.config.max_decoder_tokens
        if max_new_tokens > limit:
            raise ValueError(f"max_new_tokens {max_new_tokens} exceeds what the decoder's "
                             f"{model.config.decoder.max_position_embeddings} positions allow ({limit})")
        self.model = model.eval()
        self.processor = processor
        self.generation_kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False, **generation_kwargs}

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, trust_remote_code: bool = False, revision: str | None = None,
                        token: str | bool | None = None, cache_dir: str | None = None, local_files_only: bool = False,
                        dtype: "str | torch.dtype | None" = None, device_map: str | dict | torch.device | None = None,
                        model_kwargs: dict[str, Any] | None = None, quantize: str | None = None,
                        max_new_tokens: int = 32, **generation_kwargs: Any) -> "OptimusLatentSpace":
        """The model and processor of `name_or_path` (a folder or Hub repo id), split as `transformers.pipeline`
        splits its keywords: where to find them (`trust_remote_code`, `revision`, `token`, `cache_dir`,
        `local_files_only`) goes to both `from_pretrained` calls; `dtype`, `device_map` and any other model keyword
        in `model_kwargs` to the model's; `quantize="int8"` (or "nf4", with bitsandbytes) puts int8 (or
        4-bit) weights in the decoder (`quantization.quantize_decoder`, for decoding on the CPU); `max_new_tokens`
        and the rest (`num_beams`, `do_sample`, `top_p`, ...) are the generation settings of every decoding."""
        from transformers import AutoModel, AutoProcessor

        hub = {"trust_remote_code": trust_remote_code, "revision": revision, "token": token, "cache_dir": cache_dir,
               "local_files_only": local_files_only}
        model_settings = {name: value for name, value in (("dtype", dtype), ("device_map", device_map))
                          if value is not None}
        model = AutoModel.from_pretrained(name_or_path, **hub, **model_settings, **(model_kwargs or {}))
        if quantize is not None:
            from .quantization import quantize_decoder

            quantize_decoder(model, quantize)
        processor = AutoProcessor.from_pretrained(name_or_path, **hub)
        return cls(model, processor, max_new_tokens=max_new_tokens, **generation_kwargs)

    @torch.no_grad()
    def encode(self, texts: str | Iterable[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, logvar) of each text's posterior; a text longer than the encoder's positions is truncated, as a
        tokenizer's `model_max_length` would."""
        batch = self.processor([texts] if isinstance(texts, str) else list(texts),
                               max_length=self.model.config.max_encoder_tokens)
        mean, logvar, _ = self.model.encode(batch["input_ids"].to(self.model.device),
                                            batch["attention_mask"].to(self.model.device))
        return mean, logvar

    @torch.no_grad()
    def decode(self, latent_z: torch.Tensor, **generation_kwargs: Any) -> list[str]:
        """One text per latent row."""
        tokens = self.model.generate(latent_z=latent_z, **{**self.generation_kwargs, **generation_kwargs})
        return self.processor.batch_decode(tokens)

    def reconstruct(self, texts: str | Iterable[str], **generation_kwargs: Any) -> list[str]:
        return self.decode(self.encode(texts)[0], **generation_kwargs)

    def sample(self, num_samples: int, generator: torch.Generator | None = None, **generation_kwargs: Any,
               ) -> list[str]:
        """Decode latents drawn from the prior."""
        return self.decode(self.model.sample_prior(num_samples, generator), **generation_kwargs)

    def interpolate(self, text_start: str, text_end: str, num_steps: int = 5, **generation_kwargs: Any,
                    ) -> list[tuple[float, str]]:
        """[(t, text)] along (1 - t) z_start + t z_end."""
        mean, _ = self.encode([text_start, text_end])
        latents = self.model.interpolate(mean[0], mean[1], num_steps)
        weights = torch.linspace(0, 1, num_steps).tolist()
        return list(zip(weights, self.decode(latents, **generation_kwargs), strict=True))

    def interpolate_at(self, text_start: str, text_end: str, t: float, **generation_kwargs: Any) -> str:
        """The text decoded from (1 - t) z_start + t z_end: one point of `interpolate`'s line, at any t."""
        mean, _ = self.encode([text_start, text_end])
        return self.decode((1 - t) * mean[0:1] + t * mean[1:2], **generation_kwargs)[0]

    def analogy(self, text_a: str, text_b: str, text_c: str, degree: float = 1.0, **generation_kwargs: Any) -> str:
        """a : b :: c : ?, decoded from z_c + (z_b - z_a) * degree."""
        mean, _ = self.encode([text_a, text_b, text_c])
        latent = self.model.analogy(mean[0:1], mean[1:2], mean[2:3], degree)
        return self.decode(latent, **generation_kwargs)[0]

    def latent_attributes(self, source: str | None = None) -> dict:
        """The attribute operators of `source` (a folder or Hub repo id; default the model's own folder), checked
        against this model."""
        from .attributes import load_latent_attributes

        return load_latent_attributes(source or self.model.name_or_path, self.model)

    def guided_sample(self, attributes: dict[str, str], num_samples: int, operators: dict | None = None,
                      generator: torch.Generator | None = None, steps: int | None = None, strength: float = 1.0,
                      method: str | None = None, temperature: float | None = None, **generation_kwargs: Any,
                      ) -> list[str]:
        """Decode latents drawn from p(z | attributes) (`attributes`: `{name: label}` of the operators, by
        default those stored in the model's folder); `method`: `gaussian` (the default for classifier operators;
        draws from the labels' Gaussians, each with a random label of every other operator, `temperature` the
        share of their spread), `flow` (LatentOps' ODE sampler,
        `steps` and `strength` its settings) or `conditional` (the default for the label embeddings of a model
        fine-tuned with them, `conditional`: a drawn z plus the labels' embeddings, `temperature` the share of the
        drawn z's spread)."""
        from .attributes import FLOW_STEPS, check_method, default_method, guided_latents

        if method is not None:
            check_method(method)
        operators = self.latent_attributes() if operators is None else operators
        latents = guided_latents(operators, attributes, num_samples, self.model.config.latent_size, generator,
                                 steps or FLOW_STEPS, strength, self.model.device,
                                 method or default_method(operators, attributes), temperature)
        return self.decode(latents.to(self.model.dtype), **generation_kwargs)

    def edit(self, texts: str | Iterable[str], attributes: dict[str, str], operators: dict | None = None,
             steps: int | None = None, strength: float = 1.0, method: str | None = None, keep_others: bool = False,
             **generation_kwargs: Any) -> list[str]:
        """Move each text's posterior mean to the requested attribute labels and decode it; `method`: `gaussian`
        (the default for classifier operators; the latent arithmetic of label means; with `keep_others`, not along
        the other operators' label means), `flow` (LatentOps' ODE, the other operators' attributes held as they
        are) or `conditional` (the default for label embeddings; the posterior mean plus the target labels'
        embeddings, the original's transfer)."""
        from .attributes import (
            CONDITIONAL,
            FLOW_STEPS,
            arithmetic_edited_latents,
            check_method,
            conditional_edited_latents,
            default_method,
            edited_latents,
            operators_of_method,
            resolve_request,
        )

        if method is not None:
            check_method(method)
        operators = self.latent_attributes() if operators is None else operators
        method = method or default_method(operators, attributes)
        operators = operators_of_method(operators, attributes, method)
        if method == CONDITIONAL:
            latents = conditional_edited_latents(resolve_request(operators, attributes), self.encode(texts)[0])
        elif method == "gaussian":
            latents = arithmetic_edited_latents(operators, self.encode(texts)[0], attributes, keep_others)
        else:
            latents, _ = edited_latents(operators, self.encode(texts)[0], attributes, steps or FLOW_STEPS, strength)
        return self.decode(latents.to(self.model.dtype), **generation_kwargs)


__all__ = ["OptimusLatentSpace"]
