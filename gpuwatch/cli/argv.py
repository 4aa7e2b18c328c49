"""Reading `gpuwatch pick`'s options without argparse or click.

pick stands in front of every job it starts, so its start-up time is paid
again and again, and argparse cost it more than the whole selection: the
import, building a parser, and the message catalogues it looks up while
parsing (which import `locale`). What pick needs is small, so it is read here,
in click's grammar and with click's words, so that pick and the click commands
take and refuse options alike:

- `-n 2`, `-n2`, `--gpus 2` and `--gpus=2`; flags such as `-v`; short options
  together (`-vn 2`);
- the first argument that is not an option starts the command, and so does
  whatever follows `--`: the command's own options are its own;
- a long option is never abbreviated (`--min` is not `--min-free`);
- `-h`/`--help` stops the reading: what follows it is not checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuwatch.errors import InvalidValueError

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any


class Option:
    """One option: its names, the value it takes, and its line in the help.

    It takes a value when it has a `metavar` or `choices`, and is otherwise a
    flag, False until given. `convert` turns the text into the value, or raises
    `InvalidValueError` saying what is wrong with it; a `repeat` option
    collects a list. A plain class rather than a frozen dataclass: making a
    dataclass would cost every pick more than reading its options.
    """

    __slots__ = ("choices", "convert", "default", "dest", "help", "metavar", "names", "repeat")

    def __init__(
        self,
        *names: str,
        metavar: str | None = None,
        choices: Sequence[str] = (),
        convert: Callable[[str], object] | None = None,
        default: object = None,
        repeat: bool = False,
        help: str = "",
    ) -> None:
        self.names = names
        self.dest = names[-1].lstrip("-").replace("-", "_")
        self.metavar = metavar
        self.choices = tuple(choices)
        self.convert = convert
        self.default = False if default is None and not self.takes_value else default
        self.repeat = repeat
        self.help = help

    @property
    def takes_value(self) -> bool:
        return self.metavar is not None or bool(self.choices)

    @property
    def quoted(self) -> str:
        """`'-n' / '--gpus'`, as click names an option in messages."""
        return " / ".join(f"'{name}'" for name in self.names)

    def help_row(self) -> tuple[str, str]:
        """(`-n, --gpus N`, `How many GPUs.  [default: 1]`), as click draws an option."""
        term = ", ".join(self.names)
        if self.choices:
            term += f" [{'|'.join(self.choices)}]"
        elif self.metavar:
            term += f" {self.metavar}"
        shown = self.default is not None and self.default is not False
        return term, self.help + (f"  [default: {self.default}]" if shown else "")


HELP = Option("-h", "--help", help="Show this message and exit.")


def parse(
    options: Sequence[Option], args: Sequence[str], *, command: str
) -> tuple[dict[str, Any], list[str]]:
    """The options' values by `dest` (`help` among them), and the arguments left: the command.

    Raises `InvalidValueError` naming the option and pointing to `command --help`.
    """
    by_name = {name: option for option in (*options, HELP) for name in option.names}
    values: dict[str, Any] = {o.dest: [] if o.repeat else o.default for o in (*options, HELP)}
    left = list(args)
    while left and left[0].startswith("-") and left[0] != "-":
        arg = left.pop(0)
        if arg == "--":
            break
        try:
            if arg.startswith("--"):
                _read_long(arg, by_name, values, left)
            else:
                _read_short(arg, by_name, values, left)
        except InvalidValueError as error:
            raise InvalidValueError(f"{error} (see '{command} --help')") from None
        if values["help"]:
            return values, []
    return values, left


def _read_long(
    arg: str, by_name: dict[str, Option], values: dict[str, Any], left: list[str]
) -> None:
    name, equals, value = arg.partition("=")
    option = _known(name, by_name)
    if not option.takes_value:
        if equals:
            raise InvalidValueError(f"Option '{name}' does not take a value")
        values[option.dest] = True
        return
    _store(option, value if equals else _next(option, left), values)


def _read_short(
    arg: str, by_name: dict[str, Option], values: dict[str, Any], left: list[str]
) -> None:
    for position in range(1, len(arg)):
        option = _known(f"-{arg[position]}", by_name)
        if option.takes_value:
            _store(option, arg[position + 1 :] or _next(option, left), values)
            return
        values[option.dest] = True


def _known(name: str, by_name: dict[str, Option]) -> Option:
    option = by_name.get(name)
    if option is None:
        raise InvalidValueError(f"No such option '{name}'")
    return option


def _next(option: Option, left: list[str]) -> str:
    if not left:
        raise InvalidValueError(f"Option {option.quoted} requires an argument")
    return left.pop(0)


def _store(option: Option, text: str, values: dict[str, Any]) -> None:
    if option.choices and text not in option.choices:
        choices = ", ".join(f"'{choice}'" for choice in option.choices)
        raise InvalidValueError(
            f"Invalid value for {option.quoted}: {text!r} is not one of {choices}"
        )
    try:
        value = text if option.convert is None else option.convert(text)
    except InvalidValueError as error:
        raise InvalidValueError(f"Invalid value for {option.quoted}: {error}") from None
    if option.repeat:
        values[option.dest].append(value)
    else:
        values[option.dest] = value
