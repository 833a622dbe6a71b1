#!/usr/bin/env python
"""One MT-DNN training step with SMART adversarial training against the same step without it (BERT-base, batch
16 x 128 sentence pairs, MNLI head), in training mode with dropout: forward, backward, AdamW update.

Both steps run `MTDNNTrainer.compute_loss` on the same model and batch; the SMART one with the original's defaults
(`SmartSettings()`: one ascent step, `--adv-k 1`), so it adds the embedding pass, two perturbed passes and the
noise's gradient. The original's SMART costs about 2x-3x a plain step; the ratio here is what hf-ext's costs. Target:
at most the original's upper end (<= 3x).
On a machine shared with other work, `--threads 1` gives steadier timings.
"""

import tempfile

import torch
from timing import benchmark_parser, finish, record, report_ratio, setup, time_interleaved, trainer_step
from transformers import BertConfig

from hf_ext.models.mtdnn import MTDNNConfig, MTDNNModel
from hf_ext.models.mtdnn.smart import SmartSettings
from hf_ext.models.mtdnn.training import MTDNNTrainer
from hf_ext.trainer import training_arguments


def main(argv=None):
    parser = benchmark_parser(__doc__.splitlines()[1])
    parser.add_argument("--batch-size", type=int, default=16, help="sentence pairs per step (default 16)")
    parser.add_argument("--length", type=int, default=128, help="tokens per pair (default 128)")
    parser.add_argument("--adv-k", type=int, default=1, help="SMART ascent steps (default 1, the original's)")
    args = parser.parse_args(argv)
    repeats = setup(args, default_repeats=7, quick_repeats=2)
    encoder = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                         vocab_size=1000) if args.quick else BertConfig()  # BERT-base
    torch.manual_seed(0)
    model = MTDNNModel(MTDNNConfig(encoder=encoder, tasks=[{"name": "mnli", "type": "classification",
                                                            "num_labels": 3}])).train()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, encoder.vocab_size, (args.batch_size, args.length), generator=generator)
    batch = {"input_ids": input_ids,
             "token_type_ids": (torch.arange(args.length) >= args.length // 2).long().expand(args.batch_size, -1)
             .contiguous(),
             "attention_mask": torch.ones_like(input_ids), "task": torch.zeros(args.batch_size, dtype=torch.long),
             "labels": torch.randint(0, 3, (args.batch_size,), generator=generator)}
    parameters = sum(p.numel() for p in model.parameters())
    print(f"encoder: {encoder.num_hidden_layers} layers, width {encoder.hidden_size}; batch {args.batch_size} x "
          f"{args.length} tokens; {parameters / 1e6:.1f}M parameters; SMART adv_k {args.adv_k}")
    record("model", {"encoder_layers": encoder.num_hidden_layers, "width": encoder.hidden_size,
                     "parameters": parameters, "smart_adv_k": args.adv_k})

    with tempfile.TemporaryDirectory() as scratch:
        arguments = training_arguments(scratch, use_cpu=True, learning_rate=1e-5)
        trainers = {
            "step with SMART": MTDNNTrainer(model=model, args=arguments, smart=SmartSettings(k=args.adv_k)),
            "plain step": MTDNNTrainer(model=model, args=arguments),
        }

        for trainer in trainers.values():
            trainer.create_optimizer()
        seconds = time_interleaved({name: trainer_step(trainer, batch) for name, trainer in trainers.items()},
                                   repeats, section=f"training step, batch {args.batch_size} x {args.length}")
    smart, plain = seconds.values()
    report_ratio("training step time, SMART / plain", smart, plain, 3.0)
    finish()


if __name__ == "__main__":
    main()
