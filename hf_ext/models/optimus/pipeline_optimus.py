"""Optimus' pipelines, under the two stock task names a user of a sentence VAE tries: `text-generation` (a text back
from its posterior mean, or a text from a given latent or from a prior sample) and `feature-extraction` (a
sentence's posterior mean, its embedding). A folder hf-ext writes maps both tasks to these classes in its config's
`custom_pipelines`, with this file beside the model's code, so they run where hf-ext is not installed:

    >>> generate = pipeline("text-generation", model="path/to/folder", trust_remote_code=True)
    >>> generate("a man is playing a guitar .")                # reconstruction: decoded from the posterior mean
    [{"generated_text": "a man is playing a guitar ."}]
    >>> generate(torch.zeros(2, 32))                            # one text per latent row (a list of floats: one row)
    [{"generated_text": "..."}, {"generated_text": "..."}]
    >>> generate(num_samples=3, seed=0)                         # decoded from three latents drawn from the prior
    >>> embed = pipeline("feature-extraction", model="path/to/folder", trust_remote_code=True)
    >>> embed(["a man is playing a guitar .", "a dog runs ."])  # one posterior mean (latent_size floats) per text

Why two pipelines under stock names rather than one "optimus" task with modes: the stock tasks are what people (and
the Hub, through a card's `pipeline_tag`) ask an Optimus folder for, and without these entries transformers serves
them with its own pipelines, which cannot read this model (`text-generation` fails to load it, `feature-extraction`
returns the first output field, the KL term, as if it were a feature); the two return different things (texts,
vectors), so each is its own class. A folder with two custom tasks needs the task named: `pipeline(model=folder,
trust_remote_code=True)` alone is answered by transformers' "Pick one in text-generation, feature-extraction".
Without `trust_remote_code=True`, transformers refuses both tasks with one line asking for it (never a stock
pipeline's output).

Texts are encoded as `OptimusLatentSpace.encode` does (truncated to the encoder's positions); decoding is
`generate()` from BOS, greedy with at most 32 new tokens unless told otherwise, as `OptimusLatentSpace.decode`.
Every other keyword of the generation pipeline is a `generate()` argument (`max_new_tokens`, `do_sample`,
`num_beams`, ...), at the call or at `pipeline(...)`.

Remote code: imports only torch and transformers.
"""

from typing import Any

import torch
from transformers.pipelines.base import Pipeline

GENERATION_TASK = "text-generation"
FEATURE_TASK = "feature-extraction"
# OptimusLatentSpace's decoding defaults: greedy, at most 32 new tokens
GENERATION_DEFAULTS = {"max_new_tokens": 32, "do_sample": False}


class _OptimusPipeline(Pipeline):
    """What both pipelines share: the folder's `OptimusProcessor` (its encoder and decoder tokenizers) and encoding
    texts to their posterior means."""

    _load_processor = True  # type: ignore[assignment]  # the two tokenizers of the folder's OptimusProcessor
    _load_tokenizer = False  # type: ignore[assignment]

    def _posterior_means(self, texts: str | list[str]) -> torch.Tensor:
        """[texts, latent_size]: `texts` is one text, or the texts of a batch (`batch_size`: the loader collates the
        `{"text": ...}` inputs of several texts into a list)."""
        assert self.processor is not None  # loaded by pipeline(): `_load_processor`
        model = self.model
        batch = self.processor([texts] if isinstance(texts, str) else list(texts),
                               max_length=model.config.max_encoder_tokens)
        mean, _, _ = model.encode(batch["input_ids"].to(model.device),  # type: ignore[operator]
                                  batch["attention_mask"].to(model.device))
        return mean

    def _check_texts(self, inputs: Any, what: str) -> None:
        if not (isinstance(inputs, str) or isinstance(inputs, list) and inputs
                and all(isinstance(text, str) for text in inputs)):
            raise ValueError(f"an Optimus {what} pipeline input is a text or a list of texts, not "
                             f"{type(inputs).__name__}")


