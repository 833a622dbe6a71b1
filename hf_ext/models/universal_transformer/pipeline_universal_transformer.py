"""The Universal Transformer's text-to-text pipeline (transformers 5 has no `text2text-generation` pipeline): a text,
or a list of texts, through the seq2seq model's `generate()`, as `pipeline("universal-transformer-text2text",
model=folder)` or, where hf-ext is not installed, `pipeline(model=folder, trust_remote_code=True)` (the folder's config
names this file in `custom_pipelines`).

    >>> generate = pipeline(model="path/to/folder", trust_remote_code=True)
    >>> generate("12+3")
    [{"generated_text": "15"}]
    >>> generate(["12+3", "7+8"], batch_size=8, max_new_tokens=6)   # one record per text
    [{"generated_text": "15"}, {"generated_text": "51"}]
    >>> generate("12+3", num_beams=4, num_return_sequences=2)   # one record per returned sequence
    [{"generated_text": "15"}, {"generated_text": "16"}]

Outputs are those of transformers 4's `text2text-generation` pipeline: a list of `{"generated_text": ...}` per text
(the output ids decoded without special tokens), `{"generated_token_ids": ...}` with `return_tensors=True`; a list of
texts gives a list of those lists, flattened where each holds one record. Every other keyword is a `generate()`
argument (`max_new_tokens`, `num_beams`, `do_sample`, ...), at the call or at `pipeline(...)`; unset ones come from
the model's generation config, as in a direct `model.generate()` call.

Remote code: imports only torch and transformers.
"""

from typing import Any

import torch
from transformers.pipelines.base import Pipeline

PIPELINE_TASK = "universal-transformer-text2text"  # the pipeline's task name (the config's `custom_pipelines`)


class UniversalTransformerText2TextPipeline(Pipeline):
    """Text to text with a `UniversalTransformerForSeq2SeqLM` (see the module's description). `truncation` cuts
    texts to the tokenizer's `model_max_length` (default off: the model has no position limit);
    `return_text`/`return_tensors` choose `generated_text`/`generated_token_ids`; `clean_up_tokenization_spaces` goes
    to the tokenizer's `decode`. With `batch_size`, texts share `generate()` calls (padded on the tokenizer's side;
    the attention mask keeps padding out of the encoder)."""

    _pipeline_calls_generate = True  # generate() keywords at pipeline(...) apply to every call
    _load_tokenizer = True  # type: ignore[assignment]  # a tokenizer is needed (the base class: None, optional)

    def _sanitize_parameters(self, truncation: bool | None = None, return_text: bool | None = None,
                             return_tensors: bool | None = None, clean_up_tokenization_spaces: bool | None = None,
                             **generate_kwargs: Any):
        preprocess = {} if truncation is None else {"truncation": truncation}
        postprocess: dict[str, Any] = {}
        if return_text is not None or return_tensors is not None:
            postprocess["return_text"] = bool(return_text) if return_text is not None else not return_tensors
            postprocess["return_tensors"] = bool(return_tensors)
        if clean_up_tokenization_spaces is not None:
            postprocess["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess, generate_kwargs, postprocess

    def __call__(self, inputs: str | list[str], **kwargs: Any) -> Any:  # type: ignore[override]
        """Records for a text; for a list of texts, a list of them, flattened where each text has one record."""
        if not (isinstance(inputs, str) or isinstance(inputs, list) and all(isinstance(text, str) for text in inputs)):
            raise ValueError(f"a Universal Transformer text-to-text pipeline input is a text or a list of texts, not "
                             f"{type(inputs).__name__}")
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(records) == 1 for records in result):
            return [records[0] for records in result]
        return result

    def preprocess(self, inputs: str, truncation: bool = False) -> dict[str, Any]:  # type: ignore[override]
        assert self.tokenizer is not None  # a "text" pipeline loads the folder's tokenizer
        return dict(self.tokenizer(inputs, truncation=truncation, return_tensors="pt"))

    def _forward(self, model_inputs: dict[str, Any], **generate_kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        prepare = getattr(self, "_prepare_generate_kwargs", None)  # the pipeline's generation settings and defaults
        if prepare is not None:
            generate_kwargs = prepare(generate_kwargs)
        texts = model_inputs["input_ids"].shape[0]
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)  # type: ignore[operator]
        if not isinstance(output_ids, torch.Tensor):  # return_dict_in_generate=True: a generate output
            output_ids = output_ids.sequences
        # rows of one text stay together: [texts, sequences per text, length]
        return {"output_ids": output_ids.reshape(texts, output_ids.shape[0] // texts, *output_ids.shape[1:])}

    def postprocess(self, model_outputs: dict[str, Any], return_text: bool = True,  # type: ignore[override]
                    return_tensors: bool = False, clean_up_tokenization_spaces: bool = False,
                    ) -> list[dict[str, Any]]:
        assert self.tokenizer is not None
        records = []
        for output_ids in model_outputs["output_ids"][0]:
            record: dict[str, Any] = {}
            if return_tensors:
                record["generated_token_ids"] = output_ids
            if return_text:
                record["generated_text"] = self.tokenizer.decode(
                    output_ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces)
            records.append(record)
        return records


__all__ = ["PIPELINE_TASK", "UniversalTransformerText2TextPipeline"]
