"""Optimus on the Hub: a converted folder laid into a Hub cache and loaded offline by repo id, the folder loaded as
remote code in a process where hf_ext cannot be imported, and `hf-ext push` / `hf-ext convert --push-to-hub` against
a loopback mock of the Hub, downloaded again into an empty cache."""

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import PROCESS_TIMEOUT, REPO_ROOT
from hub_server import MockHub
from safetensors.torch import load_file, save_file

from hf_ext import OptimusForSequenceClassification, OptimusModel, OptimusProcessor
from hf_ext.checkpoints import safe_torch_load
from hf_ext.cli import main as cli_main
from hf_ext.errors import HfExtError
from hf_ext.hub import install_into_hub_cache, push_folder
from hf_ext.models.optimus.conversion import ARGS_FILE, LEGACY_HUB_IDS, convert_optimus_checkpoint
from hf_ext.models.optimus.samples import write_sample_checkpoint
from hf_ext.sample_text import bundled_sentences

pytestmark = pytest.mark.slow

HF_EXT_SCRIPT = Path(sys.executable).parent / "hf-ext"
DEAD_ENDPOINT = "http://127.0.0.1:9"  # nothing listens: any network access fails at once
MAX_NEW_TOKENS = 6
TEXTS = bundled_sentences()[:3]
SAMPLE_LATENT_SIZE = 12

# Runs in a subprocess: loads each job's source (folder or repo id) through the Auto classes and writes what it
# computed, for the test to compare with the model loaded here. With "isolate", hf_ext cannot be imported (a
# meta-path blocker refuses it before any finder, the editable install's included) and the code comes from the folder.
LOAD_SCRIPT = r'''
import json
import sys

spec = json.loads(sys.argv[1])
if spec["isolate"]:
    class BlockHfExt:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "hf_ext":
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)

    sys.meta_path.insert(0, BlockHfExt())
    try:
        import hf_ext
        sys.exit("hf_ext is importable despite the blocker")
    except ModuleNotFoundError:
        pass
else:
    import hf_ext  # registers Optimus with the Auto classes

import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForSequenceClassification, AutoProcessor

remote = {"trust_remote_code": True} if spec["isolate"] else {}
for job in spec["jobs"]:
    inputs = load_file(job["inputs"])
    model = AutoModel.from_pretrained(job["source"], **remote).eval()
    classifier = AutoModelForSequenceClassification.from_pretrained(job["source"], **remote).eval()
    with torch.no_grad():
        out = model(**inputs)
        generated = model.generate(latent_z=inputs["latent_z"], max_new_tokens=spec["max_new_tokens"],
                                   do_sample=False)
        tensors = {"logits": out.logits, "mean": out.mean, "generated": generated,
                   "classifier_logits": classifier(input_ids=inputs["input_ids"]).logits,
                   **{"classifier." + k: v for k, v in classifier.classifier.state_dict().items()}}
    info = {"modules": [type(model).__module__, type(classifier).__module__]}
    if job.get("texts"):
        processor = AutoProcessor.from_pretrained(job["source"], **remote)
        batch = processor(job["texts"])
        tensors.update(processor_input_ids=batch["input_ids"], processor_labels=batch["labels"])
        info["modules"].append(type(processor).__module__)
        info["decoded"] = processor.batch_decode(batch["labels"])
    if job.get("card"):
        card = ModelCard.load(job["source"])
        info.update(card_data=card.data.to_dict(), card_text=card.text)
    info["hf_ext_modules"] = sorted(name for name in sys.modules if name.split(".")[0] == "hf_ext")
    save_file({k: v.contiguous() for k, v in tensors.items()}, job["out"] + ".safetensors")
    with open(job["out"] + ".json", "w") as handle:
        json.dump(info, handle)
'''


