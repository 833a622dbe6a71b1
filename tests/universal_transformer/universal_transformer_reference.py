"""A plain re-statement of tensor2tensor's Universal Transformer encoder step and ACT loop, written from the algorithm
(docs and the original code), not from hf_ext's modules: explicit matmuls, softmax and convolutions over a dict of
named weights, and the ACT bookkeeping line by line. Tests compare `UniversalTransformerModel` against it.

Weights are given by role, so the same reference checks models and original checkpoints whatever their key names:
`embedding_proj` (optional), `q`, `k`, `v`, `o`, `attention_norm_weight/bias`, `transition_norm_weight/bias`,
`halting_weight/bias`, `final_norm_weight/bias` (optional), and the transition's weights: fc `fc1_weight/bias`,
`fc2_weight/bias`; conv `conv1_weight/bias`, `conv2_weight/bias`; sepconv `depthwise1`, `pointwise1_weight/bias`,
`depthwise2`, `pointwise2_weight/bias`.
"""

import math

import torch
from torch.nn import functional as F


def sinusoid(length, channels):
    half = channels // 2
    inverse = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(1e4) / max(half - 1, 1)))
    angle = torch.arange(length, dtype=torch.float64)[:, None] * inverse[None]
    return torch.cat([angle.sin(), angle.cos(), torch.zeros(length, channels % 2, dtype=torch.float64)], 1).float()


def norm(x, weight, bias, eps, unbiased_std):
    mean = x.mean(-1, keepdim=True)
    if unbiased_std:
        return weight * (x - mean) / (x.std(-1, keepdim=True) + eps) + bias
    return (x - mean) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps) * weight + bias


def attention(x, w, heads, key_allowed):
    """Multi-head self-attention without biases; `key_allowed` [batch, length] or None."""
    batch, length, _ = x.shape

    def split(t):
        return t.view(batch, length, heads, -1).transpose(1, 2)

    q, k, v = split(x @ w["q"].T), split(x @ w["k"].T), split(x @ w["v"].T)
    logits = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
    if key_allowed is not None:
        logits = logits.masked_fill(~key_allowed[:, None, None, :], float("-inf"))
    context = torch.softmax(logits, -1) @ v
    return context.transpose(1, 2).reshape(batch, length, -1) @ w["o"].T


