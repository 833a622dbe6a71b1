"""`hf-ext convert universal-transformer`: parity with the PyTorch re-implementation's outputs in the shared fixture,
other configurations checked against a plain re-statement of the algorithm, and bad input (one error line, a
non-zero exit, nothing written)."""

import hashlib
import json
import os
import re
import runpy
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForSequenceClassification
from universal_transformer_reference import encoder as reference_encoder
from universal_transformer_reference import sinusoid

from hf_ext.cli import main

CONSTRUCTOR_DEFAULTS = {"max_length": 71, "input_dropout": 0.0, "layer_dropout": 0.0, "attention_dropout": 0.0,
                        "relu_dropout": 0.0, "use_mask": False}


@pytest.fixture(scope="module")
def fixture_dir(fixtures_dir):
    return fixtures_dir / "universal_transformer" / "tiny"


@pytest.fixture(scope="module")
def reference(fixture_dir):
    return load_file(str(fixture_dir / "reference.safetensors"))


@pytest.fixture(scope="module")
def converted(fixture_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ut_tiny") / "converted"
    assert main(["convert", "universal-transformer", str(fixture_dir), str(out),
                 "--reference", str(fixture_dir / "reference.safetensors")]) == 0
    return out


def test_fixture_parity_with_act(converted, reference, fixture_dir):
    model = AutoModel.from_pretrained(converted).eval()
    with torch.no_grad():
        output = model(inputs_embeds=reference["encoder_inputs_embeds"])
    torch.testing.assert_close(output.last_hidden_state, reference["act_encoder_last_hidden_state"],
                               atol=1e-4, rtol=1e-4)
    assert torch.equal(output.n_updates, reference["act_n_updates"])
    assert torch.equal(output.remainders > 0, reference["act_remainders"] > 0)  # who halted, who ran out of steps
    torch.testing.assert_close(output.remainders, reference["act_remainders"], atol=1e-6, rtol=0)
    torch.testing.assert_close(output.ponder_cost, reference["act_ponder_cost"], atol=1e-5, rtol=0)
    classifier = AutoModelForSequenceClassification.from_pretrained(converted).eval()
    with torch.no_grad():
        logits = classifier(inputs_embeds=reference["encoder_inputs_embeds"]).logits
    torch.testing.assert_close(logits, reference["act_logits"], atol=1e-4, rtol=1e-4)
    card = (converted / "README.md").read_text()
    digest = hashlib.sha256((fixture_dir / "state_dict.pt").read_bytes()).hexdigest()
    assert "| act_n_updates | 0 | exact |" in card and "| `state_dict.pt` |" in card and digest in card
    assert re.search(r"^\| act_logits \| [0-9.e-]+ \| atol 0.0001, rtol 0.0001 \|$", card, re.MULTILINE)


def test_fixture_parity_without_act(converted, reference):
    model = AutoModelForSequenceClassification.from_pretrained(converted, use_act=False).eval()
    with torch.no_grad():
        output = model(inputs_embeds=reference["encoder_inputs_embeds"], output_hidden_states=True)
    assert output.n_updates is None and len(output.hidden_states) == 7  # the input and six steps
    torch.testing.assert_close(output.hidden_states[-1], reference["fixed_encoder_last_hidden_state"],
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(output.logits, reference["fixed_logits"], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_final_layer_norm_option(fixture_dir, reference, tmp_path):
    out = tmp_path / "with_norm"
    assert main(["convert", "universal-transformer", str(fixture_dir), str(out), "--final-layer-norm"]) == 0
    with torch.no_grad():
        output = AutoModel.from_pretrained(out)(inputs_embeds=reference["encoder_inputs_embeds"])
    torch.testing.assert_close(output.last_hidden_state,
                               reference["act_encoder_last_hidden_state_with_unused_final_layer_norm"],
                               atol=1e-4, rtol=1e-4)


def original_checkpoint(folder, arguments, overrides=None, halting=(0.3, -1.0), seed=0):
    """A BabiUTransformer state dict with random weights (the original's key names and shapes; the halting unit's
    weight scale and bias `halting`) and its constructor arguments, as the converter reads them."""
    generator = torch.Generator().manual_seed(seed)
    vocab, hidden, inner = arguments["num_vocab"], arguments["hidden_size"], arguments["filter_size"]
    key, value = arguments["total_key_depth"] or hidden, arguments["total_value_depth"] or hidden

    def normal(*shape, scale=1.0):
        return torch.randn(*shape, generator=generator) * scale

    attention = "transformer_enc.enc.multi_head_attention."
    feed_forward = "transformer_enc.enc.positionwise_feed_forward.layers."
    state = {"mask": 1 + normal(11, hidden, scale=0.2), "emb.weight": normal(vocab, hidden), "W.bias": normal(vocab),
             "transformer_enc.embedding_proj.weight": normal(hidden, hidden, scale=hidden**-0.5),
             attention + "query_linear.weight": normal(key, hidden, scale=hidden**-0.5),
             attention + "key_linear.weight": normal(key, hidden, scale=hidden**-0.5),
             attention + "value_linear.weight": normal(value, hidden, scale=hidden**-0.5),
             attention + "output_linear.weight": normal(hidden, value, scale=value**-0.5),
             feed_forward + "0.conv.weight": normal(inner, hidden, 3, scale=(3 * hidden) ** -0.5),
             feed_forward + "0.conv.bias": normal(inner, scale=0.1),
             feed_forward + "1.conv.weight": normal(hidden, inner, 3, scale=(3 * inner) ** -0.5),
             feed_forward + "1.conv.bias": normal(hidden, scale=0.1)}
    for norm in ("transformer_enc.enc.layer_norm_mha", "transformer_enc.enc.layer_norm_ffn",
                 "transformer_enc.layer_norm"):
        state[f"{norm}.gamma"], state[f"{norm}.beta"] = 1 + normal(hidden, scale=0.2), normal(hidden, scale=0.2)
    state["W.weight"] = state["emb.weight"]  # tied in the original
    if arguments.get("act"):
        state["transformer_enc.act_fn.p.weight"] = normal(1, hidden, scale=halting[0])
        state["transformer_enc.act_fn.p.bias"] = torch.tensor([halting[1]])
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "state_dict.pt")
    document = {"constructor_kwargs": {**CONSTRUCTOR_DEFAULTS, **arguments},
                "post_construction_overrides": overrides or {}}
    (folder / "config.json").write_text(json.dumps(document))
    return state


def reference_roles(state):
    attention = "transformer_enc.enc.multi_head_attention."
    feed_forward = "transformer_enc.enc.positionwise_feed_forward.layers."
    roles = {"embedding_proj": "transformer_enc.embedding_proj.weight", "q": attention + "query_linear.weight",
             "k": attention + "key_linear.weight", "v": attention + "value_linear.weight",
             "o": attention + "output_linear.weight",
             "attention_norm_weight": "transformer_enc.enc.layer_norm_mha.gamma",
             "attention_norm_bias": "transformer_enc.enc.layer_norm_mha.beta",
             "transition_norm_weight": "transformer_enc.enc.layer_norm_ffn.gamma",
             "transition_norm_bias": "transformer_enc.enc.layer_norm_ffn.beta",
             "conv1_weight": feed_forward + "0.conv.weight", "conv1_bias": feed_forward + "0.conv.bias",
             "conv2_weight": feed_forward + "1.conv.weight", "conv2_bias": feed_forward + "1.conv.bias",
             "halting_weight": "transformer_enc.act_fn.p.weight", "halting_bias": "transformer_enc.act_fn.p.bias"}
    return {role: state[key] for role, key in roles.items() if key in state}


OTHER_CONFIGURATIONS = {
    "3 steps, 2 heads, key 16 / value 24, threshold 0.6": (
        dict(num_vocab=17, embedding_size=32, hidden_size=32, num_layers=3, num_heads=2, total_key_depth=16,
             total_value_depth=24, filter_size=40, act=True), {"transformer_enc.act_fn.threshold": 0.6}, (0.3, -1.0)),
    "8 steps, 4 heads, default depths, threshold 0.95": (
        dict(num_vocab=11, embedding_size=24, hidden_size=24, num_layers=8, num_heads=4, total_key_depth=0,
             total_value_depth=0, filter_size=30, act=True), {"transformer_enc.act_fn.threshold": 0.95}, (0.1, 0.0)),
    "ACT built, switched off": (
        dict(num_vocab=9, embedding_size=16, hidden_size=16, num_layers=4, num_heads=4, total_key_depth=8,
             total_value_depth=16, filter_size=20, act=True), {"transformer_enc.act": False}, (0.3, -1.0)),
    "fixed depth, 5 steps": (
        dict(num_vocab=9, embedding_size=16, hidden_size=16, num_layers=5, num_heads=2, total_key_depth=16,
             total_value_depth=8, filter_size=20, act=False), None, None),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", OTHER_CONFIGURATIONS)
def test_other_configurations_match_the_algorithm(name, tmp_path):
    arguments, overrides, halting = OTHER_CONFIGURATIONS[name]
    state = original_checkpoint(tmp_path / "src", arguments, overrides, halting)
    assert main(["convert", "universal-transformer", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    overrides = overrides or {}
    use_act = overrides.get("transformer_enc.act", arguments["act"])
    inputs = torch.randn(3, 9, arguments["hidden_size"], generator=torch.Generator().manual_seed(5))
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        body = AutoModel.from_pretrained(tmp_path / "out")(inputs_embeds=inputs)
        logits = classifier(inputs_embeds=inputs).logits
    expected, n_updates, _ = reference_encoder(
        inputs, reference_roles(state), heads=arguments["num_heads"], kind="conv", unbiased_std=True,
        steps_signal=sinusoid(arguments["num_layers"], arguments["hidden_size"]), use_act=use_act,
        threshold=overrides.get("transformer_enc.act_fn.threshold", 0.9))
    torch.testing.assert_close(body.last_hidden_state, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, expected.mean(1) @ state["W.weight"].T + state["W.bias"], atol=1e-5, rtol=1e-5)
    if use_act:
        assert torch.equal(body.n_updates, n_updates) and len(n_updates.unique()) >= 3
    else:
        assert body.n_updates is None


def save_source(folder, state, document):
    torch.save(state, folder / "state_dict.pt")
    (folder / "config.json").write_text(json.dumps(document))


def bad_sources():
    """name: (how to spoil a written copy of the fixture, given its state dict, constructor document and folder;
    a fragment of the expected error line)."""

    def edit(change):
        def spoil(state, document, folder):
            change(state, document)
            save_source(folder, state, document)
        return spoil

    def argument(**values):
        return edit(lambda state, document: document["constructor_kwargs"].update(values))

    def override(name, value):
        return edit(lambda state, document: document["post_construction_overrides"].update({name: value}))

    return {
        "missing key": (edit(lambda state, document: state.pop("transformer_enc.act_fn.p.bias")),
                        "missing 1 weight(s) of a BabiUTransformer with ACT"),
        "unexpected key": (edit(lambda state, document: state.update({"transformer_enc.extra.weight": torch.zeros(2)})),
                           "unexpected weight(s) transformer_enc.extra.weight"),
        "hidden size disagrees": (argument(hidden_size=64, embedding_size=64),
                                  "emb.weight has shape (24, 32), the constructor arguments imply (24, 64)"),
        "filter size disagrees": (argument(filter_size=50), "the constructor arguments imply (50, 32, 3)"),
        "key depth disagrees": (argument(total_key_depth=16), "the constructor arguments imply (16, 32)"),
        "ACT weights without ACT": (argument(act=False), "unexpected weight(s) transformer_enc.act_fn.p.bias, "
                                                         "transformer_enc.act_fn.p.weight (ACT weights"),
        "threshold above 1": (override("transformer_enc.act_fn.threshold", 1.5),
                              "act_threshold must lie strictly between 0 and 1"),
        "threshold 0": (override("transformer_enc.act_fn.threshold", 0.0),
                        "act_threshold must lie strictly between 0 and 1"),
        "zero steps": (argument(num_layers=0), "num_steps must be a positive integer, got 0"),
        "heads do not divide": (argument(num_heads=5), "not divisible by num_attention_heads 5"),
        "embedding size differs": (argument(embedding_size=16), "embedding_size 16 differs from hidden_size 32"),
        "unknown argument": (argument(dropout=0.1), "unknown BabiUTransformer argument(s) dropout"),
        "unknown override": (override("transformer_enc.num_layers", 3),
                             "unsupported override(s) transformer_enc.num_layers"),
        "no constructor arguments": (lambda state, document, folder: (folder / "config.json").unlink(),
                                     "config.json does not exist"),
        "constructor arguments not JSON": (
            lambda state, document, folder: (folder / "config.json").write_text("{num_vocab: 24"), "is not valid JSON"),
        "no state dict": (lambda state, document, folder: (folder / "state_dict.pt").unlink(),
                          "state_dict.pt does not exist"),
        "truncated state dict": (lambda state, document, folder: (folder / "state_dict.pt").write_bytes(
            (folder / "state_dict.pt").read_bytes()[:4000]), "is truncated or corrupt"),
        "not a state dict": (lambda state, document, folder: torch.save([torch.zeros(1)], folder / "state_dict.pt"),
                             "is not a state dict of tensors"),
    }


class RunsCode:
    """Pickles as a call to os.system: loading it with pickle would run the command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def assert_refused(capsys, argv, fragment, out, kept=()):
    """One error line (the last; progress lines may precede it), exit 1, and nothing but `kept` beside `out`'s
    first missing ancestor: no output, no staging folder, no parent folder created for it."""
    code = main(argv)
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("hf-ext: error: ")]
    assert code == 1
    assert len(errors) == 1 and captured.err.strip().splitlines()[-1] == errors[0], captured.err
    assert fragment in errors[0] and "Traceback" not in captured.err and not captured.out
    root = out.parent
    while not root.exists():
        root = root.parent
    assert sorted(p.name for p in root.iterdir()) == sorted(kept)


@pytest.mark.slow
@pytest.mark.parametrize("name", bad_sources())
def test_bad_input_is_refused_with_one_line(name, fixture_dir, tmp_path, capsys):
    spoil, fragment = bad_sources()[name]
    src = tmp_path / "src"
    src.mkdir()
    state = torch.load(fixture_dir / "state_dict.pt", weights_only=True)
    document = json.loads((fixture_dir / "config.json").read_text())
    save_source(src, state, document)
    spoil(state, document, src)
    out = tmp_path / "out" / "model"
    assert_refused(capsys, ["convert", "universal-transformer", str(src), str(out)], fragment, out, kept=["src"])


@pytest.mark.slow
def test_pickle_that_would_run_code_is_refused(fixture_dir, tmp_path, capsys):
    src, marker = tmp_path / "src", tmp_path / "code-ran"
    src.mkdir()
    state = torch.load(fixture_dir / "state_dict.pt", weights_only=True)
    torch.save({**state, "transformer_enc.payload": RunsCode(marker)}, src / "state_dict.pt")
    (src / "config.json").write_bytes((fixture_dir / "config.json").read_bytes())
    out = tmp_path / "model"
    assert_refused(capsys, ["convert", "universal-transformer", str(src), str(out)],
                   "could run code; it was not executed", out, kept=["src"])
    assert not marker.exists()


@pytest.mark.slow
def test_missing_source_is_refused(tmp_path, capsys):
    out = tmp_path / "model"
    assert_refused(capsys, ["convert", "universal-transformer", str(tmp_path / "nowhere"), str(out)],
                   "nowhere does not exist", out)


@pytest.mark.slow
def test_conversion_script(fixture_dir, repo_root, tmp_path, monkeypatch, capsys):
    """conversion/convert_universal_transformer_original_checkpoint.py is `hf-ext convert universal-transformer`."""
    script = repo_root / "conversion" / "convert_universal_transformer_original_checkpoint.py"
    for source, code in ((fixture_dir, 0), (tmp_path / "nowhere", 1)):
        monkeypatch.setattr(sys, "argv", [str(script), str(source), str(tmp_path / f"out{code}")])
        with pytest.raises(SystemExit) as exited:
            runpy.run_path(str(script), run_name="__main__")
        assert exited.value.code == code
    assert (tmp_path / "out0" / "model.safetensors").is_file() and not (tmp_path / "out1").exists()
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"{script.name}: error: source ")


@pytest.mark.slow
def test_remote_code_in_a_fresh_process(converted, fixture_dir, tmp_path):
    """The folder loads with trust_remote_code in a process that never imports hf_ext."""
    check = (
        "import sys, torch\n"
        "from safetensors.torch import load_file\n"
        "from transformers import AutoModel\n"
        f"reference = load_file({str(fixture_dir / 'reference.safetensors')!r})\n"
        f"model = AutoModel.from_pretrained({str(converted)!r}, trust_remote_code=True)\n"
        "output = model(inputs_embeds=reference['encoder_inputs_embeds'])\n"
        "assert 'hf_ext' not in sys.modules\n"
        "assert torch.equal(output.n_updates, reference['act_n_updates'])\n"
        "print((output.last_hidden_state - reference['act_encoder_last_hidden_state']).abs().max().item())\n"
    )
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    assert float(loaded.stdout.strip().splitlines()[-1]) < 1e-4


def test_reference_tolerances_are_the_fixtures(fixture_dir):
    from hf_ext.conversion import EXACT, Tolerance
    from hf_ext.models.universal_transformer.conversion import REFERENCE_TOLERANCES

    stated = json.loads((fixture_dir / "reference.json").read_text())["suggested_tolerance"]
    atol, rtol = map(float, re.match(r"atol (\S+) / rtol (\S+) for float tensors", stated).groups())
    assert "n_updates" in stated and "must match exactly" in stated
    assert {name: tolerance for name, tolerance in REFERENCE_TOLERANCES.items() if tolerance != EXACT} == \
        {name: Tolerance(atol=atol, rtol=rtol) for name in REFERENCE_TOLERANCES if name != "act_n_updates"}
    assert REFERENCE_TOLERANCES["act_n_updates"] == EXACT
