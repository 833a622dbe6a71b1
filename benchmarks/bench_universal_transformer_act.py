#!/usr/bin/env python
"""Time of a Universal Transformer encoder with ACT against the same weights at fixed depth, forward and training.

The fixed-depth model takes `act_max_steps` steps for every position. The ACT model shares its weights (plus the
halting unit) and the regime is forced through the halting unit's bias, searched so that the mean number of steps is
at most a set fraction of the maximum:
- mixed (30%): the halting weights vary per position, so positions halt at different steps and a few run all of
  them; the loop keeps going while they do, so this measures what halted positions cost (`act_halted_state="frozen"`:
  they are only read, as keys and values, see `FrozenKeyValues`);
- uniform (25%): zero halting weights, every position halts at the same early step; this measures that the loop
  stops.
The limit of ACT/fixed is the mean fraction of steps: the target is at most 1.2x that fraction, at batch 4 x 256 and
32 x 64, for the forward pass and for a training step (forward and backward). The same mixed regime with
`act_halted_state="transformed"` (tensor2tensor's code: every position is transformed at every step while any runs)
is timed for comparison. `--profile` prints where the time of one mixed-regime ACT forward goes.
On a machine shared with other work, `--threads 1` gives steadier timings.
"""

import copy

import torch
from timing import benchmark_parser, finish, record, report_ratio, setup, time_interleaved

from hf_ext import UniversalTransformerConfig, UniversalTransformerModel

MAX_STEPS = 12
REGIMES = (("mixed", 0.30), ("uniform", 0.25))  # the mean fraction of the steps each is forced to
SHAPES = ((4, 256), (32, 64))
QUICK_SHAPES = ((2, 32),)
LIMIT_FACTOR = 1.2  # the target: ACT/fixed at most this times the mean fraction of steps


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


def force_regime(model, inputs, weight_scale, fraction):
    """Set the halting weights (random of `weight_scale`, or zero) and search the bias for the largest mean number
    of steps that stays within `fraction` of the maximum. Returns the regime reached: the bias, the mean steps and
    their fraction of the maximum, the loop's length and the positions per step count (1 to the maximum)."""
    halting = model.encoder.halting
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        halting.weight.copy_(torch.randn(halting.weight.shape, generator=generator) * weight_scale)
    low, high = -6.0, 12.0  # mean steps fall as the bias grows
    for _ in range(16):
        middle = (low + high) / 2
        with torch.no_grad():
            halting.bias.fill_(middle)
        if mean_steps(model, inputs).mean() <= fraction * MAX_STEPS:
            high = middle
        else:
            low = middle
    with torch.no_grad():
        halting.bias.fill_(high)
    steps = mean_steps(model, inputs)
    counts = torch.bincount(steps.flatten().long(), minlength=MAX_STEPS + 1)[1:].tolist()
    print(f"  bias {high:+.3f}: mean steps {steps.mean():.2f} of {MAX_STEPS} ({steps.mean() / MAX_STEPS:.0%}), "
          f"loop length {int(steps.max())}; positions per step count 1..{MAX_STEPS}: {counts}")
    mean = steps.mean().item()
    return {"bias": high, "mean_steps": mean, "fraction_of_max_steps": mean / MAX_STEPS,
            "loop_length": int(steps.max()), "positions_per_step_count": counts}


def forward(model, inputs):
    def run():
        with torch.no_grad():
            model(inputs_embeds=inputs)
    return run


def training_step(model, inputs):
    """Forward and backward of a loss on the outputs (and the ponder cost, with ACT)."""
    def run():
        model.zero_grad(set_to_none=True)
        output = model(inputs_embeds=inputs)
        loss = output.last_hidden_state.square().mean()
        if output.ponder_cost is not None:
            loss = loss + 0.01 * output.ponder_cost
        loss.backward()
    return run


def profile(model, inputs):
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    forward(model, inputs)()
    with torch_profile(activities=[ProfilerActivity.CPU]) as profiler:
        forward(model, inputs)()
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main():
    parser = benchmark_parser(__doc__.splitlines()[1])
    parser.add_argument("--profile", action="store_true", help="print a profile of one mixed-regime ACT forward")
    args = parser.parse_args()
    repeats = setup(args, default_repeats=3, quick_repeats=2)
    act, fixed = build(args.quick)
    config = act.config
    print(f"encoder {config.hidden_size} wide, {config.num_attention_heads} heads, transition "
          f"{config.intermediate_size}; at most {MAX_STEPS} steps")
    record("encoder", {"width": config.hidden_size, "heads": config.num_attention_heads,
                       "transition": config.intermediate_size, "max_steps": MAX_STEPS})
    met = True
    for batch, length in QUICK_SHAPES if args.quick else SHAPES:
        inputs = torch.randn(batch, length, config.hidden_size, generator=torch.Generator().manual_seed(2))
        for regime, target_fraction in REGIMES:
            print(f"batch {batch} x {length}, regime '{regime}':")
            weight_scale = 2.0 / config.hidden_size**0.5 if regime == "mixed" else 0.0
            halting = force_regime(act, inputs, weight_scale, target_fraction)
            fraction = halting["fraction_of_max_steps"]
            target = round(LIMIT_FACTOR * fraction, 3)
            setting = f"batch {batch} x {length}, {regime} halting"
            record(setting, {**halting, "target": target})
            candidates = {"fixed depth": forward(fixed, inputs), "ACT": forward(act, inputs)}
            if regime == "mixed":
                transformed = copy.deepcopy(act)
                transformed.config.act_halted_state = "transformed"
                candidates["ACT, t2t code"] = forward(transformed, inputs)
            times = time_interleaved(candidates, repeats, section=f"{setting}, forward")
            label = f"ACT/fixed, {setting}, mean steps {fraction:.0%} of max"
            met &= report_ratio(f"{label}, forward", times["ACT"], times["fixed depth"], target)
            if regime == "mixed":
                report_ratio(f"{label}, forward, t2t code (for comparison)", times["ACT, t2t code"],
                             times["fixed depth"])
                if args.profile and (batch, length) == SHAPES[0]:
                    profile(act, inputs)
            times = time_interleaved({"fixed depth": training_step(fixed, inputs),
                                      "ACT": training_step(act, inputs)}, repeats, section=f"{setting}, training step")
            met &= report_ratio(f"{label}, training step", times["ACT"], times["fixed depth"], target)
    finish()
    return 0 if met or args.quick else 1


if __name__ == "__main__":
    raise SystemExit(main())
