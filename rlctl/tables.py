"""Tables that never cut a name, path or command: a rich table prints as a table only when the console is wide
enough for every cell to wrap at spaces at most (a `no_wrap` column: not at all); otherwise each row prints as a
block, its first cell a heading and every other cell on its own `  header  value` line (a two-column table: one
`  key  value` line per row), never wrapped by rlctl (a terminal shows a long line over two, and copies it as
one)."""

from __future__ import annotations

from typing import Any

WIDE = 1_000_000  # wide enough to measure a cell unwrapped


def fits(console: Any, table: Any) -> bool:
    """Whether `table`, laid out at the console's width, keeps every word whole: each column at least as wide as
    its longest word, or, with `no_wrap`, its longest line. Uses rich's own column sizing (private, but stable
    since rich 10)."""
    options = console.options
    extra = table._extra_width
    widths = table._calculate_column_widths(console, options.update_width(max(options.max_width - extra, 1)))
    for width, column in zip(widths, table.columns, strict=True):
        need = table._measure_column(console, options.update_width(WIDE), column)
        if width < (need.maximum if column.no_wrap else need.minimum):
            return False
    return True


def _text(console: Any, cell: Any) -> Any:
    from rich.text import Text

    if isinstance(cell, Text):
        return cell
    return console.render_str(cell) if isinstance(cell, str) else Text(str(cell))


def _line(console: Any, label: str, value: Any) -> None:
    """`label` then `value`: on a terminal the value wraps at spaces under itself where its longest word fits the
    width left, else (and off a terminal) it is one line the terminal may show over two."""
    from rich.table import Table
    from rich.text import Text

    longest = max((len(word) for word in value.plain.split()), default=0)
    if console.soft_wrap or longest > console.width - len(label):
        lines = value.split("\n", allow_blank=True)  # a cell's later lines under its first
        console.print(Text(label) + Text("\n" + " " * len(label)).join(lines), soft_wrap=True)
        return
    grid = Table.grid()
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(label, value)
    console.print(grid)


def show(console: Any, table: Any) -> None:
    """Print `table` whole at the console's width, or, where a cell would be cut or folded, row by row."""
    if fits(console, table):
        console.print(table)
        return

    if table.title:
        console.print(_text(console, table.title), soft_wrap=True)
    headers = [_text(console, c.header).plain for c in table.columns]
    pad = max((len(h) for h in headers[1:]), default=0)
    columns = [list(c.cells) for c in table.columns]
    rows = [[col[i] for col in columns] for i in range(table.row_count)]
    rows = [row for row in rows if any(_text(console, cell).plain.strip() for cell in row)]  # no spacer rows
    if table.show_footer and any(c.footer for c in table.columns):
        rows.append([c.footer for c in table.columns])
    if len(headers) == 2:  # a key and its value: one line each
        keys = [_text(console, row[0]) for row in rows]
        width = max((len(k.plain) for k in keys), default=0)
        for key, row in zip(keys, rows, strict=True):
            _line(console, f"  {key.plain.ljust(width)}  ", _text(console, row[1]))
        rows = []
    for row in rows:
        heading = _text(console, row[0]).copy()
        heading.stylize("bold")
        console.print(heading, soft_wrap=True)
        for header, cell in zip(headers[1:], row[1:], strict=True):
            text = _text(console, cell)
            if text.plain:
                _line(console, f"  {header.ljust(pad)}  ", text)
    if table.caption:
        console.print(_text(console, table.caption), soft_wrap=True)
