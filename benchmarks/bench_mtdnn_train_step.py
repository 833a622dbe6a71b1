#!/usr/bin/env python
"""One multi-task training step of MT-DNN against a single-task step (BERT-base, batch 16 x 128 sentence pairs), in
training mode with dropout: forward, backward, AdamW update.

- multi-task: an `MTDNNModel` with the nine GLUE heads of the original's task definitions (SAN heads on the sentence
  pairs, as the paper), stepped by `MTDNNTrainer.training_step` on an MNLI batch (the batch carries its `task`
  column; the trainer records the per-task loss; the other eight heads sit idle in the model and the optimizer);
- single-task: an `MTDNNModel` with the MNLI head only, stepped by a plain transformers `Trainer.training_step`.

The difference is what multi-task training costs per step. Target: at most 5% overhead (<= 1.05x).
On a machine shared with other work, `--threads 1` gives steadier timings.
"""

import tempfile

import torch
from timing import benchmark_parser, finish, record, report_ratio, setup, time_interleaved, trainer_step
from transformers import BertConfig, Trainer, TrainingArguments

from hf_ext.models.mtdnn import MTDNNConfig, MTDNNModel
from hf_ext.models.mtdnn.training import MTDNNTrainer

PAIRS = ("mnli", "mrpc", "qqp", "qnli", "rte", "wnli")  # SAN heads
GLUE = [{"name": "cola", "type": "classification", "num_labels": 2, "data_format": "PremiseOnly"},
        {"name": "sst", "type": "classification", "num_labels": 2, "data_format": "PremiseOnly"},
        {"name": "stsb", "type": "regression", "num_labels": 1}] + [
       {"name": name, "type": "classification", "num_labels": 3 if name == "mnli" else 2, "head": "san"}
       for name in PAIRS]


def build(tasks, quick):
    encoder = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                         vocab_size=1000) if quick else BertConfig()  # BERT-base
    torch.manual_seed(0)
    return MTDNNModel(MTDNNConfig(encoder=encoder, tasks=tasks, default_task="mnli")).train()


def main(argv=None):
    parser = benchmark_parser(__doc__.splitlines()[1])
    parser.add_argument("--batch-size", type=int, default=16, help="sentence pairs per step (default 16)")
    parser.add_argument("--length", type=int, default=128, help="tokens per pair (default 128)")
    args = parser.parse_args(argv)
    repeats = setup(args, default_repeats=7, quick_repeats=2)
    multi = build(GLUE, args.quick)
    single = build([task for task in GLUE if task["name"] == "mnli"], args.quick)
    # the same encoder and MNLI head weights in both models
    single.load_state_dict({k: v for k, v in multi.state_dict().items() if not k.startswith("heads.")
                            or k.startswith("heads.mnli.")})
    config = multi.config.encoder
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, config.vocab_size, (args.batch_size, args.length), generator=generator)
    token_type_ids = (torch.arange(args.length) >= args.length // 2).long().expand(args.batch_size, -1)
    batch = {"input_ids": input_ids, "token_type_ids": token_type_ids.contiguous(),
             "attention_mask": torch.ones_like(input_ids), "labels": torch.randint(0, 3, (args.batch_size,),
                                                                                 generator=generator)}
    sizes = [sum(p.numel() for p in model.parameters()) for model in (multi, single)]
    print(f"encoder: {config.num_hidden_layers} layers, width {config.hidden_size}; batch {args.batch_size} x "
          f"{args.length} tokens; multi-task: {len(GLUE)} heads, {sizes[0] / 1e6:.1f}M parameters; single-task: "
          f"{sizes[1] / 1e6:.1f}M")
    record("model", {"encoder_layers": config.num_hidden_layers, "width": config.hidden_size,
                     "multi_task_heads": len(GLUE), "multi_task_parameters": sizes[0],
                     "single_task_parameters": sizes[1]})

    with tempfile.TemporaryDirectory() as scratch:
        training = TrainingArguments(output_dir=scratch, use_cpu=True, report_to=[], learning_rate=1e-5)
        trainers = {
            "multi-task step (MTDNNTrainer, 9 heads)": (MTDNNTrainer(model=multi, args=training),
                                                        {**batch, "task": torch.full((args.batch_size,),
                                                                                     multi.config.task_index("mnli"))}),
            "single-task step (Trainer, 1 head)": (Trainer(model=single, args=training), batch),
        }

        for trainer, _ in trainers.values():
            trainer.create_optimizer()
        seconds = time_interleaved({name: trainer_step(*pair) for name, pair in trainers.items()}, repeats,
                                   section=f"training step, batch {args.batch_size} x {args.length}")
    multi_task, single_task = seconds.values()
    report_ratio("training step time, multi-task / single-task", multi_task, single_task, 1.05)
    finish()


if __name__ == "__main__":
    main()
