"""The .env reader (--env-file): syntax, expansion, and load_dotenv's no-override rule."""

from __future__ import annotations

import os

import pytest
from ferroloop.server.env_file import load_env_file, parse_env


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A=1", {"A": "1"}),
        ("A=1\nB=2\n", {"A": "1", "B": "2"}),
        ("  A = spaced value  \n", {"A": "spaced value"}),
        ("export A=1", {"A": "1"}),
        ("# comment\n\nA=1\n   # indented comment\n", {"A": "1"}),
        ("A=value # trailing comment", {"A": "value"}),
        ("A=no#comment", {"A": "no#comment"}),
        ("A=", {"A": ""}),
        ('A="quoted # not a comment"', {"A": "quoted # not a comment"}),
        ("A='single $HOME \\n'", {"A": "single $HOME \\n"}),
        ('A="tab\\there\\nnewline \\"q\\" \\\\"', {"A": 'tab\there\nnewline "q" \\'}),
        ('A="multi\nline"\nB=2', {"A": "multi\nline", "B": "2"}),
        ("A='multi\nline'\nB=2", {"A": "multi\nline", "B": "2"}),
        ('A="x" # comment after quotes', {"A": "x"}),
        ("A=1\r\nB=2\r\n", {"A": "1", "B": "2"}),
        ("A=1\nA=2", {"A": "2"}),
        ("dotted.key-name=1", {"dotted.key-name": "1"}),
    ],
)
def test_parse(text, expected):
    assert parse_env(text) == expected


def test_expansion_from_earlier_lines_and_defaults(monkeypatch):
    monkeypatch.delenv("FERROLOOP_UNSET", raising=False)
    monkeypatch.setenv("FERROLOOP_FROM_ENV", "env")
    text = (
        "BASE=/srv\n"
        "PATH_A=${BASE}/a\n"
        'QUOTED="${BASE}/q"\n'
        "RAW='${BASE}'\n"
        "DEFAULTED=${FERROLOOP_UNSET:-fallback}\n"
        "EMPTY=${FERROLOOP_UNSET}\n"
        "FROM_ENV=${FERROLOOP_FROM_ENV}\n"
    )
    assert parse_env(text) == {
        "BASE": "/srv",
        "PATH_A": "/srv/a",
        "QUOTED": "/srv/q",
        "RAW": "${BASE}",
        "DEFAULTED": "fallback",
        "EMPTY": "",
        "FROM_ENV": "env",
    }


def test_bad_lines_are_skipped_with_their_line_number(caplog):
    text = "A=1\nthis is not an assignment\nB='unterminated\nC=3\n"
    assert parse_env(text) == {"A": "1", "C": "3"}
    assert "line 2" in caplog.text
    assert "line 3" in caplog.text


def test_line_numbers_count_multiline_values(caplog):
    parse_env('A="x\ny"\n???\n')
    assert "line 3" in caplog.text


def test_load_does_not_override_existing_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("FERROLOOP_EXISTING", "kept")
    monkeypatch.delenv("FERROLOOP_NEW", raising=False)
    path = tmp_path / ".env"
    path.write_text("FERROLOOP_EXISTING=replaced\nFERROLOOP_NEW=set\n")
    try:
        values = load_env_file(path)
        assert values == {"FERROLOOP_EXISTING": "replaced", "FERROLOOP_NEW": "set"}
        assert os.environ["FERROLOOP_EXISTING"] == "kept"
        assert os.environ["FERROLOOP_NEW"] == "set"
        load_env_file(path, override=True)
        assert os.environ["FERROLOOP_EXISTING"] == "replaced"
    finally:
        os.environ.pop("FERROLOOP_NEW", None)


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        load_env_file(tmp_path / "missing.env")
