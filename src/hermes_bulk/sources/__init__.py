"""Finding items in a source, and reading one item again to see whether it changed.

| source                         | one item per        | item name             |
|--------------------------------|---------------------|-----------------------|
| directory, searched recursively| UTF-8 text file     | relative path         |
| `.csv` with a header row       | data row            | row:1, row:2, …       |
| `.json` with a top-level array | array element       | record:1, record:2, … |
| `.jsonl`                       | non-blank line      | line:1, line:2, …     |
| any other file                 | the whole file      | the file name         |

Discovery streams: records are parsed one at a time from a binary file, and each item remembers
the byte offset where its record starts, so a worker can re-read just that record to check that
the source has not changed (DESIGN.md invariant 4). Content is never truncated.

Only regular files are read (DESIGN.md invariant 11): every open is non-blocking and checked
with fstat before a byte is read, so a FIFO, device or directory put in a file's place is
refused with a reason instead of hanging or filling memory.
"""

from .changes import source_changed
from .discovery import Source, kind_of
from .items import DEFAULT_MAX_ITEM_BYTES, WHOLE_FILE, Skipped, SourceItem, content_hash, stat_sig
from .regular_files import NotRegularFile, read_regular_file
from .rows import line_at, render_csv_row

__all__ = [
    "DEFAULT_MAX_ITEM_BYTES",
    "WHOLE_FILE",
    "NotRegularFile",
    "Skipped",
    "Source",
    "SourceItem",
    "content_hash",
    "kind_of",
    "line_at",
    "read_regular_file",
    "render_csv_row",
    "source_changed",
    "stat_sig",
]