@dataclass
class Case:
    """A converted folder and the inputs both processes run it on."""

    folder: Path
    inputs_file: Path
    texts: list | None = None  # set where the folder has a processor
    reference_logits: torch.Tensor | None = None  # what the original code computed, where known

    @property
    def inputs(self):
        return load_file(str(self.inputs_file))

    @functools.cached_property
    def local(self):
        """The folder's outputs in this process, where hf_ext provides the classes."""
        inputs = self.inputs
        model = OptimusModel.from_pretrained(self.folder).eval()
        with torch.no_grad():
            out = model(**inputs)
            generated = model.generate(latent_z=inputs["latent_z"], max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        assert generated.shape[0] == inputs["latent_z"].shape[0] and generated.shape[1] > 1
        assert (generated[:, 0] == model.config.decoder.bos_token_id).all()
        local = {"logits": out.logits, "mean": out.mean, "generated": generated,
                 "classifier": OptimusForSequenceClassification.from_pretrained(self.folder).eval()}
        if self.texts:
            batch = OptimusProcessor.from_pretrained(self.folder)(self.texts)
            local.update(processor_input_ids=batch["input_ids"], processor_labels=batch["labels"])
        return local


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("optimus_hub")


@pytest.fixture(scope="module")
def fixture_case(work, optimus_tiny, optimus_tiny_converted):
    """The fixture converted (no tokenizer files), run on the reference inputs and latent."""
    reference = load_file(str(optimus_tiny / "reference.safetensors"))
    inputs = {"input_ids": reference["enc_input_ids"], "labels": reference["dec_labels"], "latent_z": reference["z"]}
    save_file(inputs, work / "fixture-inputs.safetensors")
    return Case(optimus_tiny_converted, work / "fixture-inputs.safetensors", reference_logits=reference["dec_logits"])


@pytest.fixture(scope="module")
def sample_case(work):
    """A sample checkpoint of other sizes, with tokenizers, so the folder holds a processor."""
    write_sample_checkpoint(work / "sample-src", seed=7, latent_size=SAMPLE_LATENT_SIZE, hidden_size=48, num_layers=3,
                            num_heads=6)
    folder = work / "optimus-sample"
    convert_optimus_checkpoint(work / "sample-src", folder)
    batch = OptimusProcessor.from_pretrained(folder)(TEXTS)
    latent_z = torch.randn(len(TEXTS), SAMPLE_LATENT_SIZE, generator=torch.Generator().manual_seed(0))
    save_file({"input_ids": batch["input_ids"], "labels": batch["labels"], "latent_z": latent_z},
              work / "sample-inputs.safetensors")
    return Case(folder, work / "sample-inputs.safetensors", TEXTS)


@pytest.fixture(scope="module")
def hub():
    server = MockHub().start()
    yield server
    server.stop()


def subprocess_env(hf_home, **extra):
    """A clean environment: no inherited Hub settings, its own HF_HOME (cache and remote code), and the checkout under
    test as the only PYTHONPATH entry, so that the hf-ext commands and the loads with hf_ext run the code this process
    tests, not whichever hf_ext the environment has installed (an editable install of another checkout)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE_")) and k not in ("PYTHONPATH", "TRANSFORMERS_CACHE")}
    env.update(HF_HOME=str(hf_home), HF_HUB_DISABLE_TELEMETRY="1", TRANSFORMERS_VERBOSITY="error",
               PYTHONPATH=str(REPO_ROOT), **extra)
    return env


def run(*commands, env, cwd):
    """Run independent commands side by side (the machine has two cores); each must succeed. Returns their stdouts."""
    processes = [subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for command in commands]
    try:
        outputs = [process.communicate(timeout=PROCESS_TIMEOUT) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for command, process, (_, stderr) in zip(commands, processes, outputs, strict=True):
        assert process.returncode == 0, f"{command[:3]} failed:\n{stderr[-4000:]}"
    return [stdout for stdout, _ in outputs]


def load_in_subprocess(work, jobs, env, isolate):
    """Run LOAD_SCRIPT from an empty working folder (the checkout is importable through PYTHONPATH only, and hf_ext
    not at all with `isolate`); returns each job's `(tensors, info)`."""
    cwd = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    for index, job in enumerate(jobs):
        job["out"] = str(cwd / f"job{index}")
    spec = {"isolate": isolate, "max_new_tokens": MAX_NEW_TOKENS, "jobs": jobs}
    run([sys.executable, "-c", LOAD_SCRIPT, json.dumps(spec)], env=env, cwd=cwd)
    return [(load_file(job["out"] + ".safetensors"), json.loads(Path(job["out"] + ".json").read_text()))
            for job in jobs]


def load_job(source, case, card=False):
    return {"source": str(source), "inputs": str(case.inputs_file), "texts": case.texts, "card": card}


def assert_matches_local(tensors, info, case):
    """What the subprocess computed equals what the folder's model, loaded here with hf_ext, computes."""
    local = case.local
    classifier = local["classifier"]
    # the classifier head is not in the checkpoint: use the one the subprocess initialised
    classifier.classifier.load_state_dict({k[len("classifier."):]: v for k, v in tensors.items()
                                           if k.startswith("classifier.")})
    with torch.no_grad():
        classifier_logits = classifier(input_ids=case.inputs["input_ids"]).logits
    torch.testing.assert_close(tensors["logits"], local["logits"], atol=1e-5, rtol=0)
    torch.testing.assert_close(tensors["mean"], local["mean"], atol=1e-5, rtol=0)
    torch.testing.assert_close(tensors["classifier_logits"], classifier_logits, atol=1e-5, rtol=0)
    if case.reference_logits is not None:
        torch.testing.assert_close(tensors["logits"], case.reference_logits, atol=1e-5, rtol=0)
    assert torch.equal(tensors["generated"], local["generated"])
    if case.texts:
        assert torch.equal(tensors["processor_input_ids"], local["processor_input_ids"])
        assert torch.equal(tensors["processor_labels"], local["processor_labels"])
        assert info["decoded"] == case.texts  # BOS/EOS/PAD stripped, the byte-level BPE round trip is exact


def folder_files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in Path(folder).rglob("*") if p.is_file()}