def conv_same(x, weight, bias=None, groups=1):
    width = weight.shape[-1]
    padded = F.pad(x.transpose(1, 2), (width // 2, (width - 1) // 2))
    return F.conv1d(padded, weight, bias, groups=groups).transpose(1, 2)


def transition(x, w, kind, keep):
    """fc: dense+ReLU -> dense; conv (the PyTorch re-implementation): conv3+ReLU -> conv3+ReLU; sepconv:
    separable conv3 + ReLU -> separable conv5. Padding is zeroed before convolutions (`keep` [batch, length, 1])."""
    if kind == "fc":
        return F.relu(x @ w["fc1_weight"].T + w["fc1_bias"]) @ w["fc2_weight"].T + w["fc2_bias"]
    if kind == "conv":
        hidden = F.relu(conv_same(x * keep, w["conv1_weight"], w["conv1_bias"]))
        return F.relu(conv_same(hidden * keep, w["conv2_weight"], w["conv2_bias"]))
    hidden = conv_same(x * keep, w["depthwise1"], groups=x.shape[-1])
    hidden = F.relu(hidden @ w["pointwise1_weight"].T + w["pointwise1_bias"])
    hidden = conv_same(hidden * keep, w["depthwise2"], groups=hidden.shape[-1])
    return hidden @ w["pointwise2_weight"].T + w["pointwise2_bias"]


def encoder(inputs_embeds, w, *, heads, kind, unbiased_std=False, eps=1e-6, steps_signal, use_act=True,
            threshold=0.99, max_steps=None, halted="transformed", attention_mask=None):
    """Returns (output, n_updates, remainders). `steps_signal` [steps, hidden] is added before each step;
    `halted="frozen"`: halted positions keep their state and pass their step input through attention unchanged."""
    x = inputs_embeds @ w["embedding_proj"].T if "embedding_proj" in w else inputs_embeds
    batch, length, hidden = x.shape
    allowed = attention_mask.bool() if attention_mask is not None else None
    keep = allowed.float()[..., None] if allowed is not None else torch.ones(batch, length, 1)
    position = sinusoid(length, hidden)
    max_steps = max_steps or steps_signal.shape[0]

    def step_fn(step_input, running):
        normed = norm(step_input, w["attention_norm_weight"], w["attention_norm_bias"], eps, unbiased_std)
        h = step_input + attention(normed, w, heads, allowed)
        if running is not None:
            h = torch.where(running[..., None], h, step_input)
        normed = norm(h, w["transition_norm_weight"], w["transition_norm_bias"], eps, unbiased_std)
        return h + transition(normed, w, kind, keep)

    n_updates = remainders = None
    if not use_act:
        for step in range(max_steps):
            x = step_fn(x + position + steps_signal[step], None)
        out = x
    else:
        hp = torch.zeros(batch, length) if allowed is None else (~allowed).float()
        remainders, n_updates = torch.zeros(batch, length), torch.zeros(batch, length)
        out, state, step = torch.zeros_like(x), x, 0
        while bool(((hp < threshold) & (n_updates < max_steps)).any()):
            step_input = state + position + steps_signal[step]
            p = torch.sigmoid(step_input @ w["halting_weight"].T + w["halting_bias"]).squeeze(-1)
            running = (hp < 1.0).float()
            new_halted = (hp + p * running > threshold).float() * running
            still = (hp + p * running <= threshold).float() * running
            hp = hp + p * still
            remainders = remainders + new_halted * (1 - hp)
            hp = hp + new_halted * remainders
            n_updates = n_updates + still + new_halted
            weight = (p * still + new_halted * remainders)[..., None]
            if halted == "frozen":
                mask = running.bool()
                state = torch.where(mask[..., None], step_fn(step_input, mask), state)
            else:
                state = step_fn(step_input, None)
            out = state * weight + out * (1 - weight)
            step += 1
    if "final_norm_weight" in w:
        out = norm(out, w["final_norm_weight"], w["final_norm_bias"], eps, unbiased_std)
    return out, n_updates, remainders


def model_weights(model):
    """The roles of a `UniversalTransformerModel` (or a head model's body)."""
    stack = model.encoder
    layer = stack.layer
    w = {"q": layer.self_attn.q_proj.weight, "k": layer.self_attn.k_proj.weight, "v": layer.self_attn.v_proj.weight,
         "o": layer.self_attn.o_proj.weight,
         "attention_norm_weight": layer.self_attn_layer_norm.weight,
         "attention_norm_bias": layer.self_attn_layer_norm.bias,
         "transition_norm_weight": layer.transition_layer_norm.weight,
         "transition_norm_bias": layer.transition_layer_norm.bias}
    if stack.embedding_proj is not None:
        w["embedding_proj"] = stack.embedding_proj.weight
    if stack.halting is not None:
        w["halting_weight"], w["halting_bias"] = stack.halting.weight, stack.halting.bias
    if stack.final_layer_norm is not None:
        w["final_norm_weight"], w["final_norm_bias"] = stack.final_layer_norm.weight, stack.final_layer_norm.bias
    t = layer.transition
    for name in ("fc1", "fc2", "conv1", "conv2", "pointwise1", "pointwise2"):
        if hasattr(t, name):
            w[f"{name}_weight"], w[f"{name}_bias"] = getattr(t, name).weight, getattr(t, name).bias
    for name in ("depthwise1", "depthwise2"):
        if hasattr(t, name):
            w[name] = getattr(t, name).weight
    return {k: v.detach() for k, v in w.items()}
