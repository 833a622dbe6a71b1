"""Bad input for MT-DNN's converter and commands: the cases `tests/test_bad_input.py` runs (see `tests/bad_input.py`
for the builders and the checks)."""

import math
import shutil

import torch
from bad_input import (
    MTDNN,
    OPTIMUS,
    UT,
    alias_bomb,
    foreign_code,
    nan_logits,
    payload,
    port_in_use,
    random_bytes,
    shifted,
    truncate,
    written,
)


def mtdnn_checkpoint(tmp, change_state=None, **options):
    """The fixture's checkpoint with the task definitions left out (converted with --task-def) and `options`."""
    from hf_ext.models.mtdnn.conversion import read_checkpoint

    state, opt = read_checkpoint(MTDNN / "model_0.pt")
    opt = {key: value for key, value in opt.items() if key != "task_def_list"} | options
    if change_state is not None:
        change_state(state)
    torch.save({"state": state, "config": opt}, tmp / "model.pt")
    return ["convert", "mtdnn", tmp / "model.pt", tmp / "out", "--task-def", MTDNN / "task_def.yml"]


def config_folder(tmp, config_class, **sizes):
    """A folder holding only the config.json of another architecture (the encoder check reads no weights)."""
    import transformers

    folder = tmp / "model"
    getattr(transformers, config_class)(**sizes).save_pretrained(folder)
    return folder


def mtdnn_train_from(tmp, config_class, **sizes):
    return ["mtdnn", "train", config_folder(tmp, config_class, **sizes), "--task-def", MTDNN / "task_def.yml",
            "--train", "cola=b.json", "--output-dir", tmp / "out"]


TOKEN_TASK_DEFS = """\
ner:
  data_format: Seqence
  labels: [O, B-PER, I-PER]
  n_class: 3
  task_type: SeqenceLabeling
qa:
  data_format: CLUE_SPAN
  n_class: 2
  task_type: SpanClassification
gen:
  n_class: 2
  task_type: SeqenceGeneration
qnnli:
  data_format: PremiseAndMultiHypothesis
  labels: [not_entailment, entailment]
  n_class: 1
  task_type: Ranking
"""


def token_task_run(tmp, task, data_name, data, *extra):
    """`hf-ext mtdnn train` of a tiny BERT encoder (with its tokenizer) under a new head for a token-level task."""
    from transformers import BertConfig, BertModel, BertTokenizer

    encoder = tmp / "encoder"
    BertModel(BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=8)).save_pretrained(encoder)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "john", "went", "to", "paris", "who", "?"]
    BertTokenizer(vocab={word: index for index, word in enumerate(words)}).save_pretrained(encoder)
    (tmp / "tasks.yml").write_text(TOKEN_TASK_DEFS)
    (tmp / data_name).write_text(data)
    return ["mtdnn", "train", encoder, "--task-def", tmp / "tasks.yml", "--train", f"{task}={tmp / data_name}",
            "--output-dir", tmp / "out", *extra]


def mtdnn(tmp, *extra):
    return ["convert", "mtdnn", MTDNN / "model_0.pt", tmp / "out", *extra]


TOKEN_TASKS = MTDNN.parent / "token_tasks"  # a BERT encoder with token-level heads (tests/fixtures/README.md)


def token_task_def(tmp, *changes):
    """The token-task fixture converted with its task_def.yml changed (each `(old, new)`, first occurrence)."""
    text = (TOKEN_TASKS / "task_def.yml").read_text()
    for old, new in changes:
        assert old in text
        text = text.replace(old, new, 1)
    return ["convert", "mtdnn", TOKEN_TASKS / "model_0.pt", tmp / "out", "--task-def",
            written(tmp / "t.yml", text)]


def mtdnn_file(make):
    def build(tmp):
        make(tmp / "model.pt")
        return ["convert", "mtdnn", tmp / "model.pt", tmp / "out"]
    return build


