"""Help text and errors of the commands' options: each option's help ends with its default; a
mistyped name is answered in one line with the valid names, the closest first."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable
from typing import NoReturn


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default, except where there is none to show (a required option, a
    None default: the help says what happens then) or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required or action.default is None or "default" in text:
            return text
        return super()._get_help_string(action)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """'did you mean 'triton'? (valid: triton, torch, ...)': the valid names, the closest first."""
    choices = list(dict.fromkeys(str(c) for c in choices))
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    ranked = close + [c for c in choices if c not in close]
    valid = f"valid: {', '.join(ranked)}"
    return f"did you mean {close[0]!r}? ({valid})" if close else f"({valid})"


# argparse's own "invalid choice: 'x' (choose from 'a', 'b')" and the commands' own
# "unknown backend 'x'; choose from ['a', 'b']" / "choose one of [...]".
_CHOICE = re.compile(
    r"(?P<head>.*?'(?P<name>[^']*)'.*?)[;,]?\s*\(?(?:choose from|choose one of)\s*"
    r"(?P<choices>.*?)\)?\s*$",
    re.S,
)


def one_line(message: str) -> str:
    """An option error on one line; a mistyped name gets the valid names, the closest first."""
    m = _CHOICE.match(message)
    if not m:
        return " ".join(message.split())
    choices = re.findall(r"'([^']*)'", m["choices"])
    choices = choices or [c.strip() for c in m["choices"].strip("[]").split(",") if c.strip()]
    return f"{' '.join(m['head'].split()).rstrip(':;,')}; {did_you_mean(m['name'], choices)}"


def _error(self: argparse.ArgumentParser, message: str) -> NoReturn:
    """ArgumentParser.error in one line, the command's --help named instead of its usage."""
    self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def install() -> None:
    """Every parser of this process reports option errors in one line (`decodecliff`'s main)."""
    argparse.ArgumentParser.error = _error  # type: ignore[method-assign]
