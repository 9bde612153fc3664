"""Bytes and tables as the package prints them: explain()'s and the memory
report's. A foundation module: it imports nothing of tfbigconv."""


def fmt_bytes(n):
    """n bytes in the largest binary unit it reaches, one decimal: "1.5 MiB",
    "-2.0 GiB" (the advice's differences), "512 B"."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def render_table(head, rows):
    """[line]: a Markdown table of the column names `head` and the `rows`
    (lists of cells, printed with str), each column as wide as its widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    return [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + \
        [line(r) for r in rows]
