"""`hf-ext demo`: the whole Optimus path on material the package ships, with nothing to download.

1. write an Optimus checkpoint in the original on-disk format (tokenizers trained on the bundled sentences, freshly
   initialised weights), 2. convert it, 3. lay the converted folder into a local Hub cache and load it back with
   `AutoModel.from_pretrained("hf-ext/optimus-demo")`, 4. fine-tune it with `Trainer` on the bundled sentences,
   5. print reconstructions and an interpolation (and plot the training curves when matplotlib is there).
"""

import argparse
import shutil
from pathlib import Path

DEMO_REPO_ID = "hf-ext/optimus-demo"
MARKER = ".hf-ext-demo"


def register(commands):
    parser = commands.add_parser("demo", help="run the Optimus demo end to end on bundled data", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("hf-ext-demo"),
                        help="folder for everything the demo writes (default ./hf-ext-demo, replaced on each run)")
    parser.add_argument("--max-steps", type=int, default=300, help="fine-tuning steps (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.set_defaults(handler=run_demo)


def run_demo(args):
    import torch
    from datasets import Dataset
    from transformers import AutoModel, AutoProcessor

    from ..conversion.optimus import convert_optimus_checkpoint
    from ..errors import HfExtError
    from ..export import log
    from ..hub import install_into_hub_cache
    from ..models.optimus import OptimusLatentSpace
    from ..samples import bundled_sentences, write_sample_checkpoint
    from ..training import finetune_optimus

    if args.max_steps < 1:
        raise HfExtError("--max-steps must be at least 1")
    workdir = args.workdir
    if workdir.exists():
        if not (workdir / MARKER).exists():
            raise HfExtError(f"{workdir} exists and was not written by hf-ext demo; choose another --workdir")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / MARKER).touch()
    torch.manual_seed(args.seed)
    sentences = bundled_sentences()

    print(f"1. writing an original-format Optimus checkpoint to {workdir / 'original'}")
    write_sample_checkpoint(workdir / "original", seed=args.seed, latent_size=16, hidden_size=64, num_layers=2,
                            num_heads=4, weight_scale=None, beta=0.5, dim_target_kl=3.0, length_weighted_loss=False)
    print(f"2. converting it: hf-ext convert optimus {workdir / 'original'} {workdir / 'converted'}")
    convert_optimus_checkpoint(workdir / "original", workdir / "converted")

    hub_cache = workdir / "hub"
    install_into_hub_cache(workdir / "converted", DEMO_REPO_ID, hub_cache)
    print(f"3. loading AutoModel.from_pretrained({DEMO_REPO_ID!r}) from the local Hub cache {hub_cache}")
    model = AutoModel.from_pretrained(DEMO_REPO_ID, cache_dir=hub_cache, local_files_only=True)
    processor = AutoProcessor.from_pretrained(DEMO_REPO_ID, cache_dir=hub_cache, local_files_only=True)
    print(f"   {type(model).__name__}: {model.num_parameters():,} parameters, latent size {model.config.latent_size}")

    dataset = Dataset.from_dict({"text": sentences})
    print(f"4. fine-tuning with Trainer for {args.max_steps} steps on {len(sentences)} bundled sentences "
          "(cyclical KL schedule, free bits)")
    log("   (training logs follow as JSON lines)")
    trainer = finetune_optimus(model, processor, dataset, workdir / "trainer", max_steps=args.max_steps,
                               batch_size=8, learning_rate=2e-3, ratio_zero=0.5, ratio_increase=0.25,
                               logging_steps=max(1, min(50, args.max_steps // 6)), seed=args.seed, log_to_stderr=True, disable_tqdm=True)
    history = [entry for entry in trainer.state.log_history if "loss_rec" in entry]
    print(f"   reconstruction loss {history[0]['loss_rec']:.1f} -> {history[-1]['loss_rec']:.1f}, "
          f"KL {history[-1]['loss_kl']:.2f}, beta {history[-1]['beta']:.2f}")
    model.save_pretrained(workdir / "finetuned")
    processor.save_pretrained(workdir / "finetuned")

    space = OptimusLatentSpace(model, processor, max_new_tokens=24)
    examples = sentences[:4]
    print("5. reconstructions (encode, then greedy decoding from the posterior mean):")
    for source, output in zip(examples, space.reconstruct(examples)):
        print(f"   {source}\n     -> {output}")
    start, end = sentences[0], sentences[4]
    rows = space.interpolate(start, end, num_steps=5)
    print(f"   interpolation from {start!r} to {end!r}:")
    for weight, text in rows:
        print(f"   t={weight:.2f}  {text}")
    try:
        from ..training import plot_interpolation_table, plot_training_curves

        plot_training_curves(trainer.state.log_history, workdir / "training_curves.png", title="hf-ext demo")
        plot_interpolation_table(rows, workdir / "interpolation.png")
        print(f"   plots: {workdir / 'training_curves.png'}, {workdir / 'interpolation.png'}")
    except HfExtError as missing_matplotlib:
        print(f"   (no plots: {missing_matplotlib})")
    print(f"done: the fine-tuned model is in {workdir / 'finetuned'}")