CONVERSION_CASES = {
    "missing checkpoint": (lambda tmp: ["convert", "mtdnn", tmp / "model.pt", tmp / "out"], 1, "does not exist"),
    "zero-byte checkpoint": (mtdnn_file(lambda p: p.write_bytes(b"")), 1, "is empty"),
    "truncated checkpoint": (mtdnn_file(lambda p: (shutil.copy(MTDNN / "model_0.pt", p), truncate(p))), 1,
                             "truncated or corrupt"),
    "random checkpoint": (mtdnn_file(lambda p: random_bytes(p)), 1, "not a torch checkpoint"),
    "code-running checkpoint": (mtdnn_file(payload), 1, "refusing to load"),
    "foreign checkpoint": (mtdnn_file(lambda p: shutil.copy(UT / "state_dict.pt", p)), 1,
                           "not an MT-DNN checkpoint"),
    "string size": (lambda tmp: mtdnn_checkpoint(tmp, hidden_size="32"), 1, "invalid BERT settings"),
    "boolean size": (lambda tmp: mtdnn_checkpoint(tmp, num_hidden_layers=True), 1, "invalid BERT settings"),
    "unsupported encoder type": (lambda tmp: mtdnn_checkpoint(tmp, encoder_type=3), 1,
                                 "encoder_type XLNET is not supported (supported: BERT, ROBERTA, DEBERTA, ELECTRA)"),
    "unknown encoder type": (lambda tmp: mtdnn_checkpoint(tmp, encoder_type="roberta"), 1,
                             "encoder_type 'roberta' is not one of the original's encoder types"),
    "encoder type of another model type": (lambda tmp: mtdnn_checkpoint(tmp, encoder_type=7), 1,
                                           "encoder_type ELECTRA but the config's model_type is 'bert'"),
    "invalid DeBERTa settings": (lambda tmp: mtdnn_checkpoint(tmp, encoder_type=6, model_type="deberta",
                                                              relative_attention=True, pos_att_type=7), 1,
                                 "invalid DeBERTa settings"),
    "zero attention heads": (lambda tmp: mtdnn_checkpoint(tmp, num_attention_heads=0), 1,
                             "num_attention_heads must be a positive integer"),
    "negative layers": (lambda tmp: mtdnn_checkpoint(tmp, num_hidden_layers=-1), 1,
                        "num_hidden_layers must be a positive integer"),
    "NaN weights": (lambda tmp: mtdnn_checkpoint(
        tmp, lambda st: st["bert.embeddings.LayerNorm.weight"].fill_(math.nan)), 1, "NaN or infinite"),
    "integer weights": (lambda tmp: mtdnn_checkpoint(
        tmp, lambda st: st.update({"bert.embeddings.LayerNorm.bias": st["bert.embeddings.LayerNorm.bias"].long()})),
                        1, "int64 values"),
    "malformed task definitions": (lambda tmp: ((tmp / "t.yml").write_text("mnli: [\n"),
                                                mtdnn(tmp, "--task-def", tmp / "t.yml"))[1], 1, "malformed"),
    "alias bomb in the task definitions": (lambda tmp: (written(tmp / "t.yml", "sst:\n  task_type: Classification\n"
                                                                f"  n_class: 2\n  labels: {alias_bomb()}\n"),
                                                        mtdnn(tmp, "--task-def", tmp / "t.yml"))[1], 1,
                                           "its aliases expand it by more than 100000 values (an alias bomb)"),
    "corrupt reference": (lambda tmp: (random_bytes(tmp / "r.safetensors"),
                                       mtdnn(tmp, "--reference", tmp / "r.safetensors"))[1], 1,
                          "not a readable safetensors file"),
    "reference of another model": (lambda tmp: mtdnn(tmp, "--reference", OPTIMUS / "reference.safetensors"), 1,
                                   "holds none of the outputs"),
    "NaN in the reference": (lambda tmp: (nan_logits(MTDNN / "reference.safetensors", tmp / "r.safetensors"),
                                          mtdnn(tmp, "--reference", tmp / "r.safetensors"))[1], 1,
                          "cola logits holds NaN values"),
    "reference beyond tolerance": (lambda tmp: mtdnn(
        tmp, "--reference", shifted(MTDNN / "reference.safetensors", tmp / "r.safetensors", "cola.logits")), 1,
        "cola logits: max abs error 5 exceeds its tolerance (atol 5e-05, rtol 0.0001)"),
    "token head of another size than its task definition": (lambda tmp: token_task_def(
        tmp, ("n_class: 6", "n_class: 7"), ("  - DT\n", "  - DT\n  - JJ\n")), 1,
        "task pos (scoring_list.1, sequence_labeling): the task definition says 7 output(s) (n_class), the weights "
        "scoring_list.1.weight have 6"),
    "bad group size": (lambda tmp: mtdnn(tmp, "--group-size", "qnnli=x"), 2, "expected TASK=K"),
}


