"""SCRAM credentials: AlterUserScramCredentials and DescribeUserScramCredentials as records.

A credential is a ``UserScramCredentialRecord`` per user and mechanism, derived from the
salted password the client sent (never the password): every broker replays them into the
image's :class:`~highwater.metadata.image.ScramImage`, which the SCRAM exchange checks. As
Kafka's ScramControlManager: a user named twice for one mechanism in one request is
DUPLICATE_RESOURCE (and nothing of it is written), an unknown mechanism
UNSUPPORTED_SASL_MECHANISM, iterations outside [4096, 16384] or an empty salt or salted
password UNACCEPTABLE_CREDENTIAL, the deletion of a credential that does not exist
RESOURCE_NOT_FOUND; the other users of the request are done.
"""

from __future__ import annotations

from collections import Counter

from highwater.controller.results import ControllerResult
from highwater.controller_api.messages import (
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    AlterUserScramCredentialsResult,
    DescribedUserScramCredentials,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ScramCredentialInfo,
)
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import (
    MetadataRecord,
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
)
from highwater.security.scram import (
    MAX_ITERATIONS,
    MECHANISM_NAMES,
    MECHANISM_NUMBERS,
    MIN_ITERATIONS,
    credential_from_salted_password,
)
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["ScramControl"]


class ScramControl:
    """The controller's SCRAM credential requests (see the module docstring)."""

    def alter(
        self, image: MetadataImage, request: AlterUserScramCredentialsRequest
    ) -> ControllerResult[AlterUserScramCredentialsResponse]:
        named = Counter(
            [(d.name, d.mechanism) for d in request.deletions]
            + [(u.name, u.mechanism) for u in request.upsertions]
        )
        delta = MetadataDelta(image)
        records: list[MetadataRecord] = []
        errors: dict[str, tuple[int, str]] = {}
        order: list[str] = []

        def fail(user: str, code: int, message: str) -> None:
            errors.setdefault(user, (code, message))

        def named_mechanism(user: str, number: int) -> str | None:
            """The mechanism's name, or ``None`` after failing ``user`` for a mechanism
            named twice or unknown."""
            order.append(user)
            if named[(user, number)] > 1:
                fail(user, ErrorCode.DUPLICATE_RESOURCE, "named twice in one request")
                return None
            mechanism = MECHANISM_NAMES.get(number)
            if mechanism is None:
                fail(
                    user, ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"unknown SCRAM mechanism {number}"
                )
            return mechanism

        for deletion in request.deletions:
            mechanism = named_mechanism(deletion.name, deletion.mechanism)
            if mechanism is None:
                continue
            if delta.scram_credential(deletion.name, mechanism) is None:
                fail(
                    deletion.name,
                    ErrorCode.RESOURCE_NOT_FOUND,
                    f"{deletion.name} has no {mechanism} credential",
                )
            else:
                removal = RemoveUserScramCredentialRecord(deletion.name, deletion.mechanism)
                delta.replay(removal)
                records.append(removal)
        for upsertion in request.upsertions:
            mechanism = named_mechanism(upsertion.name, upsertion.mechanism)
            if mechanism is None:
                continue
            if not upsertion.name:
                fail(upsertion.name, ErrorCode.UNACCEPTABLE_CREDENTIAL, "no user name")
            elif not MIN_ITERATIONS <= upsertion.iterations <= MAX_ITERATIONS:
                fail(
                    upsertion.name,
                    ErrorCode.UNACCEPTABLE_CREDENTIAL,
                    f"iterations {upsertion.iterations} outside "
                    f"[{MIN_ITERATIONS}, {MAX_ITERATIONS}]",
                )
            elif not upsertion.salt or not upsertion.salted_password:
                fail(upsertion.name, ErrorCode.UNACCEPTABLE_CREDENTIAL, "no salt or password")
            else:
                credential = credential_from_salted_password(
                    mechanism, upsertion.salt, upsertion.salted_password, upsertion.iterations
                )
                record = UserScramCredentialRecord(
                    upsertion.name,
                    upsertion.mechanism,
                    credential.salt,
                    credential.stored_key,
                    credential.server_key,
                    credential.iterations,
                )
                delta.replay(record)
                records.append(record)
        # A user with a refused item keeps none of the request's changes (Kafka's rule).
        records = [r for r in records if getattr(r, "name", None) not in errors]
        results = tuple(
            AlterUserScramCredentialsResult(user, *errors.get(user, (ErrorCode.NONE, "")))
            for user in dict.fromkeys(order)
        )
        return ControllerResult(records, AlterUserScramCredentialsResponse(results=results))

    def describe(
        self, image: MetadataImage, request: DescribeUserScramCredentialsRequest
    ) -> ControllerResult[DescribeUserScramCredentialsResponse]:
        users = image.scram.users()
        wanted = list(dict.fromkeys(request.users)) if request.users else sorted(users)
        results = []
        for user in wanted:
            credentials = users.get(user)
            if not credentials:
                results.append(
                    DescribedUserScramCredentials(
                        user, ErrorCode.RESOURCE_NOT_FOUND, f"{user} has no SCRAM credential"
                    )
                )
                continue
            infos = tuple(
                ScramCredentialInfo(MECHANISM_NUMBERS[c.mechanism], c.iterations)
                for c in credentials
            )
            results.append(DescribedUserScramCredentials(user, credentials=infos))
        return ControllerResult([], DescribeUserScramCredentialsResponse(results=tuple(results)))
