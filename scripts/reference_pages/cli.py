"""docs/reference/cli.md: every `aieng` command and option, from its argparse parser."""

from __future__ import annotations

import argparse
import functools
import importlib

from reference_pages.markdown import (
    CLI_MODULE,
    USAGE_WIDTH,
    banner,
    cell,
    code,
    module_file,
    page,
    paragraph,
    slug,
    table,
)


def _fixed_width(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=USAGE_WIDTH)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the order they were added."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((name, helps.get(name, ""), sub))
    return found


def _argument(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    if action.option_strings:
        names = ", ".join(action.option_strings)
        if action.nargs == 0:
            return names
        metavar = formatter._format_args(action, action.dest.upper())
        return f"{names} {metavar}"
    return formatter._format_args(action, action.dest)


def _option_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        text = ""
    else:
        text = parser._get_formatter()._expand_help(action)
    notes = []
    if action.option_strings and action.required:
        notes.append("required")
    if action.choices is not None and action.metavar is not None:  # else the argument shows them
        notes.append("one of " + ", ".join(code(str(choice)) for choice in action.choices))
    if notes:
        text = f"{text} ({'; '.join(notes)})" if text else "; ".join(notes)
    return text


def _option_default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default is None or action.default == argparse.SUPPRESS:
        return ""
    default = action.default
    if default == "":
        return code('""')
    if isinstance(default, (list, tuple)):
        return code(" ".join(str(item) for item in default))
    return code(str(default))


def _exclusive_groups(parser: argparse.ArgumentParser) -> list[str]:
    notes = []
    for group in parser._mutually_exclusive_groups:
        names = [
            code(action.option_strings[0] if action.option_strings else action.dest) for action in group._group_actions
        ]
        if names:
            notes.append(("Exactly one of " if group.required else "At most one of ") + ", ".join(names) + ".")
    return notes


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage line(s) without the `usage: ` prefix, continuation lines dedented to match."""
    prefix = "usage: "
    lines = parser.format_usage().strip().splitlines()
    lines[0] = lines[0].removeprefix(prefix)
    return "\n".join([lines[0]] + [line.removeprefix(" " * len(prefix)) for line in lines[1:]])


def _sentence(text: str) -> str:
    text = paragraph(text)
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def _cli_command(name: str, help_text: str, parser: argparse.ArgumentParser, out: list[str]) -> None:
    _fixed_width(parser)
    level = "#" * min(len(name.split()), 4)  # aieng deploy: ##, aieng deploy promote: ###
    out += [f"{level} {name}", ""]
    if help_text:
        out += [cell(_sentence(help_text)), ""]
    out += ["```", _usage(parser), "```", ""]
    if parser.description and parser.description != help_text:
        out += [paragraph(parser.description), ""]
    subcommands = _subcommands(parser)
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        rows.append([code(_argument(parser, action)), cell(_option_help(parser, action)), _option_default(action)])
    if rows:
        out += table(["argument", "meaning", "default"], rows) + [""]
    if notes := _exclusive_groups(parser):
        out += [*notes, ""]
    if subcommands:
        out += ["Subcommands:", ""]
        out += [f"- [`{name} {sub}`](#{slug(f'{name} {sub}')}): {cell(text)}" for sub, text, _ in subcommands]
        out += [""]
    for sub, text, subparser in subcommands:
        _cli_command(f"{name} {sub}", text, subparser, out)


def render_cli() -> str:
    """docs/reference/cli.md from `build_parser()`."""
    parser = importlib.import_module(CLI_MODULE).build_parser()
    parser.prog = "aieng"
    _fixed_width(parser)
    out = [
        banner(module_file(CLI_MODULE)),
        "",
        "# CLI reference",
        "",
        "Every `aieng` command and subcommand with its usage, options and defaults, as `aieng --help` shows "
        "them. Every `--json` output is one JSON document on stdout; errors are one line on stderr and a "
        "non-zero exit status: 2 for a bad config (naming the file and the key) or bad arguments, 1 for any "
        "other refusal. `AIENG_TRACEBACK=1` shows the traceback instead of the line.",
        "",
    ]
    out += ["```", _usage(parser), "```", ""]
    if parser.description:
        out += [paragraph(parser.description), ""]
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        rows.append([code(_argument(parser, action)), cell(_option_help(parser, action)), _option_default(action)])
    if rows:
        out += ["Options every command takes (before the command name):", ""]
        out += table(["argument", "meaning", "default"], rows) + [""]
    commands = _subcommands(parser)
    out += ["Commands:", ""]
    out += [f"- [`aieng {name}`](#{slug(f'aieng {name}')}): {cell(text)}" for name, text, _ in commands]
    out += [""]
    for name, text, subparser in commands:
        _cli_command(f"aieng {name}", text, subparser, out)
    return page(out)
