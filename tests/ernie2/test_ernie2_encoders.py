"""ERNIE 2.0 pre-training started from BERT-family encoders other than ERNIE (tiny configs of BERT with its MLM
head, a MiniLM-shaped BERT encoder without one, as all-MiniLM-L6-v2 ships, an ELECTRA discriminator, and RoBERTa,
XLM-RoBERTa and CamemBERT with byte-level BPE and sentencepiece tokenizers trained here): their weights carry over
(ERNIE's encoder computes what theirs did), `hf-ext ernie2 pretrain` trains from them, every stage lowers the loss
of its tasks, and the word-level tasks label whole words of tokenizers that cut words into several pieces."""

import json

import pytest
import torch
from conftest import cli_exit_code
from streaming_corpus import CORPUS, document, tokenizer, write_corpus
from tokenizers import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertModel,
    CamembertConfig,
    CamembertForMaskedLM,
    CamembertTokenizer,
    ElectraConfig,
    ElectraModel,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaTokenizer,
    TrainingArguments,
    XLMRobertaConfig,
    XLMRobertaForMaskedLM,
    XLMRobertaTokenizer,
)

from hf_ext.errors import HfExtError
from hf_ext.models.ernie2.data import (
    DOCUMENT_TASKS,
    Ernie2DataBuilder,
    Ernie2PreTrainingCollator,
    documents_from_records,
)
from hf_ext.models.ernie2.schedule import ContinualSchedule
from hf_ext.models.ernie2.training import continual_pretraining, load_pretraining_model

pytestmark = pytest.mark.slow

SIZES = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
# roberta-base's settings besides the sizes: one token type, layer-norm eps 1e-5, positions from pad id + 1
ROBERTA_SETTINGS = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
                        max_position_embeddings=66, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
                        bos_token_id=0, eos_token_id=2)
SPECIAL = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
TEXTS = [sentence for record in [*CORPUS, *map(document, range(12))] for paragraph in record["paragraphs"]
         for sentence in paragraph]


def bert(vocab_size):
    return BertForMaskedLM(BertConfig(vocab_size=vocab_size, num_hidden_layers=2, **SIZES))


def minilm(vocab_size):  # all-MiniLM-L6-v2's shape at a tiny width: six layers, a BertModel without MLM head
    return BertModel(BertConfig(vocab_size=vocab_size, num_hidden_layers=6, **SIZES))


def electra(vocab_size):
    return ElectraModel(ElectraConfig(vocab_size=vocab_size, embedding_size=32, num_hidden_layers=2, **SIZES))


def roberta_tokenizer():
    """A byte-level BPE of a few merges over the corpus: most words are several pieces."""
    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(TEXTS, vocab_size=300, min_frequency=2, special_tokens=SPECIAL, show_progress=False)
    model = json.loads(trained._tokenizer.to_str())["model"]
    return RobertaTokenizer(vocab=model["vocab"], merges=[tuple(merge) for merge in model["merges"]])


def sentencepiece_tokenizer(tokenizer_class):
    """A unigram sentencepiece model over the corpus, as XLM-RoBERTa's and CamemBERT's tokenizers hold."""
    trained = SentencePieceUnigramTokenizer()
    trained.train_from_iterator(TEXTS, vocab_size=120, special_tokens=SPECIAL, show_progress=False)
    model = json.loads(trained._tokenizer.to_str())["model"]
    return tokenizer_class(vocab=[tuple(piece) for piece in model["vocab"]])


def roberta(tok):
    return RobertaForMaskedLM(RobertaConfig(vocab_size=len(tok), **ROBERTA_SETTINGS))


def xlm_roberta(tok):
    return XLMRobertaForMaskedLM(XLMRobertaConfig(vocab_size=len(tok), **ROBERTA_SETTINGS))


def camembert(tok):
    return CamembertForMaskedLM(CamembertConfig(vocab_size=len(tok), **ROBERTA_SETTINGS))


