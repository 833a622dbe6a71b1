"""The README's main job, `hf-ext demo`, end to end with a few training steps."""

import pytest
import torch
from transformers import AutoModel

from hf_ext.cli import main


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path, capsys, no_network):
    workdir = tmp_path / "demo"
    assert main(["demo", "--workdir", str(workdir), "--max-steps", "4"]) == 0
    out, err = capsys.readouterr()
    assert "huggingface.co" not in err and "Retrying" not in err
    for step in ("1. writing", "2. converting", "3. loading AutoModel.from_pretrained('hf-ext/optimus-demo')",
                 "4. fine-tuning", "5. reconstructions", "t=1.00", "done:"):
        assert step in out
    # the fine-tuned model was saved, and it differs from the converted one
    converted = AutoModel.from_pretrained(workdir / "converted")
    finetuned = AutoModel.from_pretrained(workdir / "finetuned")
    assert not torch.equal(converted.to_latent.weight, finetuned.to_latent.weight)
    # a second run replaces its own folder, but a foreign folder is refused
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    assert main(["demo", "--workdir", str(foreign), "--max-steps", "1"]) == 1
    assert "was not written by hf-ext demo" in capsys.readouterr().err
