"""The Universal Transformer's text-to-text pipeline (`UniversalTransformerText2TextPipeline` of
pipeline_universal_transformer.py, task "universal-transformer-text2text"): from a seq2seq folder hf-ext wrote, with
hf-ext imported and in an interpreter without it (`trust_remote_code=True`), the text the model's own `generate()`
gives; the converted bAbI classifier's folder declares no pipeline and its card turns the Hub's widget off."""

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
import yaml
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

from hf_ext.cli import main
from hf_ext.export import write_model_folder
from hf_ext.models.universal_transformer import ENTRY, UniversalTransformerForSeq2SeqLM
from hf_ext.models.universal_transformer.training import algorithmic_config, algorithmic_tokenizer

TASK = "universal-transformer-text2text"
TEXTS = ["12+3", "7", "31415+27"]  # of different lengths: a batch pads them


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny seq2seq Universal Transformer with ACT (halting unit at bias 0: positions halt after different numbers
    of steps) and its tokenizer, written as hf-ext writes folders."""
    root = tmp_path_factory.mktemp("universal_transformer_pipeline")
    torch.manual_seed(0)
    config = algorithmic_config(hidden_size=16, num_attention_heads=2, intermediate_size=32, act_max_steps=4,
                                dropout=0.0, act_halting_bias_init=0.0)
    model = UniversalTransformerForSeq2SeqLM(config)
    write_model_folder(root, UniversalTransformerForSeq2SeqLM, model.config, model.state_dict(), ENTRY.auto_map,
                       processor=algorithmic_tokenizer())
    return root


def generated(folder, text, **generate_kwargs):
    """The model's own `generate()` on one text, decoded without special tokens (one text per returned sequence)."""
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        output = model.generate(**tokenizer(text, return_tensors="pt"), **generate_kwargs)
    return tokenizer.batch_decode(output, skip_special_tokens=True)


def test_the_folder_declares_the_pipeline_and_carries_its_code(folder):
    config = json.loads((folder / "config.json").read_text())
    assert config["custom_pipelines"] == {TASK: {
        "impl": "pipeline_universal_transformer.UniversalTransformerText2TextPipeline",
        "pt": ["AutoModelForSeq2SeqLM"], "type": "text"}}
    assert (folder / "pipeline_universal_transformer.py").is_file()


def test_greedy_text_is_the_model_s(folder):
    generate = pipeline(model=str(folder), trust_remote_code=True)  # the folder's only custom task
    assert type(generate).__name__ == "UniversalTransformerText2TextPipeline"
    for text in TEXTS:
        expected = generated(folder, text, max_new_tokens=8)
        assert expected[0]  # the untrained model says something
        assert generate(text, max_new_tokens=8) == [{"generated_text": expected[0]}]
    # without generate() keywords: the model's generation config, as in a direct call
    assert generate(TEXTS[0]) == [{"generated_text": generated(folder, TEXTS[0])[0]}]


def test_generate_keywords_pass_through(folder):
    generate = pipeline(TASK, model=str(folder), trust_remote_code=True)
    beams = dict(num_beams=3, num_return_sequences=2, max_new_tokens=6)
    assert generate(TEXTS[2], **beams) == [{"generated_text": text} for text in generated(folder, TEXTS[2], **beams)]
    # set at pipeline(...): every call uses them
    short = pipeline(TASK, model=str(folder), trust_remote_code=True, max_new_tokens=3)
    assert short(TEXTS[2]) == [{"generated_text": generated(folder, TEXTS[2], max_new_tokens=3)[0]}]
    ids = generate(TEXTS[0], max_new_tokens=4, return_tensors=True)[0]["generated_token_ids"]
    assert AutoTokenizer.from_pretrained(folder).decode(ids, skip_special_tokens=True) == \
        generated(folder, TEXTS[0], max_new_tokens=4)[0]


def test_a_list_of_texts_one_by_one_and_batched(folder):
    generate = pipeline(model=str(folder), trust_remote_code=True)
    expected = [{"generated_text": generated(folder, text, max_new_tokens=6)[0]} for text in TEXTS]
    for batch_size in (1, 2, 3):
        assert generate(TEXTS, batch_size=batch_size, max_new_tokens=6) == expected
    # several sequences per text: a list of records per text
    beams = generate(TEXTS[:2], num_beams=2, num_return_sequences=2, max_new_tokens=4)
    assert [len(records) for records in beams] == [2, 2]
    with pytest.raises(ValueError, match="^a Universal Transformer text-to-text pipeline input is a text or a list "
                                         "of texts, not dict$"):
        generate({"text": TEXTS[0]})


@pytest.mark.slow
def test_the_pipeline_runs_where_hf_ext_is_not_installed(folder, tmp_path):
    script = textwrap.dedent(f"""
        import json, sys
        sys.modules["hf_ext"] = None  # hf_ext must not be needed
        from transformers import pipeline
        generate = pipeline(model={str(folder)!r}, trust_remote_code=True)
        print(json.dumps(generate({TEXTS!r}, batch_size=2, max_new_tokens=6)))
        """)
    result = subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, capture_output=True, text=True,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    assert remote == [{"generated_text": generated(folder, text, max_new_tokens=6)[0]} for text in TEXTS]


def test_training_outputs_and_saved_models_carry_the_pipeline(folder, tmp_path):
    """`save_training_run` writes `custom_pipelines` with the code; `save_pretrained` of a model loaded from a folder
    that had them keeps the entry and copies the code."""
    from hf_ext.trainer import save_training_run

    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    model.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "pipeline_universal_transformer.py").is_file()
    assert TASK in json.loads((tmp_path / "saved" / "config.json").read_text())["custom_pipelines"]
    fresh = UniversalTransformerForSeq2SeqLM(model.config.__class__.from_dict(
        {**model.config.to_dict(), "custom_pipelines": {}}))
    save_training_run(tmp_path / "run", SimpleNamespace(model=fresh, state=SimpleNamespace(log_history=[])))
    assert (tmp_path / "run" / "pipeline_universal_transformer.py").is_file()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["custom_pipelines"] == \
        json.loads((folder / "config.json").read_text())["custom_pipelines"]


def test_the_converted_babi_classifier_carries_no_pipeline_and_no_widget(fixtures_dir, tmp_path):
    """The bAbI model is a classifier that reads sentence embeddings, without a tokenizer: the text-to-text pipeline
    does not fit it, and no stock pipeline runs it, so its card keeps `pipeline_tag: text-classification` (what the
    model is) with the Hub's widget turned off (`inference: false`)."""
    out = tmp_path / "converted"
    assert main(["convert", "universal-transformer", str(fixtures_dir / "universal_transformer" / "tiny"),
                 str(out)]) == 0
    assert "custom_pipelines" not in json.loads((out / "config.json").read_text())
    assert not (out / "tokenizer_config.json").exists()
    data = yaml.safe_load((out / "README.md").read_text().split("---")[1])
    assert data["pipeline_tag"] == "text-classification" and data["inference"] is False