def pretrain_cli(folder, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", shards=2)
    stages = tmp_path / "stages.yml"
    stages.write_text("stages:\n  - steps: {knowledge_masking: 2, capitalization: 1}\n")
    code = cli_exit_code(["--quiet", "ernie2", "pretrain", folder, "--documents", corpus, "--streaming", "--stages",
                          stages, "--output-dir", tmp_path / "run", "--batch-size", "2", "--max-length", "32",
                          "--logging-steps", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["step"] == 3 and (tmp_path / "run" / "ernie" / "model.safetensors").is_file()


@pytest.mark.parametrize("make", [bert, minilm, electra])
def test_a_bert_family_encoder_starts_a_pretraining_run(make, tmp_path, capsys):
    tok = tokenizer()
    torch.manual_seed(0)
    source = make(len(tok)).eval()
    folder = tmp_path / "encoder"
    source.save_pretrained(folder)
    tok.save_pretrained(folder)
    model = load_pretraining_model(folder).eval()
    ids = torch.tensor([[2, 5, 6, 7, 20, 3, 0]])
    mask = (ids != 0).long()
    encoder = getattr(source, "bert", source)
    with torch.no_grad():
        expected = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        ours = model.ernie(input_ids=ids, attention_mask=mask, task_type_ids=torch.full_like(ids, 3)).last_hidden_state
    # zero task-embedding rows: ERNIE's encoder computes what the source's did, for every task id
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    pretrain_cli(folder, tmp_path, capsys)


@pytest.mark.parametrize(("make", "make_tokenizer"), [
    (roberta, roberta_tokenizer), (xlm_roberta, lambda: sentencepiece_tokenizer(XLMRobertaTokenizer)),
    (camembert, lambda: sentencepiece_tokenizer(CamembertTokenizer))], ids=["roberta", "xlm-roberta", "camembert"])
def test_a_roberta_family_encoder_starts_a_pretraining_run(make, make_tokenizer, tmp_path, capsys):
    tok = make_tokenizer()
    torch.manual_seed(0)
    source = make(tok).eval()
    folder = tmp_path / "encoder"
    source.save_pretrained(folder)
    tok.save_pretrained(folder)
    model = load_pretraining_model(folder).eval()
    assert model.config.max_position_embeddings == 64 and model.config.type_vocab_size == 1
    # right-padded rows, as ERNIE 2.0's collator pads: RoBERTa numbers real tokens from pad id + 1, ERNIE from 0
    batch = tok(["The river flows past word3 town.", "People live near it."], padding=True, return_tensors="pt")
    real = batch["attention_mask"].bool()
    assert not real.all()
    with torch.no_grad():
        expected = source(**batch, output_hidden_states=True)
        ours = model(**batch, task_type_ids=torch.full_like(batch["input_ids"], 2), output_hidden_states=True)
    torch.testing.assert_close(ours.hidden_states[-1][real], expected.hidden_states[-1][real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.knowledge_masking_logits[real], expected.logits[real], atol=1e-5, rtol=1e-5)
    pretrain_cli(folder, tmp_path, capsys)


SCHEDULE = ContinualSchedule.from_dict({"stages": [
    {"steps": {"knowledge_masking": 6, "capitalization": 6}},
    {"steps": {"token_document_relation": 8, "sentence_reordering": 8, "sentence_distance": 8}},
]})


def task_losses(model, examples, tasks):
    collator = Ernie2PreTrainingCollator(model.config.task_ids, model.config.pad_token_id)
    model.eval()
    with torch.no_grad():
        return {task: model(**collator(list(examples[task])))[f"{task}_loss"].item() for task in tasks}


def test_each_stage_from_roberta_lowers_the_loss_of_its_tasks(tmp_path):
    tok = roberta_tokenizer()
    torch.manual_seed(0)
    folder = tmp_path / "roberta"
    roberta(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    model = load_pretraining_model(folder)
    documents = documents_from_records(CORPUS)
    examples = Ernie2DataBuilder(tok, max_length=48, seed=0).build(documents, DOCUMENT_TASKS)
    args = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, learning_rate=3e-3,
                             lr_scheduler_type="constant", seed=0, report_to=[], disable_tqdm=True, use_cpu=True,
                             save_strategy="no", logging_steps=3)
    previous = load_pretraining_model(folder)
    _, histories = continual_pretraining(model, SCHEDULE, examples, args, processing_class=tok)
    for index, stage in enumerate(SCHEDULE.stages):
        ended = load_pretraining_model(tmp_path / "run" / f"stage-{index + 1}" / "model")
        start, end = (task_losses(m, examples, stage.steps) for m in (previous, ended))
        assert all(end[task] < start[task] for task in stage.steps), (index, start, end)
        assert histories[index][-1]["step"] == stage.total_steps
        previous = ended


def byte_level_words(tok, ids):
    """The words of byte-level pieces, read off the pieces themselves (not through the tokenizer's word ids): a piece
    that neither starts with a space ('Ġ') nor follows a piece ending in punctuation continues the word before, when
    both are letters or digits. Returns (word text, its first piece, its pieces) per word."""
    words = []
    for position, piece in enumerate(tok.convert_ids_to_tokens(ids)):
        previous = words[-1][0] if words else ""
        if words and not piece.startswith("Ġ") and piece[0].isalnum() and (previous[-1:].isalnum() or not previous):
            words[-1] = (previous + piece, words[-1][1], words[-1][2] + [position])
        else:
            words.append((piece.removeprefix("Ġ"), position, [position]))
    return words


def test_word_level_tasks_label_whole_words_of_a_byte_level_tokenizer():
    tok = roberta_tokenizer()
    documents = documents_from_records([{"paragraphs": [["Marie Curie studied radioactive decay in Paris.",
                                                         "The river flows past Paris."],
                                                        ["People live near the river, in Curie town."]],
                                         "entities": ["Marie Curie"]}])
    builder = Ernie2DataBuilder(tok, max_length=64, seed=0)
    capital = builder.capitalization(documents)
    relation = builder.token_document_relation(documents)
    assert relation["input_ids"] == capital["input_ids"] and len(capital) == 2
    words = [byte_level_words(tok, row["input_ids"][1:-1]) for row in capital]
    assert [[text for text, _, _ in row] for row in words] == [
        ["Marie", "Curie", "studied", "radioactive", "decay", "in", "Paris", ".", "The", "river", "flows", "past",
         "Paris", "."],
        ["People", "live", "near", "the", "river", ",", "in", "Curie", "town", "."]]
    assert sum(len(pieces) > 1 for row in words for _, _, pieces in row) >= 10  # words of several pieces
    shared = {"the", "river", "in", "curie"}  # words of both paragraphs, whatever their case
    for row, capital_row, relation_row in zip(words, capital, relation, strict=True):
        capital_labels, relation_labels = capital_row["labels"][1:-1], relation_row["labels"][1:-1]
        # a word's label sits on its first piece; the pieces after it have none
        assert [capital_labels[first] for _, first, _ in row] == [
            int(text[0].isupper()) if text[0].isalpha() else -100 for text, _, _ in row]
        assert [relation_labels[first] for _, first, _ in row] == [
            int(text.lower() in shared) if any(c.isalnum() for c in text) else -100 for text, _, _ in row]
        for labels in (capital_labels, relation_labels):
            assert all(labels[position] == -100 for _, _, pieces in row for position in pieces[1:])
    masked_inside = 0
    for seed in range(6):
        masked = Ernie2DataBuilder(tok, max_length=64, seed=seed, mask_probability=0.4).knowledge_masking(documents)
        for row, original in zip(masked, words, strict=True):
            chosen = [label != -100 for label in row["labels"][1:-1]]
            # every word is masked whole or not at all
            for _, _, pieces in original:
                assert len({chosen[position] for position in pieces}) == 1
                masked_inside += len(pieces) > 1 and chosen[pieces[0]]
    assert masked_inside > 0


def test_encoders_of_another_attention_are_refused(tmp_path):
    from transformers import DebertaV2Config, DebertaV2Model

    folder = tmp_path / "deberta"
    DebertaV2Model(DebertaV2Config(vocab_size=40, num_hidden_layers=1, **SIZES)).save_pretrained(folder)
    with pytest.raises(HfExtError, match="deberta-v2 model: its attention is not BERT's"):
        load_pretraining_model(folder)
