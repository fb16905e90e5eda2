"""Options several subcommands share, spelled and documented once, and what keeps building
the parser cheap: `lmsim --version` and every `--help` build it, so no command module may
import numpy, pandas, matplotlib or pydantic at its top; registry names offered as
`choices` are read only when an argument is checked (`RegistryNames`)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterator

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


class RegistryNames:
    """The names of a plug-in registry as argparse `choices`, read when argparse first
    checks a value or prints this command's help (importing the registry's module then),
    not when the parser is built. Give the argument a `metavar`: without one argparse
    lists the choices while building the parser."""

    def __init__(self, module: str, registry: str) -> None:
        self.module, self.registry = module, registry

    def _names(self) -> list[str]:
        return getattr(importlib.import_module(self.module), self.registry).names()

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())
