"""The ``agentsessions`` command imports only the module of the command it runs (cli.COMMANDS), so
that table must name, for every command, the module that registers it."""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys

import pytest

from agentsessions.host import cli


def _registered() -> dict[str, str]:
    """Each command mapped to the module whose add_parser registers it."""
    found: dict[str, str] = {}
    for module in cli.MODULES:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers(dest="command")
        __import__(module, fromlist=["add_parser"]).add_parser(sub)
        found.update(dict.fromkeys(sub.choices, module))
    return found


def test_the_table_names_every_command_and_its_module() -> None:
    assert _registered() == cli.COMMANDS


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    return {
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    }


@pytest.mark.parametrize("command", ["serve", "journal", "replay", "list"])
def test_a_command_parses_with_its_module_alone(command: str) -> None:
    module = cli.COMMANDS[command]
    assert _commands(cli.build_parser(command)) == {name for name, m in cli.COMMANDS.items() if m == module}


def test_help_and_unknown_commands_list_every_command() -> None:
    assert _commands(cli.build_parser()) == set(cli.COMMANDS)
    assert _commands(cli.build_parser("no-such-command")) == set(cli.COMMANDS)


def test_serving_does_not_load_the_client_commands() -> None:
    probe = (
        "import json, sys\n"
        "from agentsessions.host import cli\n"
        "cli._parsed(['serve', '--journal', 'memory:'])\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('agentsessions.host.usercli'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_parsing_leaves_the_collector_as_it_found_it() -> None:
    assert gc.isenabled()
    cli._parsed(["list", "--server", "127.0.0.1:1"])
    assert gc.isenabled()
    gc.disable()
    try:
        cli._parsed(["list", "--server", "127.0.0.1:1"])
        assert not gc.isenabled()
    finally:
        gc.enable()
