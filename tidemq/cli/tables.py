"""Plain-text tables for the client commands: one header line, one line per row, columns
separated by at least two spaces, numbers right-aligned. Cells never contain a newline, so
``awk``/``cut`` and ``grep`` work on the output; ``--json`` is the format for programs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Cell = str | int | float | bool | None


def cell_text(value: Cell) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = str(value)
    return text.replace("\r", " ").replace("\n", " ")


def render(headers: Sequence[str], rows: Sequence[Sequence[Cell]]) -> list[str]:
    """The table's lines (without newlines); an empty table is its header line alone."""
    texts = [[cell_text(c) for c in row] for row in rows]
    # A column of numbers (a missing one among them included) is right-aligned.
    numeric = [
        any(row[i] is not None for row in rows)
        and all(
            row[i] is None or (isinstance(row[i], int | float) and not isinstance(row[i], bool))
            for row in rows
        )
        for i in range(len(headers))
    ]
    widths = [max([len(h)] + [len(t[i]) for t in texts]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(widths[i]) if numeric[i] else c.ljust(widths[i]) for i, c in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    return [line(list(headers))] + [line(t) for t in texts]


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Cell]]) -> None:
    for text in render(headers, rows):
        print(text)


def print_rows(columns: Sequence[tuple[str, str]], rows: Sequence[Mapping[str, Cell]]) -> None:
    """A table of dicts: ``columns`` are (header, key) pairs."""
    print_table([h for h, _ in columns], [[r[k] for _, k in columns] for r in rows])
