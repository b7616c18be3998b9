"""fedpriv.report.write_table: one Markdown row per row whatever its text holds, CSV as is."""
import csv

from fedpriv.report import md_cell, write_table


def test_md_cell_escapes_pipes_and_shows_line_breaks():
    assert md_cell("Chat:\n\nHey | you?\r\nok") == "Chat: ⏎  ⏎ Hey \\| you? ⏎ ok"
    assert md_cell("") == "" and md_cell("plain") == "plain" and md_cell(None) == ""
    assert md_cell("a\u2028b") == "a ⏎ b"  # any line boundary str.splitlines knows
    assert md_cell(0.123456) == "0.1235" and md_cell(3) == "3" and md_cell("trail\n") == "trail"


def test_write_table_keeps_one_markdown_row_per_row_and_the_csv_raw(tmp_path):
    rows = [{"a": "x | y", "b|c": "line one\nline two"}, {"a": 1.5, "b|c": None}]
    csv_path, md_path = write_table(rows, str(tmp_path), "t", title="T")
    lines = open(md_path).read().splitlines()
    assert lines[:2] == ["# T", ""]
    table = lines[2:]
    assert table[1] == "|---|---|" and len(table) == 4
    for line in table[:1] + table[2:]:  # header and rows: two cells each, escapes aside
        assert len(line.replace("\\|", "").split("|")) == 4, line
    assert table[2] == "| x \\| y | line one ⏎ line two |"
    with open(csv_path, newline="") as f:
        back = list(csv.DictReader(f))
    assert back[0] == {"a": "x | y", "b|c": "line one\nline two"}
