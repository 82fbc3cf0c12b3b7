"""The error a request to ``edgespec serve`` is refused with: an HTTP status (4xx) and an OpenAI-style error object.

Its own module so that every part of the wire format (:mod:`.openai_api`, :mod:`.openai_fields`,
:mod:`.fim_api`) raises the same class without importing one another.
"""

from __future__ import annotations


class RequestError(Exception):
    """A request the server refuses: ``status`` (4xx) and an OpenAI-style error object."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return error_object(self.message, self.kind, self.param, self.code)


def error_object(message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> dict:
    """``{"error": {"message", "type", "param", "code"}}`` as the OpenAI API returns it."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def is_one_of(value, *allowed) -> bool:
    """Whether ``value`` equals one of ``allowed`` with the same JSON type: ``True`` is not 1 and ``1.0`` is not
    an integer 1 (Python's ``==`` says both are), but an integer is a number where a float is allowed."""
    def same(a) -> bool:
        if isinstance(a, bool) or isinstance(value, bool):
            return type(value) is type(a) and value == a
        if isinstance(a, int) and not isinstance(a, float):
            return type(value) is int and value == a
        if isinstance(a, float):
            return isinstance(value, (int, float)) and value == a
        return type(value) is type(a) and value == a
    return any(same(a) for a in allowed)
