"""Sentence-level operations in Optimus' latent space: encode, reconstruct, sample, interpolate, analogy."""

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
    def from_pretrained(cls, name_or_path: str, **kwargs: Any) -> "OptimusLatentSpace":
        from transformers import AutoModel, AutoProcessor

        trust = kwargs.pop("trust_remote_code", False)
        # quantize="int8": int8 weights in the decoder (`quantization.quantize_decoder`), for decoding on the CPU
        quantize = kwargs.pop("quantize", None)
        model = AutoModel.from_pretrained(name_or_path, trust_remote_code=trust)
        if quantize is not None:
            from .quantization import quantize_decoder

            quantize_decoder(model, quantize)
        processor = AutoProcessor.from_pretrained(name_or_path, trust_remote_code=trust)
        return cls(model, processor, **kwargs)

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


__all__ = ["OptimusLatentSpace"]
