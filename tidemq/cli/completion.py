"""``tidemq completion bash|zsh|tcsh``: the shell's completion script for every command and
flag, printed for the user to source (``source <(tidemq completion bash)``) or install. shtab
writes it from the parser once; nothing of ours runs when the shell completes, so completing
costs no Python start."""

from __future__ import annotations

import argparse

import shtab

SHELLS = ("bash", "zsh", "tcsh")


def add_parser(sub: argparse._SubParsersAction, root: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    c = sub.add_parser(
        "completion",
        help="print the shell completion script (bash, zsh, tcsh)",
        description="Print the completion script. bash: `source <(tidemq completion bash)` in "
        '~/.bashrc; zsh: `tidemq completion zsh > "${fpath[1]}/_tidemq"`.',
    )
    c.add_argument("shell", choices=SHELLS)

    def run(args: argparse.Namespace) -> int:
        print(shtab.complete(root, shell=args.shell))
        return 0

    c.set_defaults(func=run)
