"""The options and defaults every measuring command shares (``specdec bench``, ``alpha``, ``results``)."""

from __future__ import annotations

import argparse
from typing import Any

from specdec.errors import SpecDecError
from specdec.models.formats.catalog import DEFAULT_DRAFT, DEFAULT_TARGET

__all__ = ["DEFAULT_DRAFT", "DEFAULT_DTYPE", "DEFAULT_TARGET", "DEFAULT_TASK", "MAX_NEW_TOKENS", "add_dtype_argument",
           "add_json_argument", "add_sweep_arguments", "add_threads_argument", "comma_list", "number_list",
           "sweep_threads"]

DEFAULT_DTYPE = "bf16"  # fast on CPU
DEFAULT_TASK = "humaneval"
#: Tokens generated per prompt: enough for the acceptance statistics, short enough for many prompts.
MAX_NEW_TOKENS = 64


def add_dtype_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, help="bf16 (fast on CPU), fp32 or fp16")


def sweep_threads(threads: int | None) -> int:
    """The torch threads each unit of a Ray sweep runs with: ``--threads``, else the count a serial run in this
    process uses (torch's own), so that both compute alike to the last bit (a product on fewer threads can add
    in another order: a Ray worker that ran 1 thread where the serial run used 2 differed in the last digits)."""
    import torch

    return threads if threads is not None else torch.get_num_threads()


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: leave as is)")


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the JSON document to PATH")


def comma_list(text: str) -> list[str]:
    """The non-empty items of a comma-separated list, stripped."""
    return [x.strip() for x in str(text).split(",") if x.strip()]


def number_list(text: str | None, kind: type, option: str, *, unique: bool = True) -> list[Any]:
    """The numbers of ``option``'s comma-separated list (at least one; repeats dropped unless ``unique`` is False)."""
    try:
        values = [kind(x) for x in comma_list(text)]
    except ValueError:
        raise SpecDecError(f"{option} takes a comma-separated list of numbers, got {text!r}") from None
    if not values:
        raise SpecDecError(f"{option} needs at least one value")
    return list(dict.fromkeys(values)) if unique else values


def check_sweep_options(args: argparse.Namespace) -> None:
    """The sweep options' bad values, before any model loads (:func:`add_sweep_arguments`)."""
    if getattr(args, "shard_size", None) is not None and args.shard_size < 1:
        raise SpecDecError(f"--shard-size must be >= 1, got {args.shard_size}")


def add_sweep_arguments(parser: argparse.ArgumentParser, *, shard_help: str) -> None:
    """The options every sweep command shares: where its units run, how big they are, where they are kept."""
    parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help="run the units as Ray tasks (pip install 'specdec[ray]'): no ADDRESS starts a cluster on "
                             "this machine; 'auto' or 'ray://HOST:PORT' joins a running one. Each unit asks for "
                             "--threads CPUs (default: the serial run's torch threads)")
    parser.add_argument("--shard-size", type=int, default=None, metavar="N", help=shard_help)
    parser.add_argument("--records", default=None, metavar="DIR",
                        help="keep each finished unit's records as DIR/<unit id>.jsonl, written once; a rerun with "
                             "the same DIR runs only the units not there yet")
