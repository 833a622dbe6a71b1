"""Optimus' pipelines (pipeline_optimus.py, under the stock task names `text-generation` and `feature-extraction`):
from a converted BERT + GPT-2 folder and from a BERT + Llama folder `hf-ext optimus init` wrote, with hf-ext imported
and in an interpreter without it, each pipeline gives what `OptimusLatentSpace` gives (reconstruct, decode, sample,
encode); a stock task asked without the folder's code is refused with one line instead of transformers' own
pipeline's zeros; the task a written card names builds a pipeline that works."""

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
import yaml
from transformers import AutoModel, FeatureExtractionPipeline, TextGenerationPipeline, pipeline
from transformers.pipelines import PIPELINE_REGISTRY

from hf_ext import OptimusLatentSpace
from hf_ext.cli import main
from hf_ext.models.optimus import OptimusModel
from hf_ext.models.optimus.tiny_backbones import write_decoder, write_encoder

TEXTS = ["a man is playing a guitar .", "two dogs run on the grass ."]
TASKS = {"text-generation": "OptimusTextGenerationPipeline", "feature-extraction": "OptimusFeatureExtractionPipeline"}


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A BERT encoder and a Llama decoder (tiny, random) put together by `hf-ext optimus init`."""
    root = tmp_path_factory.mktemp("optimus_llama")
    write_encoder(root / "bert", "bert")
    write_decoder(root / "llama", "llama")
    assert main(["optimus", "init", str(root / "bert"), str(root / "llama"), str(root / "optimus"),
                 "--latent-size", "8", "--encoder-pooling", "mean"]) == 0
    return root / "optimus"


@pytest.fixture(params=["gpt2", "llama"])
def folder(request, optimus_sample_folder, llama_folder):
    return optimus_sample_folder if request.param == "gpt2" else llama_folder


def test_the_folders_declare_both_tasks_and_carry_the_code(folder):
    config = json.loads((folder / "config.json").read_text())
    assert config["custom_pipelines"] == {
        task: {"impl": f"pipeline_optimus.{name}", "pt": ["AutoModel"], "type": "text"} for task, name in TASKS.items()}
    assert (folder / "pipeline_optimus.py").is_file()


def test_text_generation_is_the_latent_space_s(folder):
    space = OptimusLatentSpace.from_pretrained(str(folder))
    generate = pipeline("text-generation", model=str(folder), trust_remote_code=True)
    assert type(generate).__name__ == TASKS["text-generation"]
    # reconstruction: one record per text, decoded from its posterior mean
    expected = space.reconstruct(TEXTS)
    assert len(set(expected)) == 2  # the two sentences decode differently: a mix-up would show
    for batch_size in (1, 2):
        assert generate(TEXTS, batch_size=batch_size) == [{"generated_text": text} for text in expected]
    assert generate(TEXTS[0]) == [{"generated_text": expected[0]}]
    short = space.reconstruct(TEXTS[1], max_new_tokens=3)[0]
    assert generate(TEXTS[1], max_new_tokens=3) == [{"generated_text": short}]
    # from given latents: a tensor of rows, one row as a list of floats
    latents = torch.randn(3, space.model.config.latent_size, generator=torch.Generator().manual_seed(1))
    assert generate(latents) == [{"generated_text": text} for text in space.decode(latents)]
    assert generate(latents[1].tolist()) == [{"generated_text": space.decode(latents[1:2])[0]}]
    # from the prior, reproducibly with a seed
    samples = generate(num_samples=3, seed=5)
    assert samples == [{"generated_text": text} for text in space.sample(3, torch.Generator().manual_seed(5))]
    assert samples != generate(num_samples=3, seed=6)


def test_feature_extraction_gives_the_posterior_means(folder):
    space = OptimusLatentSpace.from_pretrained(str(folder))
    mean, _ = space.encode(TEXTS)
    embed = pipeline("feature-extraction", model=str(folder), trust_remote_code=True)
    assert type(embed).__name__ == TASKS["feature-extraction"]
    vectors = torch.tensor(embed(TEXTS))
    assert vectors.shape == mean.shape and not torch.allclose(vectors[0], vectors[1])
    torch.testing.assert_close(vectors, mean, rtol=0, atol=1e-5)  # one text at a time against a padded batch
    torch.testing.assert_close(torch.tensor(embed(TEXTS * 2, batch_size=3)), torch.cat([mean, mean]),
                               rtol=0, atol=1e-5)
    torch.testing.assert_close(embed(TEXTS[0], return_tensors=True), mean[0], rtol=0, atol=1e-5)


def test_the_pipelines_refuse_what_they_cannot_read(optimus_sample_folder):
    generate = pipeline("text-generation", model=str(optimus_sample_folder), trust_remote_code=True)
    with pytest.raises(ValueError, match=r"^an Optimus latent has 5 values \(or is \[rows, 5\]\), not shape \[2, 4\]$"):
        generate(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="^an Optimus text-generation pipeline needs an input .* or num_samples=N"):
        generate()
    embed = pipeline("feature-extraction", model=str(optimus_sample_folder), trust_remote_code=True)
    with pytest.raises(ValueError, match="^an Optimus feature-extraction pipeline input is a text or a list of "
                                         "texts, not Tensor$"):
        embed(torch.zeros(5))


def test_stock_tasks_without_the_folder_s_code_are_refused_not_zeros(optimus_sample_folder):
    """Without these entries transformers served `feature-extraction` with its own pipeline, which returned the KL
    term ([[0.0], [0.0]]) as features, and failed to load the model for `text-generation`; now both are the
    folder's pipelines, which transformers runs only with `trust_remote_code=True` and otherwise refuses in one line."""
    for task in TASKS:
        with pytest.raises(ValueError, match="^Loading this pipeline requires you to execute the code in the pipeline "
                                             "file .* set the option `trust_remote_code=True`"):
            pipeline(task, model=str(optimus_sample_folder))
    with pytest.raises(RuntimeError, match="Pick one in feature-extraction, text-generation$"):
        pipeline(model=str(optimus_sample_folder), trust_remote_code=True)
    # the stock tasks stay transformers' own for every other model: hf-ext registers neither
    for task, stock in (("feature-extraction", FeatureExtractionPipeline), ("text-generation", TextGenerationPipeline)):
        assert PIPELINE_REGISTRY.check_task(task)[1]["impl"] == f"{stock.__module__}.{stock.__name__}"


