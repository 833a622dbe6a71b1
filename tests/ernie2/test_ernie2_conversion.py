"""ERNIE 2.0 conversion from PaddlePaddle checkpoints without paddle: parity with the original's outputs (fixtures)
through vanilla transformers, other configurations against an independent float64 re-implementation of the
original graph, the LoDTensor / .pdparams readers, and one clear error for each kind of bad input."""

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
import torch
from conftest import PROCESS_TIMEOUT, REPO_ROOT
from hub_server import MockHub
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from transformers import AutoTokenizer, ErnieForPreTraining

from hf_ext.checkpoints import load_numpy_pickle, safe_torch_load
from hf_ext.cli import main
from hf_ext.cli_utils import convert_main
from hf_ext.conversion import Tolerance
from hf_ext.errors import HfExtError
from hf_ext.models.ernie2 import conversion as ernie2_conversion
from hf_ext.models.ernie2.conversion import read_lod_tensor
from hf_ext.models.ernie2.samples import (
    lod_tensor_header,
    random_weights,
    sample_vocab,
    write_lod_tensor,
    write_paddlenlp_folder,
    write_static_release,
)

TINY = REPO_ROOT / "tests/fixtures/ernie2/tiny"
STATIC, PADDLENLP = TINY / "paddle_static", TINY / "paddlenlp"
REFERENCE = TINY / "reference.safetensors"
ATOL = 1e-5


def convert(src, out, *extra):
    assert main(["convert", "ernie2", str(src), str(out), *extra]) == 0
    return out


# --------------------------------------------------------------- an independent float64 model of the original graph

def _layer_norm(x, w, name):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * w[f"{name}_scale"] + w[f"{name}_bias"]


def _fc(x, w, name):
    return x @ w[f"{name}.w_0"] + w[f"{name}.b_0"]


