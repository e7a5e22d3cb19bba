"""What the controller's logic returns: records with a response, or a refusal with an error code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from highwater.errors import HighwaterError
from highwater.metadata.records import MetadataRecord

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class ControllerResult(Generic[R]):
    """Records to append as one atomic batch, and the response to send once they commit."""

    records: list[MetadataRecord]
    response: R


class ControllerApiError(HighwaterError):
    """A request (or one item of it) refused with ``code``; no records come of it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def refuse(code: int, message: str) -> ControllerApiError:
    """The error to raise to refuse a request or item with ``code``."""
    return ControllerApiError(code, message)


def error_of(error: HighwaterError) -> tuple[int, str]:
    """The error code and message a reply carries for ``error``."""
    return error.code, str(error)
