"""Help text of the commands' options: each option's help ends with its default."""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default, except where there is none to show (a required option, a
    None default: the help says what happens then) or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required or action.default is None or "default" in text:
            return text
        return super()._get_help_string(action)
