#!/usr/bin/env python
"""Forward time of a Universal Transformer encoder with ACT against the same weights at fixed depth.

The fixed-depth model takes `act_max_steps` steps for every position. The ACT model shares its weights (plus the
halting unit) and the regime is forced through the halting unit's bias, searched so that the mean number of steps is
at most 30% of the maximum:
- mixed: the halting weights vary per position, so positions halt at different steps and a few run long; the loop
  keeps going while they do, so this measures what halted positions cost (`act_halted_state="frozen"`: only their keys
  and values are computed);
- uniform: zero halting weights, every position halts at the same early step; this measures that the loop stops.
The same mixed regime with `act_halted_state="transformed"` (tensor2tensor's code: every position is transformed at
every step while any runs) is timed for comparison. Target: ACT at most 0.5x the fixed-depth time.
On a machine shared with other work, `--threads 1` gives steadier timings.
"""

import copy
import statistics

import torch

from hf_ext import UniversalTransformerConfig, UniversalTransformerModel
from timing import benchmark_parser, report_ratio, setup, time_interleaved

MAX_STEPS = 12
STEP_FRACTION = 0.30


def build(quick):
    width, heads, inner = (64, 4, 256) if quick else (512, 8, 2048)
    config = UniversalTransformerConfig(
        vocab_size=1000, hidden_size=width, num_attention_heads=heads, intermediate_size=inner, num_steps=MAX_STEPS,
        act_max_steps=MAX_STEPS, use_act=True, hidden_dropout_prob=0.0, input_dropout=0.0, attention_dropout=0.0,
        relu_dropout=0.0)
    torch.manual_seed(0)
    act = UniversalTransformerModel(config).eval()
    fixed_config = copy.deepcopy(config)
    fixed_config.use_act = False
    fixed = UniversalTransformerModel(fixed_config).eval()
    # the same weights; the fixed-depth model has no halting unit and as many step embeddings (num_steps = max)
    fixed.load_state_dict({k: v for k, v in act.state_dict().items() if ".halting." not in k})
    return act, fixed


def mean_steps(model, inputs):
    with torch.no_grad():
        return model(inputs_embeds=inputs).n_updates


def force_regime(model, inputs, weight_scale):
    """Set the halting weights (random of `weight_scale`, or zero) and search the bias for the largest mean number
    of steps that stays within STEP_FRACTION of the maximum."""
    halting = model.encoder.halting
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        halting.weight.copy_(torch.randn(halting.weight.shape, generator=generator) * weight_scale)
    low, high = -6.0, 12.0  # mean steps fall as the bias grows
    for _ in range(16):
        middle = (low + high) / 2
        with torch.no_grad():
            halting.bias.fill_(middle)
        if mean_steps(model, inputs).mean() <= STEP_FRACTION * MAX_STEPS:
            high = middle
        else:
            low = middle
    with torch.no_grad():
        halting.bias.fill_(high)
    steps = mean_steps(model, inputs)
    counts = torch.bincount(steps.flatten().long(), minlength=MAX_STEPS + 1)[1:].tolist()
    print(f"  bias {high:+.3f}: mean steps {steps.mean():.2f} of {MAX_STEPS} ({steps.mean() / MAX_STEPS:.0%}), "
          f"loop length {int(steps.max())}; positions per step count 1..{MAX_STEPS}: {counts}")
    return steps.mean().item() / MAX_STEPS


def main():
    args = benchmark_parser(__doc__.splitlines()[1]).parse_args()
    repeats = setup(args, default_repeats=3, quick_repeats=2)
    act, fixed = build(args.quick)
    batch, length = (2, 32) if args.quick else (4, 256)
    inputs = torch.randn(batch, length, act.config.hidden_size, generator=torch.Generator().manual_seed(2))
    print(f"encoder {act.config.hidden_size} wide, {act.config.num_attention_heads} heads, transition "
          f"{act.config.intermediate_size}; batch {batch} x {length} positions; at most {MAX_STEPS} steps")

    def forward(model):
        def run():
            with torch.no_grad():
                model(inputs_embeds=inputs)
        return run

    results = {}
    for regime, weight_scale in (("mixed", 2.0 / act.config.hidden_size**0.5), ("uniform", 0.0)):
        print(f"regime '{regime}':")
        fraction = force_regime(act, inputs, weight_scale)
        candidates = {"fixed depth": forward(fixed), "ACT (frozen halted positions)": forward(act)}
        if regime == "mixed":
            transformed = copy.deepcopy(act)
            transformed.config.act_halted_state = "transformed"
            candidates["ACT (halted positions transformed, t2t code)"] = forward(transformed)
        times = time_interleaved(candidates, repeats)
        results[regime] = (fraction, times)
    met = True
    for regime, (fraction, times) in results.items():
        met &= report_ratio(f"ACT/fixed forward time, {regime} halting, mean steps {fraction:.0%} of max",
                            times["ACT (frozen halted positions)"], times["fixed depth"], 0.5)
    mixed = results["mixed"][1]
    ratios = [t / f for t, f in zip(mixed["ACT (halted positions transformed, t2t code)"], mixed["fixed depth"])]
    print(f"(for comparison: t2t-code ACT/fixed forward time, mixed halting: {statistics.median(ratios):.2f}x)")
    return 0 if met or args.quick else 1


if __name__ == "__main__":
    raise SystemExit(main())
