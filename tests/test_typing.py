"""The public API type-checks from a user's code: mypy, with the project's configuration (`[tool.mypy]` in
pyproject.toml), finds nothing in a script that uses hf-ext as the README does, and finds the one mistake of a script
that passes a string for an integer config field (the check can fail). Slow: one mypy process reads hf_ext,
transformers and torch (a minute or more on this project's 2-core machine, without a cache)."""

import subprocess
import sys

import pytest
from conftest import REPO_ROOT, require_extra

pytestmark = pytest.mark.slow

USER_CODE = '''\
import torch
from transformers import AutoModel, AutoProcessor, AutoTokenizer, BertConfig, GPT2Config

import hf_ext  # registers the models with the Auto classes
from hf_ext import (
    MTDNNModel,
    OptimusConfig,
    OptimusLatentSpace,
    OptimusModel,
    OptimusProcessor,
    UniversalTransformerConfig,
    UniversalTransformerForSeq2SeqLM,
)

# the README's Optimus: Auto classes, the processor, forward, generate
model = AutoModel.from_pretrained("path/or/org/optimus")
processor = AutoProcessor.from_pretrained("path/or/org/optimus")
batch = processor(["a man is playing a guitar ."])
out = model(**batch)
tokens = model.generate(latent_z=out.mean, max_new_tokens=30)
print(processor.batch_decode(tokens), hf_ext.__version__)

# the classes themselves, typed
config = OptimusConfig(encoder=BertConfig(hidden_size=64), decoder=GPT2Config(n_embd=64), latent_size=16, beta=0.5)
latent_size: int = config.latent_size
optimus = OptimusModel(config)
optimus_processor = OptimusProcessor.from_pretrained("path/or/org/optimus")
mean, logvar, _ = optimus.encode(torch.tensor([[101, 2023, 102]]))
outputs = optimus(input_ids=torch.tensor([[101, 2023, 102]]), labels=torch.tensor([[50258, 11, 50259]]))
loss: torch.Tensor | None = outputs.loss
z: torch.Tensor = OptimusModel.interpolate(mean[0], optimus.sample_prior(1)[0], num_steps=5)
texts: list[str] = optimus_processor.batch_decode(optimus.generate(latent_z=z, max_new_tokens=20))
space = OptimusLatentSpace(optimus, optimus_processor)
path: list[tuple[float, str]] = space.interpolate("a dog runs .", "a man sleeps .", num_steps=5)

universal = UniversalTransformerForSeq2SeqLM(UniversalTransformerConfig(vocab_size=100, hidden_size=32))
copied = universal.generate(input_ids=torch.tensor([[5, 6, 7, 1]]), max_new_tokens=5)
mtdnn = MTDNNModel.from_pretrained("path/or/org/mt-dnn")
tokenizer = AutoTokenizer.from_pretrained("path/or/org/mt-dnn")
logits = mtdnn(**tokenizer("a premise", "a hypothesis", return_tensors="pt"), task="mnli").logits
'''

WRONG_CODE = '''\
from hf_ext import OptimusConfig

config = OptimusConfig(latent_size="32")
'''


@pytest.fixture(scope="module")
def mypy_lines(tmp_path_factory):
    """mypy's report on the two scripts, checked together in one process (from the repository root, where mypy finds
    the checkout's hf_ext), one entry per line."""
    require_extra("lint", "mypy")
    folder = tmp_path_factory.mktemp("typing")
    (folder / "user_code.py").write_text(USER_CODE)
    (folder / "wrong_code.py").write_text(WRONG_CODE)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO_ROOT / "pyproject.toml"), "--cache-dir",
         str(folder / "cache"), str(folder / "user_code.py"), str(folder / "wrong_code.py")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode in (0, 1), result.stderr  # 1: errors found; 2: mypy itself failed
    return result.stdout.splitlines()


def test_the_public_api_type_checks_in_user_code(mypy_lines):
    errors = [line for line in mypy_lines if ": error:" in line and "wrong_code.py" not in line]
    assert not errors, "mypy finds errors outside the deliberate one:\n" + "\n".join(errors)


def test_a_wrong_type_in_user_code_is_an_error_naming_it(mypy_lines):
    errors = [line for line in mypy_lines if ": error:" in line]
    assert len(errors) == 1, "\n".join(mypy_lines)
    assert "wrong_code.py:3: error: " in errors[0]
    assert '"latent_size" to "OptimusConfig" has incompatible type "str"; expected "int"' in errors[0]
