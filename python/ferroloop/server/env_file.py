"""A small ``.env`` reader for ``--env-file`` (no python-dotenv dependency).

The accepted syntax is the common subset of python-dotenv's:

    # a comment
    KEY=value                  # unquoted: trimmed; " #" starts a comment
    export KEY=value           # the "export " prefix is ignored
    KEY = "line\\n${OTHER}"     # double quotes: \\n \\t \\r \\" \\\\ escapes, ${VAR} expansion,
                               # may span several lines
    KEY='raw $value'           # single quotes: literal, may span several lines
    KEY=                       # the empty string

``${VAR}`` and ``${VAR:-default}`` expand (unquoted and double-quoted values) from the variables
defined earlier in the file and from the environment. As with python-dotenv's ``load_dotenv``,
a variable already set in the environment is not overridden. A line that cannot be parsed is
skipped with a warning naming its line number.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger("ferroloop.error")

_KEY = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.\-]*)\s*=[ \t]*")
_EXPANSION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "$"}


class EnvFileError(ValueError):
    """A statement of the file could not be parsed."""


def _expand(value: str, known: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        found = os.environ.get(name, known.get(name))
        if found:
            return found
        return default if default is not None else (found or "")

    return _EXPANSION.sub(replace, value)


def _double_quoted(text: str, start: int) -> tuple[str, int]:
    """Reads a double-quoted value from ``text[start]`` (the opening quote); returns the value
    (escapes applied) and the index after the closing quote."""
    out: list[str] = []
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append(_ESCAPES.get(nxt, "\\" + nxt))
            i += 2
        elif char == '"':
            return "".join(out), i + 1
        else:
            out.append(char)
            i += 1
    raise EnvFileError("unterminated double-quoted value")


def _single_quoted(text: str, start: int) -> tuple[str, int]:
    end = text.find("'", start + 1)
    if end < 0:
        raise EnvFileError("unterminated single-quoted value")
    return text[start + 1 : end], end + 1


def _rest_is_comment(text: str, pos: int) -> int:
    """After a quoted value only blanks and a comment may follow on that line; returns the
    index of the next line."""
    end = text.find("\n", pos)
    end = len(text) if end < 0 else end
    rest = text[pos:end].strip()
    if rest and not rest.startswith("#"):
        raise EnvFileError(f"unexpected text after the closing quote: {rest!r}")
    return end + 1


def parse_env(text: str) -> dict[str, str]:
    """Parses the content of an env file into an ordered dict (no environment changes)."""
    values: dict[str, str] = {}
    pos = 0
    line_number = 1
    while pos < len(text):
        line_end = text.find("\n", pos)
        line_end = len(text) if line_end < 0 else line_end
        line = text[pos:line_end]
        stripped = line.strip()
        start_line = line_number
        if not stripped or stripped.startswith("#"):
            pos = line_end + 1
            line_number += 1
            continue
        match = _KEY.match(text, pos, line_end)
        if match is None:
            logger.warning("env file: could not parse the statement at line %d", start_line)
            pos = line_end + 1
            line_number += 1
            continue
        key = match.group(1)
        value_start = match.end()
        try:
            if value_start < len(text) and text[value_start] in "\"'":
                if text[value_start] == '"':
                    raw, after = _double_quoted(text, value_start)
                    value = _expand(raw, values)
                else:
                    value, after = _single_quoted(text, value_start)
                next_pos = _rest_is_comment(text, after)
            else:
                raw = text[value_start:line_end]
                comment = re.search(r"\s#", raw)
                if comment is not None:
                    raw = raw[: comment.start()]
                value = _expand(raw.strip(), values)
                next_pos = line_end + 1
        except EnvFileError as exc:
            logger.warning(
                "env file: could not parse the statement at line %d: %s", start_line, exc
            )
            pos = line_end + 1
            line_number += 1
            continue
        values[key] = value
        line_number += text.count("\n", pos, next_pos)
        pos = next_pos
    return values


def load_env_file(path: str | os.PathLike[str], *, override: bool = False) -> dict[str, str]:
    """Reads ``path`` and sets its variables in ``os.environ`` (existing ones are kept unless
    ``override``); returns what the file defined. A missing file is an error (``OSError``)."""
    values = parse_env(Path(path).read_text(encoding="utf-8"))
    for key, value in values.items():
        if override or key not in os.environ:
            os.environ[key] = value
    return values