def test_with_hf_ext_the_classes_run_without_remote_code(optimus_sample_folder):
    """`pipeline_class=` takes hf-ext's own classes: no code of the folder runs, and the outputs are the same."""
    from hf_ext.models.optimus import OptimusFeatureExtractionPipeline, OptimusTextGenerationPipeline

    folder = str(optimus_sample_folder)
    generate = pipeline("text-generation", model=folder, pipeline_class=OptimusTextGenerationPipeline)
    embed = pipeline("feature-extraction", model=folder, pipeline_class=OptimusFeatureExtractionPipeline)
    assert type(generate.model) is OptimusModel and type(embed.model) is OptimusModel
    assert generate(TEXTS, max_new_tokens=8) == \
        pipeline("text-generation", model=folder, trust_remote_code=True)(TEXTS, max_new_tokens=8)
    assert embed(TEXTS) == pipeline("feature-extraction", model=folder, trust_remote_code=True)(TEXTS)


def test_the_card_s_pipeline_tag_builds_a_working_pipeline(folder):
    card = (folder / "README.md").read_text()
    task = yaml.safe_load(card.split("---")[1])["pipeline_tag"]
    assert task in TASKS
    assert f'pipeline("{task}", model=' in card  # the card shows how
    built = pipeline(task, model=str(folder), trust_remote_code=True)
    assert type(built).__name__ == TASKS[task]
    space = OptimusLatentSpace.from_pretrained(str(folder))
    result = built(TEXTS[0])
    assert result == ([{"generated_text": space.reconstruct(TEXTS[0])[0]}] if task == "text-generation" else
                      space.encode(TEXTS[0])[0][0].tolist())


def test_saved_and_trained_models_carry_the_pipelines(optimus_sample_folder, tmp_path):
    """`save_pretrained` of a model loaded from a folder with the pipelines keeps the entries and copies the code;
    `save_training_run` writes them for a model that had none; the classifier's folders get none."""
    from hf_ext.models.optimus import OptimusForSequenceClassification
    from hf_ext.trainer import save_training_run

    declared = json.loads((optimus_sample_folder / "config.json").read_text())["custom_pipelines"]
    model = AutoModel.from_pretrained(optimus_sample_folder)
    model.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "pipeline_optimus.py").is_file()
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["custom_pipelines"] == declared
    def config_without():
        return model.config.__class__.from_dict({**model.config.to_dict(), "custom_pipelines": {}})

    no_log = SimpleNamespace(log_history=[])
    save_training_run(tmp_path / "run", SimpleNamespace(model=OptimusModel(config_without()), state=no_log))
    assert (tmp_path / "run" / "pipeline_optimus.py").is_file()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["custom_pipelines"] == declared
    classifier = OptimusForSequenceClassification(config_without())
    save_training_run(tmp_path / "classifier", SimpleNamespace(model=classifier, state=no_log))
    assert not json.loads((tmp_path / "classifier" / "config.json").read_text()).get("custom_pipelines")


@pytest.mark.slow
def test_the_pipelines_run_where_hf_ext_is_not_installed(folder, tmp_path):
    script = textwrap.dedent(f"""
        import json, sys
        sys.modules["hf_ext"] = None  # hf_ext must not be needed
        from transformers import pipeline
        generate = pipeline("text-generation", model={str(folder)!r}, trust_remote_code=True)
        embed = pipeline("feature-extraction", model={str(folder)!r}, trust_remote_code=True)
        print(json.dumps({{"texts": generate({TEXTS!r}), "samples": generate(num_samples=2, seed=3),
                          "means": embed({TEXTS!r})}}))
        """)
    result = subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, capture_output=True, text=True,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    space = OptimusLatentSpace.from_pretrained(str(folder))
    assert remote["texts"] == [{"generated_text": text} for text in space.reconstruct(TEXTS)]
    assert remote["samples"] == [{"generated_text": text} for text in space.sample(2, torch.Generator().manual_seed(3))]
    torch.testing.assert_close(torch.tensor(remote["means"]), space.encode(TEXTS)[0], rtol=0, atol=1e-5)
