"""YAML in and out, through omegaconf: a command-line value and a ``--config`` file read, interpolation resolved
(``${model.hidden}``, ``${oc.env:DATA_DIR}``), the config written as the text ``--print_config`` prints."""

from __future__ import annotations

import os
from typing import Any, cast

from tandem.cli.errors import CLIError, bad_config_file


def parse_value(raw: str) -> Any:
    """A command-line value read as YAML, as omegaconf reads dotlists: ``1e-3`` is a float, ``null`` None,
    ``[a, b]`` a list, ``${model.lr}`` an interpolation."""
    from omegaconf import OmegaConf

    try:
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={raw}"]), resolve=False)
        return cast("dict[str, Any]", parsed)["value"]  # a dotlist makes a mapping
    except Exception:
        return raw  # not YAML: the text itself


def load_config_file(path: str) -> dict[str, Any]:
    """A ``--config`` file as a plain dict (interpolations kept as text)."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not os.path.exists(path):
        raise bad_config_file(path, f"no such file (looked in {os.getcwd()}).")
    if not os.path.isfile(path):
        raise bad_config_file(path, "is a folder, not a YAML file.")
    try:
        loaded = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError) as err:
        reason = " ".join(str(err).split())
        raise bad_config_file(path, f"is not valid YAML: {reason}") from None
    content = OmegaConf.to_container(loaded, resolve=False)
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise bad_config_file(
            path, f"holds a YAML {type(content).__name__}; expected a mapping of keys (trainer:, model:, ...)."
        )
    return cast("dict[str, Any]", content)  # its keys are the names of a config's sections


def resolve(config: dict[str, Any]) -> dict[str, Any]:
    """omegaconf interpolation over the completed config."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return cast("dict[str, Any]", OmegaConf.to_container(OmegaConf.create(config), resolve=True))  # a mapping
    except OmegaConfBaseException as err:
        where = getattr(err, "full_key", None) or "the config"
        reason = str(err).strip().splitlines()[0]
        raise CLIError(f"{where}: the interpolation could not be resolved: {reason}") from None


def to_yaml(config: dict[str, Any]) -> str:
    """The config as YAML, the text ``--print_config`` prints and ``config.yaml`` holds."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(config))
