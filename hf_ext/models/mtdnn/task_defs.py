"""The original's task-definition YAML (`experiments/glue/glue_task_def.yml` format) as an `MTDNNConfig`. Kept out
of the remote code (`configuration_mtdnn.py` takes the parsed mapping, `MTDNNConfig.from_task_defs`), which loads
where only torch and transformers are installed: parsing YAML takes PyYAML, which hf-ext requires."""

import os
from collections.abc import Mapping
from typing import Any

import yaml
from transformers import PretrainedConfig

from ...text_files import BoundedYamlLoader
from .configuration_mtdnn import MTDNNConfig


def config_from_task_def_yaml(path_or_text: str | os.PathLike, encoder_config: PretrainedConfig | dict[str, Any],
                              task_names: list[str] | None = None, san: dict[str, Any] | None = None,
                              group_sizes: Mapping[str, int] | None = None, **kwargs: Any) -> MTDNNConfig:
    """`MTDNNConfig.from_task_defs` on a task-definition YAML file (the original's `glue_task_def.yml` format) or
    its text; a one-line `ValueError` for a file that cannot be read and for malformed YAML."""
    if isinstance(path_or_text, os.PathLike) or "\n" not in str(path_or_text):
        try:
            with open(path_or_text, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as error:
            raise ValueError(f"cannot read the task-definition file {path_or_text}: {error.strerror}") from None
    else:
        text = path_or_text
    try:
        task_defs = yaml.load(text, Loader=BoundedYamlLoader)  # an alias bomb is refused
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ValueError(f"malformed task-definition YAML{line}: {getattr(error, 'problem', None) or error}") \
            from None
    return MTDNNConfig.from_task_defs(task_defs, encoder_config, task_names, san, group_sizes, **kwargs)
