"""Every setting's default says the same in config.py, in the help of each
command that takes it, and in the README's table of settings."""
import re
from pathlib import Path

import click
import pytest

from ckpt.cli import main
from ckpt.config import DEFAULTS, ENV_NAMES, default_config

README = Path(__file__).resolve().parent.parent / "README.md"

# a flag's parameter name -> its setting
SETTING_OF = {"ckpt_dir": "ckpt_dir", "interval": "interval", "keep": "keep",
              "forked": "forked_write", "compress": "compress", "incremental": "incremental",
              "full_every": "full_every", "stage_dir": "stage_dir", "verify": "verify",
              "lazy": "lazy", "launcher": "launcher"}
# how help texts and the README word a default value
WORDS = {"forked": True, "yes": True, "in place": False, "no": False, "on": True,
         "off": False, "all": 0, "none": None}


def value(setting, text):
    """A default as written (`8`, `forked`, `none`, `./ckpt-images`), as config.py holds it."""
    text = text.strip().strip("`").strip()
    if setting == "ckpt_dir":
        return Path(text).name
    if setting in ("compress", "verify", "launcher"):
        return text
    if text in WORDS:
        word = WORDS[text]
        return 0 if word is None and setting == "keep" else \
            (0.0 if word is False and setting == "interval" else word)
    return float(text) if "." in text else int(text)


def configured(setting):
    if setting == "ckpt_dir":
        return default_config().ckpt_dir.name
    return DEFAULTS[setting]


def readme_defaults():
    """{setting: the README table's default}."""
    found = {}
    for line in README.read_text().splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) == 5 and cells[1].startswith("`") and cells[1].strip("`") in ENV_NAMES:
            # `0` (off), forked (`yes`), off (R: as the checkpoint's job): the first words
            found[cells[1].strip("`")] = cells[3].split(" (")[0]
    return found


def help_defaults():
    """[(command, flag, setting, the default its help states)] where the
    help states one of its own (not "the job's" or "as the checkpoint's")."""
    stated = []
    commands = [("launch", main.commands["launch"]), ("checkpoint", main.commands["checkpoint"]),
                ("restart", main.commands["restart"]),
                ("slurm run", main.commands["slurm"].commands["run"])]
    for name, command in commands:
        for param in command.params:
            if not isinstance(param, click.Option) or param.name not in SETTING_OF:
                continue
            text = " ".join((param.help or "").split())
            match = re.search(r"default:? ([^;,)]+)", text) or \
                re.search(r"\((\w+), the default\)", text)
            if match is None:
                continue
            word = match.group(1).strip().rstrip(".")
            word = re.sub(r"^the job's (default: )?", "", word)
            if word.startswith(("as ", "setting", "all of")) or word == "":
                continue
            stated.append((name, param.opts[0], SETTING_OF[param.name], word))
    return stated


def test_readme_lists_every_setting_with_the_configured_default():
    table = readme_defaults()
    assert set(table) == set(ENV_NAMES), "settings missing from the README's table: " \
        f"{sorted(set(ENV_NAMES) - set(table))}"
    for setting, written in table.items():
        assert value(setting, written) == configured(setting), \
            f"README says {setting} defaults to {written}; config.py: {configured(setting)!r}"


def test_help_texts_state_the_configured_defaults():
    stated = help_defaults()
    # the flags whose help states a default: a rewording that drops one shows here
    assert {(name, flag) for name, flag, _, _ in stated} >= {
        ("launch", "--keep"), ("launch", "--forked"), ("launch", "--compress"),
        ("launch", "--incremental"), ("launch", "--full-every"), ("restart", "--verify"),
        ("restart", "--full-every"), ("restart", "--launcher"),
        ("slurm run", "--compress")}
    for name, flag, setting, word in stated:
        assert value(setting, word) == configured(setting), \
            f"ckpt {name} --help says {flag} defaults to {word}; config.py: {configured(setting)!r}"


@pytest.mark.parametrize("text, setting, expected", [
    ("`0` (off)", "interval", 0.0), ("all", "keep", 0), ("forked (`yes`)", "forked_write", True),
    ("`8`", "full_every", 8), ("none", "stage_dir", None)])
def test_the_wording_is_read_as_meant(text, setting, expected):
    assert value(setting, text.split(" (")[0]) == expected
