"""What a command line asks for: the tokens after the subcommand split into config files, overrides and flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.cli.errors import bad_command_line


@dataclass
class Request:
    """What a command line asks for, before any file is read."""

    configs: list[str] = field(default_factory=list)
    overrides: list[tuple[str, str]] = field(default_factory=list)  # (dotted key, raw value)
    print_config: bool = False
    overwrite: bool = False
    help: bool = False


def parse_argv(tokens: list[str]) -> Request:
    """Split the options after the subcommand: ``--config``, flags, and overrides in both spellings."""
    request = Request()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in ("-h", "--help"):
            request.help = True
        elif token in ("--print_config", "--print-config"):
            request.print_config = True
        elif token == "--overwrite":
            request.overwrite = True
        elif token in ("-c", "--config") or token.startswith("--config="):
            if "=" in token:
                request.configs.append(token.split("=", 1)[1])
            elif i + 1 < len(tokens):
                request.configs.append(tokens[i + 1])
                i += 1
            else:
                raise bad_command_line("--config needs a file: --config path/to/config.yaml")
        elif token.startswith("--") and len(token) > 2:
            key, eq, value = token[2:].partition("=")  # --trainer.callbacks+=EarlyStopping keeps its "+"
            if not eq:
                if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                    raise bad_command_line(
                        f"--{key} needs a value: --{key} VALUE or --{key}=VALUE (booleans too: --{key} true)."
                    )
                value = tokens[i + 1]
                i += 1
            request.overrides.append((key, value))
        elif "=" in token and not token.startswith("-"):
            key, _, value = token.partition("=")
            request.overrides.append((key, value))
        else:
            raise bad_command_line(
                f"Unexpected argument {token!r}. Give options as --section.key VALUE, --section.key=VALUE or "
                "section.key=VALUE (e.g. --trainer.max_epochs 5), and config files with --config FILE."
            )
        i += 1
    return request
