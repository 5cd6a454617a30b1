"""Pet names in, clean training tensors out.

The data set is the City of Seattle "Seattle Pet Licenses" export. We read it (or any CSV
with a name column, or a text file of one name per line), clean each name the same way
everywhere (so a name's train/validation membership never depends on who loaded it), split
by a hash of the cleaned name, and encode every name as *one* sequence with a loss at every
position. The original write-up instead expanded every prefix into its own padded window,
which repeats each name's work about seven times.
"""

from __future__ import annotations

import csv
import io
import os
import re
import unicodedata
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from petmodel.errors import PetmodelError

DEFAULT_ALPHABET = "abcdefghijklmnopqrstuvwxyz .-"
NAME_COLUMNS = ("animal's name", "animal_s_name", "name")
SEATTLE_URL = "https://data.seattle.gov/api/views/jguv-t9rb/rows.csv?accessType=DOWNLOAD"
BOUNDARY = 0  # token that starts every input and ends every target; characters are 1..V
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class Alphabet:
    """Characters a name may use; token 0 is the start/stop boundary, so ids are 1-based."""

    chars: str = DEFAULT_ALPHABET

    def __post_init__(self) -> None:
        if not self.chars:
            raise PetmodelError("The alphabet is empty; give at least one character.")
        if len(set(self.chars)) != len(self.chars):
            raise PetmodelError(f"The alphabet {self.chars!r} repeats a character; list each once.")

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + 1

    def lookup_table(self) -> torch.Tensor:
        """Byte → token id (−1 for bytes outside the alphabet), for vectorised encoding."""
        table = torch.full((256,), -1, dtype=torch.long)
        for i, ch in enumerate(self.chars, start=1):
            if ord(ch) > 127:
                raise PetmodelError("The alphabet may only hold ASCII characters.")
            table[ord(ch)] = i
        return table

    def encode(self, text: str) -> list[int]:
        index = {c: i for i, c in enumerate(self.chars, start=1)}
        return [index[c] for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[i - 1] for i in ids if 0 < i <= len(self.chars))

    def check(self, text: str, what: str = "The prefix") -> None:
        bad = sorted({c for c in text if c not in self.chars})
        if bad:
            raise PetmodelError(
                f"{what} {text!r} uses {''.join(bad)!r}, which is not in the alphabet "
                f"{self.chars!r}; use only those characters."
            )


def clean_name(raw: str | None, alphabet: Alphabet = Alphabet(), fold_accents: bool = True) -> str | None:
    """Normalise one raw name, or return None when it cannot be kept.

    Accents are folded (NFKD, combining marks dropped: "Alyzée" → "alyzee"), then the name is
    lower-cased, trimmed, and runs of white space collapse to one space. A name that still
    holds a character outside the alphabet (digits, brackets, quotes) is dropped whole rather
    than mangled: "Bella (2)" is not evidence for the name "bella".
    """
    if raw is None:
        return None
    text = raw
    if fold_accents:
        text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    text = _SPACES.sub(" ", text.lower()).strip()
    if not text or any(c not in alphabet.chars for c in text):
        return None
    return text


def is_validation(name: str) -> bool:
    """The project-wide held-out rule: a distinct cleaned name is in validation when crc32 % 10 == 0."""
    return zlib.crc32(name.encode("utf-8")) % 10 == 0


@dataclass
class NameCorpus:
    """Cleaned names of one source, split into training and validation."""

    names: list[str]
    source: str
    alphabet: Alphabet
    rows: int
    dropped: int
    train_names: list[str] = field(default_factory=list)
    val_names: list[str] = field(default_factory=list)

    @property
    def kept(self) -> int:
        return len(self.names)

    def summary(self) -> str:
        return (
            f"{self.kept:,} names kept, {self.dropped:,} dropped of {self.rows:,} rows; "
            f"{len(self.train_names):,} training and {len(self.val_names):,} validation names"
        )


def split_names(names: Sequence[str], distinct_train: bool = True) -> tuple[list[str], list[str]]:
    """Split by the held-out rule; validation counts each distinct name once.

    Training also uses each distinct name once by default: the quality measure weighs every
    distinct name equally, and on this data that trains to a lower validation NLL (2.29 vs
    2.36 after 30 s) and to more varied samples than repeating "bella" 400 times.
    """
    train_all = [n for n in names if not is_validation(n)]
    train = sorted(set(train_all)) if distinct_train else train_all
    val = sorted({n for n in names if is_validation(n)})
    return train, val


