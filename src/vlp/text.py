"""The text gate: what every piece of text that enters vlp from outside must be before anything uses it.

Text reaches vlp from command-line arguments, HTTP request bodies and annotation files. Python hands each of them
over as ``str`` even when it is not text: bytes that are not UTF-8 arrive as lone surrogates (``\\udc80``..``\\udcff``,
the ``surrogateescape`` of ``sys.argv`` and of :func:`vlp.data.ingest` readers) and a JSON string may spell a lone
surrogate outright (``"\\udc80"``). Such a ``str`` cannot be encoded, so the first library that does (a tokenizer, a
Parquet writer, a log line) fails with an error that names neither the input nor the fix. :func:`text_problem` says
what is wrong in words; :func:`checked_text` is the gate for a query or a question, with the one length limit
(``index.max_text_chars``) that ``vlp search``, ``vlp answer`` and ``vlp serve`` share. Bytes that have not been made
a ``str`` yet (a URL's query string, percent-decoded) go through :func:`bytes_problem`, the same gate.

A module of its own at the bottom of the layers: it imports nothing of vlp, so the CLI, the server and the data
readers can all use it.
"""

from __future__ import annotations

MAX_TEXT_CHARS = 1000  # a query or a question (the default of index.max_text_chars)
NUL = "\x00"


class TextError(ValueError):
    """Text that is not usable: not valid UTF-8, empty or too long. ``str(exc)`` is one line."""


def invalid_utf8(text: str) -> str | None:
    """Why ``text`` (a ``str``) is not valid Unicode text, or None.

    A lone surrogate from ``surrogateescape`` (``\\udc80``..``\\udcff``) stands for one byte that is not UTF-8 and is
    named as that byte; any other lone surrogate as its code point. Positions count characters from 0.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = text[exc.start]
        point = ord(char)
        if 0xDC80 <= point <= 0xDCFF:
            return f"is not valid UTF-8: the byte 0x{point - 0xDC00:02x} at character {exc.start} is not text"
        return f"is not valid UTF-8: a lone surrogate U+{point:04X} at character {exc.start}"
    return None


def text_problem(text: object, max_chars: int = 0) -> str | None:
    """Why ``text`` is not usable text of at most ``max_chars`` characters (0 = no limit), or None.

    The reason completes a sentence that starts with what the text is (``"the query " + reason``).
    """
    if not isinstance(text, str):
        return f"is a {type(text).__name__}, not text"
    bad = invalid_utf8(text)
    if bad:
        return bad
    if max_chars and len(text) > max_chars:
        return f"is {len(text)} characters long; at most {max_chars} are taken (index.max_text_chars)"
    return None


def bytes_problem(data: bytes, max_chars: int = 0) -> str | None:
    """Why ``data``, bytes taken off the wire as they came (a percent-decoded query parameter), is not usable text of
    at most ``max_chars`` characters, or None: :func:`text_problem`'s reasons (a byte that is not UTF-8 named as
    :func:`invalid_utf8` names it), or a NUL byte (0x00).
    """
    text = data.decode("utf-8", "surrogateescape")
    return text_problem(text, max_chars) or nul_problem(text)


def nul_problem(text: str) -> str | None:
    """Why ``text`` cannot be a query, a question or a field of a list: it holds a NUL, or None."""
    return f"holds a NUL byte (0x00) at character {text.index(NUL)}" if NUL in text else None


def checked_text(text: object, what: str = "query", max_chars: int = MAX_TEXT_CHARS) -> str:
    """``text`` if it is valid UTF-8 without a NUL, not blank and at most ``max_chars`` characters (0 = no limit).

    Raises:
        TextError: one line naming ``what`` (``query``, ``question``) and what is wrong with it.
    """
    problem = text_problem(text, max_chars) or nul_problem(text)  # type: ignore[arg-type]  # a str if no problem
    if problem:
        raise TextError(f"the {what} {problem}")
    assert isinstance(text, str)
    if not text.strip():
        hint = {"query": ": give the text to search for", "question": ": give the question to answer"}.get(what, "")
        raise TextError(f"the {what} is empty{hint}")
    return text