class OptimusTextGenerationPipeline(_OptimusPipeline):
    """Texts decoded from Optimus latents (see the module's description): a text or a list of texts (each decoded
    from its posterior mean: a reconstruction), a latent (a tensor of `latent_size` values or of [rows,
    `latent_size`], or a list of floats, or a list of such lists: one text per row), or no input with `num_samples`
    (latents drawn from the N(0, I) prior, with `seed` reproducibly). Each input gives a list of
    `{"generated_text": ...}`; a list of texts gives a list of them, flattened (one record per text). With
    `batch_size`, texts share `encode()` and `generate()` calls."""

    def _sanitize_parameters(self, num_samples: int | None = None, seed: int | None = None,
                             **generate_kwargs: Any):
        preprocess: dict[str, Any] = {}
        if num_samples is not None:
            preprocess["num_samples"] = num_samples
        if seed is not None:
            preprocess["seed"] = seed
        return preprocess, generate_kwargs, {}

    def __call__(self, inputs: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        if inputs is None:
            if kwargs.get("num_samples") is None:
                raise ValueError("an Optimus text-generation pipeline needs an input (a text, a list of texts, a "
                                 "latent) or num_samples=N to decode N samples of the prior")
            return super().__call__({"prior": True}, **kwargs)
        if isinstance(inputs, list) and inputs and not isinstance(inputs[0], str):
            inputs = torch.tensor(inputs, dtype=torch.float32)  # a latent as a list (of lists) of floats
        if isinstance(inputs, torch.Tensor):
            return super().__call__({"latent_z": inputs}, **kwargs)
        self._check_texts(inputs, "text-generation")
        result = super().__call__(inputs, **kwargs)
        return [records[0] for records in result] if isinstance(inputs, list) else result

    def preprocess(self, inputs: Any, num_samples: int | None = None,  # type: ignore[override]
                   seed: int | None = None) -> dict[str, Any]:
        if isinstance(inputs, str):
            return {"text": inputs}
        if "latent_z" in inputs:
            latent_z = inputs["latent_z"]
            latent_size = self.model.config.latent_size
            if latent_z.dim() not in (1, 2) or latent_z.shape[-1] != latent_size:
                raise ValueError(f"an Optimus latent has {latent_size} values (or is [rows, {latent_size}]), not "
                                 f"shape {list(latent_z.shape)}")
            return {"latent_z": latent_z.reshape(-1, latent_size)}
        assert num_samples is not None  # __call__ passes no input only with num_samples
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        return {"latent_z": self.model.sample_prior(num_samples, generator)}  # type: ignore[operator]

    def _forward(self, model_inputs: dict[str, Any],  # type: ignore[override]
                 **generate_kwargs: Any) -> dict[str, Any]:
        model = self.model
        if "text" in model_inputs:
            latent_z = self._posterior_means(model_inputs["text"])
        else:
            latent_z = model_inputs["latent_z"].to(device=model.device, dtype=model.dtype)
        generate_kwargs = {**GENERATION_DEFAULTS, **generate_kwargs}
        tokens = model.generate(latent_z=latent_z, **generate_kwargs)  # type: ignore[operator]
        if not isinstance(tokens, torch.Tensor):  # return_dict_in_generate=True: a generate output
            tokens = tokens.sequences
        return {"tokens": tokens}  # a batch of texts is split back into one row per text

    def postprocess(self, model_outputs: dict[str, Any]) -> list[dict[str, str]]:  # type: ignore[override]
        assert self.processor is not None
        return [{"generated_text": text} for text in self.processor.batch_decode(model_outputs["tokens"])]


class OptimusFeatureExtractionPipeline(_OptimusPipeline):
    """Sentence embeddings: each text's posterior mean (`latent_size` values), as a list of floats, or a tensor with
    `return_tensors=True`; a list of texts gives a list of them. With `batch_size`, texts share `encode()` calls."""

    def _sanitize_parameters(self, return_tensors: bool | None = None):  # type: ignore[override]
        return {}, {}, {} if return_tensors is None else {"return_tensors": return_tensors}

    def __call__(self, inputs: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self._check_texts(inputs, "feature-extraction")
        return super().__call__(inputs, **kwargs)

    def preprocess(self, inputs: str) -> dict[str, Any]:  # type: ignore[override]
        return {"text": inputs}

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        return {"mean": self._posterior_means(model_inputs["text"])}

    def postprocess(self, model_outputs: dict[str, Any],  # type: ignore[override]
                    return_tensors: bool = False) -> torch.Tensor | list[float]:
        mean = model_outputs["mean"][0]  # [1, latent_size]: one text's, also where a batch was split into texts
        return mean if return_tensors else mean.tolist()


__all__ = ["FEATURE_TASK", "GENERATION_TASK", "OptimusFeatureExtractionPipeline", "OptimusTextGenerationPipeline"]
