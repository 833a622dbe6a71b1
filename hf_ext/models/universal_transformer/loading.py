"""Loading a Universal Transformer and its tokenizer from a folder or Hub repo id, for the commands and the app."""

from typing import Any

from transformers import PreTrainedTokenizerBase

from ...loading import load_config, load_tokenizer, loading
from .configuration_universal_transformer import UniversalTransformerConfig
from .modeling_universal_transformer import UniversalTransformerPreTrainedModel


def load_model_and_tokenizer(source: str, trust_remote_code: bool = False, **model_kwargs: Any,
                             ) -> tuple[UniversalTransformerPreTrainedModel, PreTrainedTokenizerBase]:
    """A Universal Transformer (as the seq2seq or classification model its config's architectures name, else the
    encoder) and its tokenizer from `source` (a folder or Hub repo id); one error line when either does not load.
    `model_kwargs` go to the model's `from_pretrained` (`dtype`, `device_map`, ...)."""
    from transformers import AutoModel, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

    config = load_config(source, UniversalTransformerConfig.model_type, "a Universal Transformer", trust_remote_code)
    architectures = " ".join(config.architectures or [])
    auto_class = (AutoModelForSeq2SeqLM if "Seq2SeqLM" in architectures
                  else AutoModelForSequenceClassification if "SequenceClassification" in architectures else AutoModel)
    tokenizer = load_tokenizer(source, trust_remote_code)
    with loading("a Universal Transformer", source):
        model = auto_class.from_pretrained(source, trust_remote_code=trust_remote_code, **model_kwargs)
    return model, tokenizer
