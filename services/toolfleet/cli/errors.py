"""Friendly failures: a one-line reason and a hint, never a traceback or a secret."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec
from urllib.parse import urlsplit, urlunsplit

from toolfleet.auth.grants import GrantKeyError
from toolfleet.bus.topics import TopicAdminError, TopicsFileError
from toolfleet.cli import output
from toolfleet.cli.output import escape
from toolfleet.errors import KafkaSecurityError
from toolfleet.settings import FleetSettings

P = ParamSpec("P")


class CliError(Exception):
    """An expected failure: printed as ``Error: message`` on stderr, exits non-zero."""

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def friendly(command: Callable[P, None]) -> Callable[P, None]:
    """Wrap a command so a :class:`CliError` prints its message instead of a traceback
    and exits with its code (``SystemExit``, which typer lets through as click's ``Exit``
    would end it: the worker command runs without typer)."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            command(*args, **kwargs)
        except CliError as exc:
            output.err_console.print(f"[bold red]Error:[/] {escape(exc.message)}")
            raise SystemExit(exc.exit_code) from None

    return run


def redacted(url: str) -> str:
    """``url`` without its password, fit for an error message."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" if parts.username else f"***@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


@contextmanager
def reaching_fleet(settings: FleetSettings) -> Iterator[None]:
    """Turn connection failures to the broker, Redis or Postgres into a :class:`CliError`."""
    hint = "is `toolfleet dev` running, or did you `source .toolfleet/dev.env`?"
    kafka_error, redis_connection_error = _client_errors()
    try:
        yield
    except KafkaSecurityError as exc:
        raise CliError(f"unusable Kafka security settings: {exc.message}") from None
    except GrantKeyError as exc:
        raise CliError(exc.message) from None
    except (TopicAdminError, TopicsFileError) as exc:
        raise CliError(str(exc)) from None
    except kafka_error as exc:
        raise CliError(
            f"cannot reach the Kafka broker at {settings.kafka_bootstrap} "
            f"({type(exc).__name__}); {hint}"
        ) from None
    except redis_connection_error:
        raise CliError(f"cannot reach Redis at {redacted(settings.redis_url)}; {hint}") from None
    except BrokenPipeError:
        # The reader went away (`toolfleet audit tail | head`): a normal end, not a failure.
        _silence_stdout()
        raise SystemExit(0) from None
    except OSError as exc:
        raise CliError(
            f"a connection failed ({exc.strerror or type(exc).__name__}); check "
            f"TOOLFLEET_DATABASE_URL ({redacted(settings.database_url)}) and the other "
            f"TOOLFLEET_* endpoints; {hint}"
        ) from None


class _NeverRaised(Exception):
    """Stands for a client library's error class when that library is not installed."""


def _client_errors() -> tuple[type[Exception], type[Exception]]:
    """The broker's and Redis's connection errors (imported here: the fleet extra)."""
    kafka_error: type[Exception] = _NeverRaised
    redis_error: type[Exception] = _NeverRaised
    try:
        from aiokafka.errors import KafkaError

        kafka_error = KafkaError
    except ModuleNotFoundError:
        pass
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError

        redis_error = RedisConnectionError
    except ModuleNotFoundError:
        pass
    return kafka_error, redis_error


def _silence_stdout() -> None:
    """Point stdout at /dev/null so flushing at exit does not raise a second time."""
    import os
    import sys

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
