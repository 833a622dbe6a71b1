"""Writes the folders beside this script with hf-ext at commit a4e7e56, before the token embedding moved from the
encoder stack to the model (state-dict key `encoder.embed_tokens.weight`), and the outputs that code computed on
fixed inputs (`outputs.safetensors`). Run once there, from the repository root:

    python tests/universal_transformer/saved_before_shared_embedding/make_folders.py

The copies of the model code that `save_pretrained` wrote beside each folder's weights were then deleted: the tests
load the folders with the current code (test_universal_transformer_model.py) and compare with those outputs."""

from pathlib import Path

import torch
from safetensors.torch import save_file

from hf_ext import (
    UniversalTransformerConfig,
    UniversalTransformerForSeq2SeqLM,
    UniversalTransformerForSequenceClassification,
    UniversalTransformerModel,
)

HERE = Path(__file__).resolve().parent
INPUTS = {"input_ids": torch.tensor([[5, 9, 3, 17, 2], [8, 4, 11, 0, 0]]),
          "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])}
LABELS = torch.tensor([[6, 12, 7], [3, 3, 9]])


def main():
    config = UniversalTransformerConfig(vocab_size=40, hidden_size=16, num_attention_heads=2, intermediate_size=24,
                                        act_max_steps=5, act_halting_bias_init=0.0, num_labels=3)
    outputs = {}
    for name, model_class in (("seq2seq", UniversalTransformerForSeq2SeqLM),
                              ("classification", UniversalTransformerForSequenceClassification),
                              ("encoder", UniversalTransformerModel)):
        torch.manual_seed(0)
        model = model_class(config).eval()
        with torch.no_grad():
            for parameter_name, parameter in model.named_parameters():
                if parameter_name.endswith("halting.weight"):  # positions halt at different steps
                    parameter.normal_(0.0, 0.5)
            if name == "seq2seq":
                result = model(**INPUTS, labels=LABELS)
                outputs.update({f"{name}.logits": result.logits, f"{name}.loss": result.loss})
            elif name == "classification":
                outputs[f"{name}.logits"] = model(**INPUTS).logits
            else:
                outputs[f"{name}.last_hidden_state"] = model(**INPUTS).last_hidden_state
        model.save_pretrained(HERE / name)
    save_file({name: value.contiguous() for name, value in outputs.items()}, HERE / "outputs.safetensors")


if __name__ == "__main__":
    main()