def sst_shards(tmp, damaged=False, soft_labels_on_some=False):
    """Two shards of 16 rows of the sample model's sst task; with `damaged`, line 4 of the second stops being JSON
    (read ahead before the first step; tests/mtdnn/test_mtdnn_streaming.py checks the steps kept before such a line
    and the resumed run); with `soft_labels_on_some`, every third row has a `softlabel`."""
    import json

    folder = tmp / "sst"
    folder.mkdir()
    for shard in range(2):
        lines = [json.dumps({"uid": f"{shard}-{i}", "label": i % 2, "token_id": [2, 5 + i % 2, 3],
                             "type_id": [0, 0, 0],
                             **({"softlabel": [0.5, 0.5]} if soft_labels_on_some and i % 3 == 0 else {})})
                 for i in range(16)]
        if damaged and shard == 1:
            lines[3] = '{"uid": "cut'
        (folder / f"shard-{shard}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def tsv_shards(tmp, damaged_line):
    """Two GLUE TSV shards of the sample model's sst task; line 3 of the second is `damaged_line`."""
    folder = tmp / "sst"
    folder.mkdir()
    for shard in range(2):
        lines = ["sentence\tlabel\n", *(f"a man\t{i % 2}\n" for i in range(8))]
        if shard == 1:
            lines[2] = damaged_line
        (folder / f"shard-{shard}.tsv").write_text("".join(lines))
    return folder


def streamed_train(tmp, folder, source, *extra):
    """`hf-ext mtdnn train --streaming` of the sample model's sst task from `source`."""
    return ["mtdnn", "train", folder, "--train", f"sst={source}", "--output-dir", tmp / "out", "--streaming",
            "--max-steps", "4", *extra]


# the commands run on this model folder (a fixture of tests/mtdnn/fixtures_mtdnn.py)
COMMAND_FOLDER = "mtdnn_sample_folder"

COMMAND_CASES = {
    "serve on a port in use": (lambda tmp, folder: ["serve", folder, "--port", port_in_use()], 1,
                               "cannot listen on 127.0.0.1:"),
    "mtdnn train from an unconverted checkpoint": (lambda tmp, folder: [
        "mtdnn", "train", MTDNN / "model_0.pt", "--train", "a=b.tsv", "--output-dir", tmp / "out"], 2,
        "looks like an original MT-DNN checkpoint, not a model folder: convert it first (hf-ext convert mtdnn"),
    "mtdnn train reporting to an unknown tracker": (lambda tmp, folder: [
        "mtdnn", "train", folder, "--train", "a=b.tsv", "--output-dir", tmp / "out", "--report-to", "tensorbord"], 2,
        "argument --report-to: unknown tracker 'tensorbord'"),
    "mtdnn train with a bad warmup": (lambda tmp, folder: ["mtdnn", "train", folder, "--train", "a=b.tsv",
                                                           "--output-dir", tmp / "out", "--warmup", "2"], 2,
                                      "argument --warmup: must be in [0, 1)"),
    "mtdnn train with a causal language model as the encoder": (lambda tmp, folder: mtdnn_train_from(
        tmp, "GPT2Config", n_embd=16, n_layer=1, n_head=2), 1,
        "the encoder must be a bidirectional encoder (BERT, RoBERTa, DeBERTa, ELECTRA, ModernBERT, ...), but 'gpt2' "
        "is not one"),
    "mtdnn train with an encoder-decoder as the encoder": (lambda tmp, folder: mtdnn_train_from(
        tmp, "BartConfig", d_model=16, encoder_layers=1, decoder_layers=1), 1,
        "the encoder must be an encoder model, but 'bart' is an encoder-decoder"),
    "mtdnn train with an --adv-* option but no --adv-train": (lambda tmp, folder: [
        "mtdnn", "train", folder, "--train", "a=b.tsv", "--output-dir", tmp / "out", "--adv-k", "2"], 1,
        "--adv-k needs --adv-train"),
    "mtdnn train with an unknown SMART norm": (lambda tmp, folder: [
        "mtdnn", "train", folder, "--train", "a=b.tsv", "--output-dir", tmp / "out", "--adv-train",
        "--adv-p-norm", "l3"], 1, "--adv-p-norm must be one of inf, l2, l1, got 'l3'"),
    "mtdnn train with tags that are not the task's labels": (lambda tmp, folder: token_task_run(
        tmp, "ner", "ner.conll", "john B-PER\nwent O\nparis B-LOC\n"), 1,
        "sentence 1: tag(s) 'B-LOC' are not labels of task ner (O, B-PER, I-PER)"),
    "mtdnn train with an answer outside its context": (lambda tmp, folder: token_task_run(
        tmp, "qa", "qa.jsonl", '{"id": "a", "question": "who ?", "context": "john went to paris", '
        '"answers": {"text": ["paris"], "answer_start": [40]}}\n'), 1,
        "the answer 'paris' is not the context's text at answer_start 40 (a span outside the text?)"),
    "mtdnn train --adv-train with a sequence labeling task": (lambda tmp, folder: token_task_run(
        tmp, "ner", "ner.conll", "john B-PER\n", "--adv-train"), 1,
        "--adv-train covers classification, regression, ranking tasks (as the original's SmartPerturbation), not "
        "ner (sequence_labeling)"),
    "mtdnn train with a task type the port lacks": (lambda tmp, folder: token_task_run(
        tmp, "gen", "gen.json", ""), 1,
        "task gen: task_type 'SeqenceGeneration' is not supported (supported: Classification, Regression, Ranking, "
        "SeqenceLabeling, SpanClassification, SpanClassificationYN)"),
    "mtdnn train from a folder with its own code": (lambda tmp, folder: [
        "mtdnn", "train", foreign_code(tmp), "--train", "a=b.tsv", "--output-dir", tmp / "out"], 1,
        "only with --trust-remote-code"),
    # --device and --dtype (hf_ext.cli_utils.add_device_arguments)
    "train in float16 on the CPU": (lambda tmp, folder: [
        "mtdnn", "train", folder, "--train", "a=b.tsv", "--output-dir", tmp / "out", "--device", "cpu", "--dtype",
        "float16"], 1, "--dtype float16 trains only on CUDA"),
    "distill on a CUDA device the machine lacks": (lambda tmp, folder: [
        "mtdnn", "distill", folder, "--teacher", folder, "--train", "a=b.tsv", "--output-dir", tmp / "out",
        "--device", "cuda:99"], 2, "argument --device: cuda:99: "),
    # --streaming (hf_ext.models.mtdnn.data.read_task_stream, hf_ext.streaming)
    "streamed mtdnn train from a folder without shards": (lambda tmp, folder: streamed_train(
        tmp, folder, (tmp / "sst").mkdir() or tmp / "sst"), 1,
        "sst holds no shards (*.json, *.jsonl, *.json.gz, *.jsonl.gz, *.tsv)"),
    "streamed mtdnn train from a shard that does not exist": (lambda tmp, folder: streamed_train(
        tmp, folder, tmp / "gone.jsonl"), 1, "gone.jsonl does not exist"),
    "streamed mtdnn train from a glob matching no shard": (lambda tmp, folder: streamed_train(
        tmp, folder, tmp / "sst-*.jsonl"), 1, "no sst training data shard matches"),
    "streamed mtdnn train from a Hub dataset while offline": (lambda tmp, folder: streamed_train(
        tmp, folder, "someone/sst"), 1, "sst training data someone/sst is neither a local path nor a reachable Hub "
        "dataset"),
    "streamed mtdnn train from a shard that stops being JSON halfway": (lambda tmp, folder: streamed_train(
        tmp, folder, sst_shards(tmp, damaged=True)), 1, "shard-1.jsonl, line 4: not JSON ("),
    "streamed mtdnn train from rows of which some have a softlabel": (lambda tmp, folder: streamed_train(
        tmp, folder, sst_shards(tmp, soft_labels_on_some=True)), 1,
        "sst training data: some rows have a softlabel and some do not"),
    "streamed mtdnn train from an empty shard": (lambda tmp, folder: streamed_train(
        tmp, folder, written(tmp / "sst.jsonl", "")), 1, "sst.jsonl: no rows"),
    "streamed mtdnn train from a GLUE test file without labels": (lambda tmp, folder: streamed_train(
        tmp, folder, written(tmp / "sst.tsv", "index\tsentence\n0\ta man\n")), 1,
        "sst.tsv: training data needs labels; this GLUE sst file has no 'label' column (a test file?)"),
    "streamed mtdnn train from a TSV shard with a line missing a field": (lambda tmp, folder: streamed_train(
        tmp, folder, tsv_shards(tmp, "a man\n")), 1,
        "shard-1.tsv, line 3: 1 tab-separated fields where its first line has 2"),
    "streamed mtdnn train from a TSV shard with a line with a field too many": (lambda tmp, folder: streamed_train(
        tmp, folder, tsv_shards(tmp, "a man\t1\t1\n")), 1,
        "shard-1.tsv, line 3: 3 tab-separated fields where its first line has 2"),
    "streamed mtdnn train from shards of two formats": (lambda tmp, folder: streamed_train(
        tmp, folder, (sst_shards(tmp), written(tmp / "sst" / "more.tsv", "sentence\tlabel\na man\t1\n"))[0]), 1,
        "mixes formats (.jsonl, .tsv): give one task's shards in one format"),
    "streamed mtdnn train of a ranking task from single sentences": (lambda tmp, folder: token_task_run(
        tmp, "qnnli", "qnli.tsv", "sentence\tlabel\nwho ?\t1\nwho ?\t0\n", "--layout", "qnnli=sst", "--streaming",
        "--max-steps", "2"), 1, "ranking task qnnli reads GLUE TSV rows as the original's QNLI ranking does (pairs of "
        "candidates with entailment labels, group size 2); the layout sst does not fit"),
    "streamed mtdnn train of a ranking task from rows that form no group": (lambda tmp, folder: token_task_run(
        tmp, "qnnli", "qnli.tsv", "question\tsentence\tlabel\nwho ?\tjohn\tentailment\nwho ?\tparis\t"
        "entailment\n", "--streaming", "--max-steps", "2"), 1,
        "qnli.tsv has no pair of rows with one question and one positive and one negative candidate"),
    "streamed mtdnn train of a span task from a TSV file": (lambda tmp, folder: token_task_run(
        tmp, "qa", "qa.tsv", "question\tsentence\tlabel\nwho ?\tjohn\t1\n", "--streaming", "--max-steps", "2"), 1,
        "qa.tsv: span task qa reads SQuAD data (.json or .jsonl, also gzipped)"),
    "streamed mtdnn train without --max-steps": (lambda tmp, folder: streamed_train(
        tmp, folder, sst_shards(tmp))[:-2], 1, "--streaming needs --max-steps (a stream has no length)"),
    "streamed mtdnn train with --mix-opt 1": (lambda tmp, folder: streamed_train(
        tmp, folder, sst_shards(tmp), "--mix-opt", "1"), 1, "--mix-opt 1 orders the batches of an epoch"),
    "streamed mtdnn train keeping the best checkpoint": (lambda tmp, folder: streamed_train(
        tmp, folder, sst_shards(tmp), "--eval", "sst=dev.json", "--eval-steps", "2", "--metric-for-best-model",
        "sst_accuracy"), 1, "--metric-for-best-model keeps the best checkpoint of a map-style run"),
    "task probabilities without --streaming": (lambda tmp, folder: [
        "mtdnn", "train", folder, "--train", "sst=a.json", "--output-dir", tmp / "out", "--task-probabilities",
        "sst=1"], 1, "--task-probabilities needs --streaming"),
    "task probabilities missing a task": (lambda tmp, folder: streamed_train(
        tmp, folder, sst_shards(tmp), "--train", "sts=b.json", "--task-probabilities", "sst=1"), 1,
        "--task-probabilities names each --train task once (sst, sts), got sst"),
    "task probabilities of zero": (lambda tmp, folder: streamed_train(
        tmp, folder, sst_shards(tmp), "--task-probabilities", "sst=0"), 1,
        "--task-probabilities sst=0: must be a finite number > 0"),
    "task probabilities and a ratio": (lambda tmp, folder: streamed_train(
        tmp, folder, sst_shards(tmp), "--task-probabilities", "sst=1", "--ratio", "0.5"), 1,
        "--task-probabilities and --ratio both set the tasks' shares: give one"),
    "checkpoint steps without --streaming": (lambda tmp, folder: [
        "mtdnn", "train", folder, "--train", "sst=a.json", "--output-dir", tmp / "out", "--save-steps", "5"], 1,
        "--save-steps needs --streaming"),
}
