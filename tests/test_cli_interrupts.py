"""Ctrl-C exits 130 however it surfaces: as KeyboardInterrupt, or as a C extension's SystemError
caused by one (numba's dispatcher, seen once in a `hydraplan whatif` interrupted by SIGINT)."""

from __future__ import annotations

import argparse

import pytest

from hydraplan.api import cli
from hydraplan.api.cli.interrupts import is_interrupt


def raised(factory) -> BaseException:
    try:
        factory()
    except BaseException as exc:  # noqa: BLE001 - the test wants whatever was raised
        return exc
    raise AssertionError("nothing raised")


def numba_like() -> None:
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as interrupt:
        raise SystemError("CPUDispatcher(<function balance_bins>) returned a result with an exception set") from (
            interrupt
        )


def test_an_interrupt_is_recognised_through_its_cause_or_context() -> None:
    assert is_interrupt(KeyboardInterrupt())
    assert is_interrupt(raised(numba_like))

    def in_handling() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise SystemError("while handling") from None  # context kept, cause suppressed

    assert not is_interrupt(raised(in_handling))  # `from None`: not caused by it
    assert not is_interrupt(SystemError("a real failure"))
    looped = SystemError("loop")
    looped.__context__ = ValueError("inner")
    looped.__context__.__context__ = looped  # a cycle ends the walk
    assert not is_interrupt(looped)


@pytest.mark.parametrize(
    ("error", "code"), [(numba_like, 130), (lambda: (_ for _ in ()).throw(KeyboardInterrupt), 130)]
)
def test_the_command_line_exits_130_on_either(monkeypatch, error, code) -> None:
    def handler(args: argparse.Namespace) -> int:
        error()
        return 0

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv: argparse.Namespace(handler=handler))
    assert cli.main(["models"]) == code


def test_a_system_error_not_caused_by_an_interrupt_is_not_swallowed(monkeypatch) -> None:
    def handler(args: argparse.Namespace) -> int:
        raise SystemError("a real failure")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv: argparse.Namespace(handler=handler))
    with pytest.raises(SystemError, match="a real failure"):
        cli.main(["models"])
