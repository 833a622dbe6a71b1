"""`hf-ext optimus ...`: latent-space operations on an Optimus model folder or Hub repo id."""

import json

import torch


def register(commands):
    group = commands.add_parser("optimus", help="Optimus latent-space tools and training",
                                description="Work with an Optimus model (a folder or a Hub repo id).")
    tools = group.add_subparsers(dest="tool", required=True, metavar="TOOL")

    def tool(name, help_text, handler):
        parser = tools.add_parser(name, help=help_text, description=help_text)
        parser.add_argument("model", help="model folder or Hub repo id")
        parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default 32)")
        parser.add_argument("--num-beams", type=int, default=1, help="beam search width (default 1: greedy)")
        parser.add_argument("--sample", action="store_true", help="sample instead of greedy/beam decoding")
        parser.add_argument("--top-k", type=int, default=0, help="top-k sampling (with --sample)")
        parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (with --sample)")
        parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (with --sample)")
        parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
        parser.add_argument("--trust-remote-code", action="store_true", help="allow the folder's own model code")
        parser.set_defaults(handler=lambda args: handler(args, _latent_space(args)))
        return parser

    tool("encode", "print each sentence's posterior mean and log-variance as JSON", _encode).add_argument(
        "texts", nargs="+", help="sentences")
    tool("reconstruct", "encode sentences and decode them from their posterior means", _reconstruct).add_argument(
        "texts", nargs="+", help="sentences")
    tool("sample", "decode latents drawn from the prior", _sample).add_argument(
        "--num", type=int, default=5, help="how many sentences (default 5)")
    parser = tool("interpolate", "decode points on the line between two sentences' latents", _interpolate)
    parser.add_argument("start", help="first sentence")
    parser.add_argument("end", help="last sentence")
    parser.add_argument("--steps", type=int, default=5, help="points including both ends (default 5)")
    parser = tool("analogy", "a : b :: c : ? in latent space (z_c + (z_b - z_a) * degree)", _analogy)
    for name in ("a", "b", "c"):
        parser.add_argument(name, help=f"sentence {name}")
    parser.add_argument("--degree", type=float, default=1.0, help="how far to move (default 1.0)")


def _latent_space(args):
    from ..errors import HfExtError
    from ..models.optimus import OptimusLatentSpace

    for name in ("max_new_tokens", "num_beams"):
        if getattr(args, name) < 1:
            raise HfExtError(f"--{name.replace('_', '-')} must be at least 1")
    if getattr(args, "steps", 2) < 2:
        raise HfExtError("--steps must be at least 2")
    if getattr(args, "num", 1) < 1:
        raise HfExtError("--num must be at least 1")
    torch.manual_seed(args.seed)
    generation = {"max_new_tokens": args.max_new_tokens, "num_beams": args.num_beams, "do_sample": args.sample}
    if args.sample:
        generation.update(top_k=args.top_k, top_p=args.top_p, temperature=args.temperature)
    try:
        return OptimusLatentSpace.from_pretrained(args.model, trust_remote_code=args.trust_remote_code or None,
                                                  **generation)
    except OSError as error:
        raise HfExtError(f"cannot load an Optimus model from {args.model}: {str(error).splitlines()[0]}") from None


def _encode(args, space):
    mean, logvar = space.encode(args.texts)
    for text, m, lv in zip(args.texts, mean.tolist(), logvar.tolist()):
        print(json.dumps({"text": text, "mean": m, "logvar": lv}))


def _reconstruct(args, space):
    for text, output in zip(args.texts, space.reconstruct(args.texts)):
        print(f"{text}\t->\t{output}")


def _sample(args, space):
    for text in space.sample(args.num, generator=torch.Generator().manual_seed(args.seed)):
        print(text)


def _interpolate(args, space):
    for weight, text in space.interpolate(args.start, args.end, args.steps):
        print(f"{weight:.2f}\t{text}")


def _analogy(args, space):
    print(space.analogy(args.a, args.b, args.c, args.degree))