@pytest.mark.slow
def test_offline_hub_cache_loads_by_repo_id(work, fixture_case, sample_case):
    """(a) Laid into a Hub cache, both folders load by repo id with HF_HUB_OFFLINE=1 through hf_ext's registration,
    and the fixture reproduces the original's decoder logits."""
    home = work / "home-offline"
    install_into_hub_cache(fixture_case.folder, "some-org/optimus-tiny", home / "hub")
    install_into_hub_cache(sample_case.folder, "some-org/optimus-sample", home / "hub")
    env = subprocess_env(home, HF_HUB_OFFLINE="1", HF_ENDPOINT=DEAD_ENDPOINT)
    jobs = [load_job("some-org/optimus-tiny", fixture_case), load_job("some-org/optimus-sample", sample_case)]
    results = load_in_subprocess(work, jobs, env, isolate=False)
    for (tensors, info), case in zip(results, (fixture_case, sample_case), strict=True):
        assert_matches_local(tensors, info, case)
        assert all(module.startswith("hf_ext.models.optimus.") for module in info["modules"])
    assert len(results[1][1]["modules"]) == 3  # the processor came from the cache too
    # nothing was fetched: the snapshots hold exactly what was installed
    for repo_id, case in (("some-org/optimus-tiny", fixture_case), ("some-org/optimus-sample", sample_case)):
        repo_dir = home / "hub" / ("models--" + repo_id.replace("/", "--"))
        snapshot = repo_dir / "snapshots" / (repo_dir / "refs" / "main").read_text()
        assert folder_files(snapshot) == folder_files(case.folder)


def test_install_into_hub_cache_marks_only_absent_files(tmp_path, sample_case):
    """A reinstall replaces the snapshot and its "does not exist" markers; a file the folder has is never marked."""
    folder = tmp_path / "with-adapter"
    shutil.copytree(sample_case.folder, folder)
    snapshot = install_into_hub_cache(folder, "org/x", tmp_path / "hub")
    absent = snapshot.parent.parent / ".no_exist" / snapshot.name
    assert sorted(p.relative_to(absent).as_posix() for p in absent.rglob("*") if p.is_file()) == \
        ["adapter_config.json", "decoder_tokenizer/config.json"]
    (folder / "adapter_config.json").write_text("{}")
    snapshot = install_into_hub_cache(folder, "org/x", tmp_path / "hub")
    assert (snapshot / "adapter_config.json").read_text() == "{}"
    assert sorted(p.relative_to(absent).as_posix() for p in absent.rglob("*") if p.is_file()) == \
        ["decoder_tokenizer/config.json"]


@pytest.mark.slow
def test_remote_code_without_hf_ext(work, fixture_case, sample_case):
    """(b) With hf_ext blocked, both folders load as remote code: same logits, generation and classifier as in
    this process, the fixture's reference logits, and the processor from the folder's own code."""
    env = subprocess_env(work / "home-remote", HF_HUB_OFFLINE="1", HF_ENDPOINT=DEAD_ENDPOINT)
    jobs = [load_job(fixture_case.folder, fixture_case), load_job(sample_case.folder, sample_case)]
    results = load_in_subprocess(work, jobs, env, isolate=True)
    for (tensors, info), case in zip(results, (fixture_case, sample_case), strict=True):
        assert_matches_local(tensors, info, case)
        assert info["hf_ext_modules"] == []
        assert all(module.startswith("transformers_modules.") for module in info["modules"])
    assert len(results[1][1]["modules"]) == 3 and results[1][1]["modules"][2].endswith(".processing_optimus")


