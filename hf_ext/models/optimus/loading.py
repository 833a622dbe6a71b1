"""Loading an Optimus model and its processor from a folder or Hub repo id, for the commands and the app."""

from typing import Any

from ...loading import load_config, loading, require_tokenizer_files
from .configuration_optimus import OptimusConfig
from .modeling_optimus import OptimusModel
from .processing_optimus import OptimusProcessor


def load_optimus(source: str, trust_remote_code: bool = False, **model_kwargs: Any,
                 ) -> tuple[OptimusModel, OptimusProcessor]:
    """An Optimus model and its processor from `source` (a folder or Hub repo id); one error line when they do not
    load or `source` holds another kind of model. `model_kwargs` go to the model's `from_pretrained` (`dtype`,
    `device_map`, ...)."""
    from transformers import AutoModel, AutoProcessor

    load_config(source, OptimusConfig.model_type, "an Optimus model", trust_remote_code)
    require_tokenizer_files(source)
    with loading("an Optimus model", source):
        return (AutoModel.from_pretrained(source, trust_remote_code=trust_remote_code, **model_kwargs),
                AutoProcessor.from_pretrained(source, trust_remote_code=trust_remote_code))
