"""A rendered ValidatingAdmissionPolicy's validations, evaluated with cel-python as the API server would, its
`authorizer` answered by Kubernetes' RBAC rule over rendered chart objects (tests/support/rbac.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel

from tests.support.rbac import Request, allowed

# The Kubernetes CEL authorizer library's chain (docs/reference/admission-policy.md), one type per step, so
# that a call out of order (`check` before `resource`, `allowed` on a check) fails here as it fails to
# compile in the API server.


@dataclass(frozen=True)
class _Authorizer:
    account: tuple[str, str] | None  # None: the request's own user, which these tests never ask about


@dataclass(frozen=True)
class _GroupCheck:
    account: tuple[str, str] | None
    group: str


@dataclass(frozen=True)
class _ResourceCheck:
    account: tuple[str, str] | None
    group: str
    resource: str
    namespace: str | None = None


@dataclass(frozen=True)
class _Decision:
    allowed: bool


def _expect(value: Any, kind: type, call: str) -> None:
    if not isinstance(value, kind):
        raise TypeError(f"{call}() is not a function of {type(value).__name__} in the authorizer library")


class PolicyEvaluator:
    """Evaluates one policy's validations against a request, with RBAC decided by `objects`."""

    def __init__(self, policy: dict[str, Any], objects: list[dict[str, Any]]) -> None:
        self.policy = policy
        self.objects = objects
        self._env = celpy.Environment()
        self._functions = {
            "serviceAccount": self._service_account,
            "group": self._group,
            "resource": self._resource,
            "namespace": self._namespace,
            "check": self._check,
            "allowed": self._allowed,
        }

    def _service_account(self, authz: Any, namespace: Any, name: Any) -> _Authorizer:
        _expect(authz, _Authorizer, "serviceAccount")
        return _Authorizer((str(namespace), str(name)))

    def _group(self, authz: Any, group: Any) -> _GroupCheck:
        _expect(authz, _Authorizer, "group")
        return _GroupCheck(authz.account, str(group))

    def _resource(self, check: Any, resource: Any) -> _ResourceCheck:
        _expect(check, _GroupCheck, "resource")
        return _ResourceCheck(check.account, check.group, str(resource))

    def _namespace(self, check: Any, namespace: Any) -> _ResourceCheck:
        _expect(check, _ResourceCheck, "namespace")
        return replace(check, namespace=str(namespace))

    def _check(self, check: Any, verb: Any) -> _Decision:
        _expect(check, _ResourceCheck, "check")
        if check.account is None:
            raise NotImplementedError("only authorizer.serviceAccount(...) checks are evaluated here")
        request = Request(check.group, check.resource, str(verb), check.namespace)
        return _Decision(allowed(self.objects, check.account, request))

    def _allowed(self, decision: Any) -> celtypes.BoolType:
        _expect(decision, _Decision, "allowed")
        return celtypes.BoolType(decision.allowed)

    def _run(self, expression: str, activation: dict[str, Any]) -> Any:
        program = self._env.program(self._env.compile(expression), functions=self._functions)
        return program.evaluate(activation)

    def failures(self, obj: dict[str, Any], operation: str = "CREATE") -> list[str]:
        """The message of each validation the request to `operation` `obj` fails (empty: it passes)."""
        namespace = obj["metadata"]["namespace"]
        activation = {
            "object": json_to_cel(obj),
            "request": json_to_cel({"namespace": namespace, "operation": operation}),
            "authorizer": _Authorizer(None),
        }
        messages = []
        for validation in self.policy["spec"]["validations"]:
            result = self._run(validation["expression"], activation)
            if not isinstance(result, celtypes.BoolType):
                raise AssertionError(f"{validation['expression']!r} gave {result!r}, not a bool")
            if not result:
                text = validation.get("messageExpression")
                messages.append(str(self._run(text, activation)) if text else str(validation["message"]))
        return messages