def build_corpus(raw_names: Sequence[str | None], *, source: str, alphabet: Alphabet = Alphabet(),
                 fold_accents: bool = True, distinct_train: bool = True) -> NameCorpus:
    names = [n for n in (clean_name(r, alphabet, fold_accents) for r in raw_names) if n]
    rows = len(raw_names)
    if not names:
        raise PetmodelError(
            f"None of the {rows:,} names in {source} uses only the alphabet {alphabet.chars!r}; "
            "check the file or widen the alphabet."
        )
    train, val = split_names(names, distinct_train)
    if not train or not val:
        raise PetmodelError(
            f"{source} has too few distinct names ({len(set(names))}) to hold out a validation split; "
            "give a file with more names."
        )
    return NameCorpus(names, source, alphabet, rows, rows - len(names), train, val)


def read_raw_names(path: str | os.PathLike) -> list[str]:
    """Raw names from a CSV with a name column, or a text file with one name per line."""
    p = Path(path)
    if not p.exists():
        raise PetmodelError(f"The data file {p} does not exist; check the path.")
    if p.is_dir():
        raise PetmodelError(f"{p} is a folder; give a CSV or text file of names.")
    blob = p.read_bytes()
    if not blob.strip():
        raise PetmodelError(f"The data file {p} is empty; give a CSV or text file of names.")
    if b"\x00" in blob[:8192]:
        raise PetmodelError(f"{p} is a binary file, not a CSV or text file of names.")
    try:
        text = blob.decode("utf-8-sig")
    except UnicodeDecodeError:
        try:
            text = blob.decode("cp1252")
        except UnicodeDecodeError:
            raise PetmodelError(f"{p} is not UTF-8 text; save it as a UTF-8 CSV or text file.") from None
    first_line = text.split("\n", 1)[0]
    looks_csv = p.suffix.lower() in {".csv", ".tsv"} or "," in first_line
    if not looks_csv:
        return [line for line in text.splitlines() if line.strip()]
    try:
        dialect = csv.excel_tab if p.suffix.lower() == ".tsv" else csv.excel
        reader = csv.reader(io.StringIO(text), dialect)
        header = next(reader)
        columns = [h.strip().lower() for h in header]
        for wanted in NAME_COLUMNS:
            if wanted in columns:
                col = columns.index(wanted)
                return [row[col] for row in reader if len(row) > col]
    except csv.Error as err:
        raise PetmodelError(f"{p} is not a readable CSV ({err}); fix the file or give one name per line.") from None
    raise PetmodelError(
        f"{p} has no name column (expected \"Animal's Name\", \"animal_s_name\" or \"name\"); "
        "rename the column or give a text file with one name per line."
    )


def load_corpus(source: str | os.PathLike | None = None, *, alphabet: Alphabet = Alphabet(),
                fold_accents: bool = True, distinct_train: bool = True, progress: bool = False) -> NameCorpus:
    """Read, clean and split names; with no source, use the cached official export (downloading once)."""
    if source is None:
        from petmodel.download import fetch_seattle_csv

        source = fetch_seattle_csv(progress=progress)
    return build_corpus(read_raw_names(source), source=str(source), alphabet=alphabet,
                        fold_accents=fold_accents, distinct_train=distinct_train)


@dataclass
class EncodedNames:
    """Padded name batch: ``x`` starts with the boundary, ``y`` ends with it, −1 marks padding."""

    x: torch.Tensor  # (N, T) long
    y: torch.Tensor  # (N, T) long
    lengths: torch.Tensor  # (N,) long: predicted positions per name (len(name) + 1)

    def __len__(self) -> int:
        return self.x.shape[0]

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


def encode_names(names: Sequence[str], alphabet: Alphabet) -> EncodedNames:
    """Encode all names at once: one byte buffer, one table lookup, one scatter."""
    if not names:
        raise PetmodelError("There are no names to encode.")
    lengths = torch.tensor([len(n) for n in names], dtype=torch.long)
    flat = torch.frombuffer(bytearray("".join(names).encode("ascii")), dtype=torch.uint8).long()
    ids = alphabet.lookup_table()[flat]
    if (ids < 0).any():
        raise PetmodelError("A name holds a character outside the alphabet; clean names before encoding.")
    n, t = len(names), int(lengths.max()) + 1
    row = torch.repeat_interleave(torch.arange(n), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    col = torch.arange(len(flat)) - torch.repeat_interleave(starts, lengths)
    x = torch.full((n, t), -1, dtype=torch.long)
    y = torch.full((n, t), -1, dtype=torch.long)
    x[:, 0] = BOUNDARY
    x[row, col + 1] = ids
    y[row, col] = ids
    y[torch.arange(n), lengths] = BOUNDARY
    x[x < 0] = BOUNDARY  # padding inputs are never scored; any valid id will do
    return EncodedNames(x, y, lengths + 1)
