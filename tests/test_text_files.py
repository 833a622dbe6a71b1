"""The shared readers of text data files: lines as written, JSON lines with their positions, one clear error line."""

import pytest

from hf_ext.errors import HfExtError
from hf_ext.text_files import json_lines, read_lines


def test_read_lines_drops_the_byte_order_mark_and_splits_on_newlines_only(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_bytes("\ufeffa\tb\r\nline with \u2028 inside\n".encode())
    assert read_lines(path, "GLUE file") == ["a\tb", "line with \u2028 inside", ""]


def test_json_lines_skips_blank_lines_and_names_the_bad_one(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n  \n[2, 3]\n')
    assert list(json_lines(path, "rows")) == [(f"{path}, line 1", {"a": 1}), (f"{path}, line 4", [2, 3])]
    path.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(HfExtError, match=r"rows.jsonl, line 2: not JSON"):
        list(json_lines(path, "rows"))


def test_missing_and_undecodable_files(tmp_path):
    with pytest.raises(HfExtError, match=r"^lexicon .*absent.txt does not exist$"):
        read_lines(tmp_path / "absent.txt", "lexicon")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(HfExtError, match=r"is not UTF-8 text \(invalid continuation byte at byte 3\)"):
        read_lines(tmp_path / "latin1.txt", "lexicon")
