"""User-facing errors: each carries one line that names what is wrong and how to fix it."""

from __future__ import annotations


class ConfigError(ValueError):
    pass


def check_choice(field: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{field}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def check_range(field: str, value, low=None, high=None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise ConfigError(f"{field}={value!r} is out of range {bounds}")


def one_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message (its type name if it has none)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0] if lines else type(err).__name__


def named_line(err: BaseException) -> str:
    """`Type: first line`, for a crash recorded as a result (a failed method, a failed section)."""
    return f"{type(err).__name__}: {one_line(err)}"
