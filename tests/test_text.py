"""tfbigconv/text.py: bytes and tables as explain() and the memory report print them."""
from tfbigconv.text import fmt_bytes, render_table


def test_fmt_bytes_picks_the_largest_unit_reached():
    assert fmt_bytes(0) == "0 B" and fmt_bytes(1023) == "1023 B"
    assert fmt_bytes(1024) == "1.0 KiB" and fmt_bytes(3 << 19) == "1.5 MiB"
    assert fmt_bytes(5 << 30) == "5.0 GiB"
    # The advice's differences are negative.
    assert fmt_bytes(-(3 << 29)) == "-1.5 GiB" and fmt_bytes(-5) == "-5 B"


def test_render_table_pads_each_column_to_its_widest_cell():
    lines = render_table(["a", "long head"], [[1, "x"], ["wide cell", None]])
    assert lines == ["| a         | long head |",
                     "|-----------|-----------|",
                     "| 1         | x         |",
                     "| wide cell | None      |"]
    assert render_table(["h"], []) == ["| h |", "|---|"]
