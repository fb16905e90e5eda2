"""Options several subcommands share, spelled and documented once."""

from __future__ import annotations

import argparse

PLUGIN_HELP = ("import MODULE (a module name, searched in the working directory first, or a .py "
               "path) before running, so the policies it registers can be used; repeatable")


def add_plugin_option(parser: argparse.ArgumentParser) -> None:
    # Its own dest: a subparser's default would otherwise erase the global --plugin values.
    parser.add_argument("--plugin", dest="sub_plugins", action="append", default=[], metavar="MODULE",
                        help=PLUGIN_HELP)


def add_overwrite_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace an existing {what} (without it, lmsim refuses to replace "
                             "anything it did not write)")