@pytest.mark.slow
def test_push_and_download(work, optimus_tiny, fixture_case, sample_case, hub):
    """(c) `hf-ext push` and `hf-ext convert --push-to-hub` upload every file to the mock Hub; a fresh process with an
    empty cache and no hf_ext downloads both as remote code and reproduces the outputs; the pushed card carries the
    metadata and the source files' sha256."""
    assert HF_EXT_SCRIPT.is_file(), f"the hf-ext console script is not installed beside {sys.executable}"
    env = subprocess_env(work / "home-push", HF_ENDPOINT=hub.endpoint, HF_TOKEN="hf_mock_token")
    out = work / "converted-and-pushed"
    pushed, _ = run([str(HF_EXT_SCRIPT), "push", str(sample_case.folder), "org/name"],
                    [str(HF_EXT_SCRIPT), "convert", "optimus", str(optimus_tiny), str(out),
                     "--reference", str(optimus_tiny / "reference.safetensors"), "--push-to-hub", "org/name2"],
                    env=env, cwd=work)
    assert pushed.strip() == f"{hub.endpoint}/org/name/commit/{hub.repos['org/name'].main}"
    # every file as in the folder, but the card: `push` publishes a card that loads the model by the folder's name
    # loading it by the repo id instead (the folder is not changed)
    local, published = folder_files(sample_case.folder), hub.files("org/name")
    local_card, published_card = local.pop("README.md").decode(), published.pop("README.md").decode()
    assert published == local
    assert "org/name" not in local_card
    for loading in ('from_pretrained("{}"', "hf-ext optimus reconstruct {} "):
        assert loading.format("optimus-sample") in local_card and loading.format("optimus-sample") not in \
            published_card and loading.format("org/name") in published_card, loading
    assert published_card.replace("org/name", "optimus-sample") == local_card  # nothing else changed
    # the converter writes the card for the repo id it pushes to: nothing to change
    assert hub.files("org/name2") == folder_files(out)

    results = load_in_subprocess(
        work, [load_job("org/name", sample_case), load_job("org/name2", fixture_case, card=True)],
        subprocess_env(work / "home-download", HF_ENDPOINT=hub.endpoint), isolate=True)
    for (tensors, info), case in zip(results, (sample_case, fixture_case), strict=True):
        assert_matches_local(tensors, info, case)
        assert info["hf_ext_modules"] == [] and all(m.startswith("transformers_modules.") for m in info["modules"])
    assert hub.unhandled == []

    card = results[1][1]
    args = safe_torch_load(next(optimus_tiny.glob(f"checkpoint-encoder-*/{ARGS_FILE}")), "training args")
    data = card["card_data"]
    assert data["license"] == "mit" and data["library_name"] == "transformers"
    assert data["pipeline_tag"] == "text-generation"
    assert {"hf-ext", "optimus"} <= set(data["tags"])
    assert data["base_model"] == [LEGACY_HUB_IDS.get(name, name) for name in
                                  (args.encoder_model_name_or_path, args.decoder_model_name_or_path)]
    for kind in ("encoder", "decoder"):
        step_dir = max(optimus_tiny.glob(f"checkpoint-{kind}-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
        for file in sorted(p for p in step_dir.iterdir() if p.is_file()):
            digest = hashlib.sha256(file.read_bytes()).hexdigest()
            row = f"| `{step_dir.name}/{file.name}` | {file.stat().st_size} | `{digest}` |"
            assert row in card["card_text"]
    parity = re.search(r"\| dec_logits \| (\S+) \|", card["card_text"])
    assert parity and float(parity.group(1)) <= 1e-5


def test_push_refusals_are_one_line(tmp_path, capsys, hub, sample_case):
    """A folder without config.json, and a push the Hub rejects, fail with one line and leave no repository."""
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "model.safetensors").write_bytes(b"")
    assert cli_main(["push", str(not_a_model), "org/no-config"]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("hf-ext: error: ") and "config.json" in error[0]
    with pytest.raises(HfExtError, match="no config.json"):
        push_folder(not_a_model, "org/no-config", endpoint=hub.endpoint, token="hf_mock_token")
    with pytest.raises(HfExtError, match=r"^push to org/denied failed: .*401") as refused:
        push_folder(sample_case.folder, "org/denied", endpoint=hub.endpoint, token=False)
    assert "\n" not in str(refused.value)
    assert "org/no-config" not in hub.repos and "org/denied" not in hub.repos