def original_forward(weights, config, input_ids, token_type_ids, position_ids, task_type_ids, input_mask):
    """model/ernie.py (ERNIE 2.0 release) in float64 on Paddle-layout weights under their static names: post-LN
    encoder, additive mask (m m^T - 1) * 10000 that also masks padded query rows, tanh pooler, LM head."""
    w = {k: torch.as_tensor(np.asarray(v), dtype=torch.float64) for k, v in weights.items()}
    act = {"gelu": lambda x: 0.5 * x * (1 + torch.special.erf(x / 2 ** 0.5)), "relu": torch.relu}[config["hidden_act"]]
    x = w["word_embedding"][input_ids] + w["pos_embedding"][position_ids] + w["sent_embedding"][token_type_ids]
    if config.get("use_task_id"):
        x = x + w["task_embedding"][task_type_ids]
    x = _layer_norm(x, w, "pre_encoder_layer_norm")
    mask = input_mask.to(torch.float64)
    bias = ((mask[:, :, None] * mask[:, None, :]) - 1) * 10000
    batch, length, hidden = x.shape
    heads = config["num_attention_heads"]
    for i in range(config["num_hidden_layers"]):
        p = f"encoder_layer_{i}_"

        def split(t):
            return t.view(batch, length, heads, hidden // heads).transpose(1, 2)

        q, k, v = (split(_fc(x, w, f"{p}multi_head_att_{n}_fc")) for n in ("query", "key", "value"))
        scores = (q * (hidden // heads) ** -0.5) @ k.transpose(-1, -2) + bias[:, None]
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, hidden)
        x = _layer_norm(x + _fc(context, w, f"{p}multi_head_att_output_fc"), w, f"{p}post_att_layer_norm")
        x = _layer_norm(x + _fc(act(_fc(x, w, f"{p}ffn_fc_0")), w, f"{p}ffn_fc_1"), w, f"{p}post_ffn_layer_norm")
    pooled = torch.tanh(_fc(x[:, 0], w, "pooled_fc"))
    transformed = _layer_norm(act(_fc(x, w, "mask_lm_trans_fc")), w, "mask_lm_trans_layer_norm")
    decoder = w["mask_lm_out_fc.w_0"] if "mask_lm_out_fc.w_0" in w else w["word_embedding"].T
    return x, pooled, transformed @ decoder + w["mask_lm_out_fc.b_0"]


def random_inputs(config, batch=3, length=9, seed=1):
    """Padded batches as the original's batching makes them: [CLS] first, positions 0..n-1 then 0 on padding."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([length, length - 3, 4])[:batch]
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    ids = torch.randint(5, config["vocab_size"], (batch, length), generator=g) * mask
    ids[:, 0] = 2
    types = config.get("sent_type_vocab_size") or config.get("type_vocab_size", 2)
    token_types = torch.randint(0, types, (batch, length), generator=g) * mask
    positions = torch.arange(length)[None] * mask
    tasks = torch.randint(0, config.get("task_type_vocab_size", 3), (batch, 1), generator=g).expand(batch, length)
    return {"input_ids": ids, "token_type_ids": token_types, "position_ids": positions,
            "task_type_ids": tasks.contiguous(), "attention_mask": mask}


def test_the_float64_original_matches_the_paddle_reference_at_every_position():
    """The oracle used for the other configurations reproduces the Paddle reference, padded rows included."""
    config = json.loads((STATIC / "ernie_config.json").read_text())
    weights = {p.name: read_lod_tensor(p).numpy() for p in (STATIC / "params").iterdir()}
    ref = load_file(str(REFERENCE))
    sequence, pooled, logits = original_forward(weights, config, ref["input_ids"], ref["token_type_ids"],
                                                ref["position_ids"], ref["task_type_ids"], ref["attention_mask"])
    real = ref["attention_mask"].bool()
    assert (sequence - ref["sequence_output"])[real].abs().max() < ATOL
    assert (pooled - ref["pooled_output"]).abs().max() < ATOL
    assert (logits - ref["mlm_logits"])[real].abs().max() < ATOL
    # padded query rows: float32 Paddle loses ~1e-4 to the -10000 offsets, yet they are far from key-only masking
    assert (sequence - ref["sequence_output"])[~real].abs().max() < 1e-3
    assert (sequence - ref["sequence_output_key_mask"])[~real].abs().max() > 0.1


# ----------------------------------------------------------------------------------- the fixtures, vanilla transformers

VANILLA_CHECK = textwrap.dedent("""
    import json, sys
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel, AutoModelForPreTraining, AutoTokenizer
    ref = load_file(sys.argv[1])
    inputs = {k: ref[k] for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids", "task_type_ids")}
    real = ref["attention_mask"].bool()
    report = {}
    for folder in sys.argv[2:]:
        config = AutoConfig.from_pretrained(folder)
        base = AutoModel.from_pretrained(folder).eval()
        full = AutoModelForPreTraining.from_pretrained(folder).eval()
        with torch.no_grad():
            sequence, pooled = base(**inputs)[:2]
            logits = full(**inputs).prediction_logits
        tokenizer = AutoTokenizer.from_pretrained(folder)
        report[folder] = {
            "classes": [type(base).__name__, type(full).__name__, config.model_type],
            "sequence_output_key_mask": (sequence - ref["sequence_output_key_mask"]).abs().max().item(),
            "pooled_output": (pooled - ref["pooled_output"]).abs().max().item(),
            "mlm_logits_key_mask": (logits - ref["mlm_logits_key_mask"]).abs().max().item(),
            "sequence_output_real": (sequence[real] - ref["sequence_output"][real]).abs().max().item(),
            "mlm_logits_real": (logits[real] - ref["mlm_logits"][real]).abs().max().item(),
            "tokens": tokenizer.convert_ids_to_tokens(tokenizer("[MASK]")["input_ids"]),
        }
    report["hf_ext_imported"] = any(name.split(".")[0] == "hf_ext" for name in sys.modules)
    print(json.dumps(report))
""")


@pytest.mark.slow
def test_both_fixture_formats_match_the_original_through_vanilla_transformers(tmp_path, monkeypatch):
    """Both converted folders, and the second one pushed to a mock Hub and downloaded again by repo id, in a process
    that never imports hf_ext."""
    hub = MockHub().start()
    try:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.endpoint)
        outs = [convert(STATIC, tmp_path / "from_static"),
                convert(PADDLENLP, tmp_path / "from_paddlenlp", "--push-to-hub", "org/ernie2-tiny",
                        "--token", "hf_mock_token")]
        pushed = hub.files("org/ernie2-tiny")
        assert pushed == {p.name: p.read_bytes() for p in outs[1].iterdir()}
        for out in outs:
            assert not list(out.glob("*.py")) and "auto_map" not in json.loads((out / "config.json").read_text())
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "PYTHONPATH"}
        env.update(HF_HOME=str(tmp_path / "home"), HF_ENDPOINT=hub.endpoint)
        sources = [*map(str, outs), "org/ernie2-tiny"]
        result = subprocess.run([sys.executable, "-c", VANILLA_CHECK, str(REFERENCE), *sources], env=env,
                                cwd=tmp_path, capture_output=True, text=True, timeout=PROCESS_TIMEOUT)
    finally:
        hub.stop()
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report.pop("hf_ext_imported") is False
    for source in sources:
        errors = report[source]
        assert errors.pop("classes") == ["ErnieModel", "ErnieForPreTraining", "ernie"]
        assert errors.pop("tokens") == ["[CLS]", "[MASK]", "[SEP]"]
        assert max(errors.values()) < ATOL, (source, errors)


# --------------------------------------------------------------------------------------- other configurations

CONFIG_RELU = {  # relu, no intermediate_size (4 * hidden), sent_type_vocab_size beats type_vocab_size, 16 task ids
    "attention_probs_dropout_prob": 0.1, "hidden_act": "relu", "hidden_dropout_prob": 0.1, "hidden_size": 24,
    "initializer_range": 0.02, "max_position_embeddings": 20, "num_attention_heads": 3, "num_hidden_layers": 3,
    "sent_type_vocab_size": 4, "type_vocab_size": 2, "task_type_vocab_size": 16, "use_task_id": True,
}
CONFIG_RELEASED_STYLE = {  # like the English release: no use_task_id (its task_embedding is unused), untied decoder
    "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 16,
    "initializer_range": 0.02, "intermediate_size": 20, "max_position_embeddings": 16, "num_attention_heads": 2,
    "num_hidden_layers": 1, "type_vocab_size": 3, "task_type_vocab_size": 5,
}
CASES = {"relu-tabvocab": (CONFIG_RELU, True, False), "released-untied": (CONFIG_RELEASED_STYLE, False, True)}


@pytest.mark.slow
@pytest.mark.parametrize("writer", [write_static_release, write_paddlenlp_folder], ids=["static", "paddlenlp"])
@pytest.mark.parametrize("case", list(CASES))
def test_other_configurations_match_the_original_graph(tmp_path, case, writer):
    config, tab_layout, untied = CASES[case]
    tokens = sample_vocab()
    config = {**config, "vocab_size": len(tokens) + 7}  # embeddings may have more rows than the vocabulary
    weights = random_weights(config, seed=len(case), untied_decoder=untied)
    out = convert(writer(tmp_path / "src", config, weights, tokens, tab_layout=tab_layout), tmp_path / "out")

    model = ErnieForPreTraining.from_pretrained(out).eval()
    assert model.config.hidden_act == config["hidden_act"]
    assert model.config.intermediate_size == config.get("intermediate_size", 4 * config["hidden_size"])
    assert model.config.type_vocab_size == config.get("sent_type_vocab_size", config["type_vocab_size"])
    assert model.config.use_task_id == bool(config.get("use_task_id"))
    assert model.config.tie_word_embeddings is not untied
    inputs = random_inputs(config)
    with torch.no_grad():
        got = model(**{k: v for k, v in inputs.items() if k != "task_type_ids" or config.get("use_task_id")},
                    output_hidden_states=True)
    sequence, pooled, logits = original_forward(weights, config, **{k: inputs[k] for k in (
        "input_ids", "token_type_ids", "position_ids", "task_type_ids")}, input_mask=inputs["attention_mask"])
    real = inputs["attention_mask"].bool()
    assert (got.hidden_states[-1][real] - sequence[real]).abs().max() < ATOL
    assert (model.ernie.pooler(got.hidden_states[-1]) - pooled).abs().max() < ATOL
    assert (got.prediction_logits[real] - logits[real]).abs().max() < ATOL

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.convert_tokens_to_ids(tokens) == list(range(len(tokens)))  # ids from the file, not its order
    assert tokenizer("A dog")["input_ids"] == [2, tokens.index("a"), tokens.index("dog"), 3]


@pytest.mark.slow
def test_paddlenlp_next_sentence_head_is_kept_and_missing_one_is_zero(tmp_path):
    tokens = sample_vocab()
    config = {**CONFIG_RELEASED_STYLE, "vocab_size": len(tokens)}
    weights = random_weights(config, task_embedding=False)
    nsp = (np.random.default_rng(3).standard_normal((16, 2), dtype=np.float32), np.array([0.5, -0.5], np.float32))
    with_head = convert(write_paddlenlp_folder(tmp_path / "a", config, weights, tokens, nsp_head=nsp), tmp_path / "x")
    without = convert(write_static_release(tmp_path / "b", config, weights, tokens), tmp_path / "y")
    kept, zero = load_file(str(with_head / "model.safetensors")), load_file(str(without / "model.safetensors"))
    assert torch.equal(kept["cls.seq_relationship.weight"], torch.from_numpy(nsp[0].T))
    assert torch.equal(kept["cls.seq_relationship.bias"], torch.from_numpy(nsp[1]))
    assert not zero["cls.seq_relationship.weight"].any() and "next-sentence head" in (without / "README.md").read_text()


# ---------------------------------------------------------------------------------------------------------- readers

@pytest.mark.parametrize("dtype,code", [(np.float16, 4), (np.float64, 6), (np.int64, 3), (np.int8, 21)])
def test_lod_tensor_round_trip_of_other_dtypes_and_lod_levels(tmp_path, dtype, code):
    array = (np.arange(24).reshape(2, 3, 4) - 7).astype(dtype)
    write_lod_tensor(tmp_path / "t", array, lod=[[0, 1, 2]])
    tensor = read_lod_tensor(tmp_path / "t")
    assert tensor.numpy().dtype == dtype and np.array_equal(tensor.numpy(), array)


def test_lod_tensor_bf16_and_packed_dims(tmp_path):
    values = torch.tensor([[1.5, -2.0, 3.25]], dtype=torch.bfloat16)
    write_lod_tensor(tmp_path / "bf16", values.view(torch.uint16).numpy(), dtype_code=22)
    assert torch.equal(read_lod_tensor(tmp_path / "bf16"), values)
    # a TensorDesc whose dims are one packed field (0x12) instead of one 0x10 tag each
    desc = b"\x08\x05\x12\x02\x02\x03"
    header = lod_tensor_header((2, 3), 5)[:16] + len(desc).to_bytes(4, "little") + desc
    (tmp_path / "packed").write_bytes(header + np.arange(6, dtype=np.float32).tobytes())
    assert read_lod_tensor(tmp_path / "packed").tolist() == [[0, 1, 2], [3, 4, 5]]


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_numpy_pickles_load_and_code_is_refused(tmp_path, protocol):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": {"nested": np.ones(2, np.int64)}}
    (tmp_path / "ok.pdparams").write_bytes(pickle.dumps(arrays, protocol=protocol))
    loaded = load_numpy_pickle(tmp_path / "ok.pdparams")
    assert np.array_equal(loaded["a"], arrays["a"]) and loaded["b"]["nested"].dtype == np.int64
    marker = tmp_path / "ran"
    for payload, refusal in ((RunsCode(marker), "system"), ({"a": np.array([RunsCode(marker)], dtype=object)}, "")):
        (tmp_path / "bad.pdparams").write_bytes(pickle.dumps(payload, protocol=protocol))
        with pytest.raises(HfExtError, match=f"refusing to load .*{refusal}"):
            load_numpy_pickle(tmp_path / "bad.pdparams")
    assert not marker.exists()
    torch.save({"w": torch.ones(2)}, tmp_path / "t.bin")  # the torch loader beside it is unchanged
    assert torch.equal(safe_torch_load(tmp_path / "t.bin")["w"], torch.ones(2))


# -------------------------------------------------------------------------------------------------------- bad input

def _copy(src, tmp_path):
    return Path(shutil.copytree(src, tmp_path / "src"))


def _truncate_data(src):
    path = src / "params" / "encoder_layer_1_ffn_fc_0.w_0"
    path.write_bytes(path.read_bytes()[:-10])


def _truncate_header(src):
    path = src / "params" / "pooled_fc.w_0"
    path.write_bytes(path.read_bytes()[:18])


def _unknown_dtype(src):
    path = src / "params" / "sent_embedding"
    data = bytearray(path.read_bytes())
    assert data[20:22] == b"\x08\x05"  # TensorDesc field 1 (data type) right after the 20-byte preamble
    data[21] = 9
    path.write_bytes(bytes(data))


def _edit_json(path, **changes):
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _bert_config(src):
    from transformers import BertConfig

    (src / "config.json").write_text(BertConfig(hidden_size=32, num_attention_heads=4).to_json_string())


def _gpt2_config(src):
    (src / "ernie_config.json").write_text(json.dumps({"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 99}))


def _code_pickle(src):
    (src / "model_state.pdparams").write_bytes(pickle.dumps({"w": RunsCode(src / "ran")}, protocol=4))


BAD_INPUTS = {
    "truncated-data": (STATIC, _truncate_data, r"params/encoder_layer_1_ffn_fc_0\.w_0 is truncated"),
    "truncated-header": (STATIC, _truncate_header, r"params/pooled_fc\.w_0 is truncated"),
    "unknown-dtype": (STATIC, _unknown_dtype, r"params/sent_embedding has unknown data type code 9"),
    "dims-vs-config-static": (STATIC, lambda s: _edit_json(s / "ernie_config.json", intermediate_size=40),
                              r"ffn_fc_0\.w_0 has dims \[32, 37\], but ernie_config\.json implies \[32, 40\]"),
    "dims-vs-config-paddlenlp": (PADDLENLP, lambda s: _edit_json(s / "config.json", vocab_size=120),
                                 r"word_embeddings\.weight has dims \[99, 32\], but config\.json implies \[120, 32\]"),
    "pickle-runs-code": (PADDLENLP, _code_pickle, r"refusing to load .*model_state\.pdparams.*system"),
    "missing-vocab": (STATIC, lambda s: (s / "vocab.txt").unlink(), r"vocab\.txt does not exist"),
    "bert-config": (PADDLENLP, _bert_config, r"config\.json describes a bert model, not ERNIE"),
    "gpt2-config": (STATIC, _gpt2_config, r"not an ERNIE config: it lacks hidden_size"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gives_one_error_line_and_writes_nothing(tmp_path, capsys, case):
    fixture, damage, message = BAD_INPUTS[case]
    src = _copy(fixture, tmp_path)
    damage(src)
    out = tmp_path / "out"
    code = convert_main(ernie2_conversion, [str(src), str(out)], prog="convert_ernie2") if case == "missing-vocab" \
        else main(["convert", "ernie2", str(src), str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert lines[-1].startswith(("hf-ext: error: ", "convert_ernie2: error: "))
    assert sum(": error: " in line for line in lines) == 1 and "Traceback" not in "\n".join(lines)
    assert re.search(message, lines[-1]), lines[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no OUT, no staging folder
    assert not (src / "ran").exists()


# ------------------------------------------------------------------------------------------------------------- card

@pytest.mark.slow
def test_model_card_quotes_the_published_glue_results_and_records_provenance(tmp_path):
    out = convert(STATIC, tmp_path / "out", "--reference", str(REFERENCE), "--checksums")
    card = ModelCard.load(out / "README.md")
    assert card.data.license == "apache-2.0" and card.data.library_name == "transformers"
    text = card.text
    assert "| ERNIE 2.0 Large | 65.4 | 96.0 | 89.7 | 92.3 | 92.5 | 89.1 | 94.3 | 85.2 |" in text
    assert "| ERNIE 2.0 Base | 80.6 | 55.2 |" in text and "not re-measured" in text
    config_sha = json.loads((TINY / "reference.json").read_text())["files"]["paddle_static/ernie_config.json"]
    assert config_sha["sha256"] in text
    assert f"params/ ({len(list((STATIC / 'params').iterdir()))} files)" in text and "not computed" not in text
    rows = [line.split("|")[1:4] for line in text.splitlines()
            if line.startswith(("| sequence_output", "| mlm_logits", "| pooled_output"))]
    assert len(rows) == 5 and max(float(error) for _, error, _ in rows) < ATOL
    assert {tolerance.strip() for _, _, tolerance in rows} == {"atol 0.0001, rtol 0.0001"}


def test_reference_tolerances_are_the_fixtures():
    stated = json.loads((TINY / "reference.json").read_text())["comparison"]["suggested_tolerance"]
    assert set(ernie2_conversion.REFERENCE_TOLERANCES.values()) == {Tolerance(**stated)}
