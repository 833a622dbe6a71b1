"""ERNIE 2.0's pre-training model against the common model checks (`conformance.py`)."""

import torch
from conformance import ModelConformance

from hf_ext import Ernie2ForPreTraining, Ernie2PreTrainingConfig

BATCH, LENGTH = 2, 8


class TestErnie2ForPreTraining(ModelConformance):
    model_class = Ernie2ForPreTraining
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    # accelerate 1.15 puts the output embeddings (the MLM decoder) in a unit with the input embeddings they are tied
    # to, but the decoder's bias is tied to `cls.predictions.bias`, which stays in the model's unit: FSDP2 refuses a
    # parameter shared by two units
    known_failures = {"test_accelerate_fsdp2_plan_at_world_size_8": "accelerate's FSDP2 plan splits the MLM decoder's "
                                                                    "bias from the prediction bias it is tied to"}

    def config(self, **overrides):
        values = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
                      max_position_embeddings=40, max_reorder_segments=3)
        return Ernie2PreTrainingConfig(**{**values, **overrides})

    def inputs(self, config, labels=False):
        generator = torch.Generator().manual_seed(0)
        attention_mask = torch.tensor([[1] * LENGTH, [1] * (LENGTH - 3) + [0] * 3])
        inputs = {"input_ids": torch.randint(5, config.vocab_size, (BATCH, LENGTH), generator=generator)
                  * attention_mask,
                  "attention_mask": attention_mask,
                  "token_type_ids": torch.zeros(BATCH, LENGTH, dtype=torch.long),
                  # a knowledge-masking row and a sentence-distance row
                  "task_type_ids": torch.tensor([[config.task_ids["knowledge_masking"]] * LENGTH,
                                                 [config.task_ids["sentence_distance"]] * LENGTH])}
        if labels:
            masked = torch.full((BATCH, LENGTH), -100)
            masked[0, [1, 4]] = torch.tensor([7, 9])
            inputs["knowledge_masking_labels"] = masked
            inputs["sentence_distance_labels"] = torch.tensor([-100, 2])
        return inputs

    def output_shapes(self, config, inputs, outputs, kind):
        if kind == "hidden_states":
            return {"hidden_states": [(BATCH, LENGTH, config.hidden_size)] * (config.num_hidden_layers + 1)}
        return {"attentions": [(BATCH, config.num_attention_heads, LENGTH, LENGTH)] * config.num_hidden_layers}
