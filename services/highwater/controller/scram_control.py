"""SCRAM credentials: AlterUserScramCredentials and DescribeUserScramCredentials as records.

A credential is a ``UserScramCredentialRecord`` per user and mechanism, derived from the
salted password the client sent (never the password): every broker replays them into the
image's :class:`~highwater.metadata.image.ScramImage`, which the SCRAM exchange checks.

As Kafka's ``ScramControlManager.alterCredentials``, a request alters each user at most
once, whatever the mechanism: a user altered twice in one request (two upsertions, two
deletions, or a deletion and an upsertion, of one mechanism or of two) is
DUPLICATE_RESOURCE and nothing of that user is written. The first refused alteration of a
user decides that user's answer, and the user's later alterations are not looked at.
Each alteration is checked in Kafka's order: an empty user name is UNACCEPTABLE_CREDENTIAL
("Username must not be empty", for a deletion too), then an unknown mechanism
UNSUPPORTED_SASL_MECHANISM; then a deletion of a credential that does not exist is
RESOURCE_NOT_FOUND, and an upsertion with iterations outside [4096, 16384] or an empty
salt or salted password UNACCEPTABLE_CREDENTIAL. The other users of the request are done.
"""

from __future__ import annotations

from highwater.controller.results import ControllerResult
from highwater.controller_api.messages import (
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    AlterUserScramCredentialsResult,
    DescribedUserScramCredentials,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ScramCredentialDeletion,
    ScramCredentialInfo,
    ScramCredentialUpsertion,
)
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

_Refusal = tuple[int, str]
"""An alteration's error code and message."""

_DUPLICATE: _Refusal = (
    ErrorCode.DUPLICATE_RESOURCE,
    "A user credential cannot be altered twice in the same request",
)


def _refusal_of_name_and_mechanism(user: str, number: int) -> _Refusal | None:
    """Kafka's ``validateScramUsernameAndMechanism``: the name first, then the mechanism."""
    if not user:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if number not in MECHANISM_NAMES:
        return ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"unknown SCRAM mechanism {number}"
    return None


def _deletion_record(
    image: MetadataImage, deletion: ScramCredentialDeletion
) -> MetadataRecord | _Refusal:
    refusal = _refusal_of_name_and_mechanism(deletion.name, deletion.mechanism)
    if refusal is not None:
        return refusal
    mechanism = MECHANISM_NAMES[deletion.mechanism]
    if image.scram.credential(deletion.name, mechanism) is None:
        return ErrorCode.RESOURCE_NOT_FOUND, f"{deletion.name} has no {mechanism} credential"
    return RemoveUserScramCredentialRecord(deletion.name, deletion.mechanism)


def _upsertion_record(upsertion: ScramCredentialUpsertion) -> MetadataRecord | _Refusal:
    refusal = _refusal_of_name_and_mechanism(upsertion.name, upsertion.mechanism)
    if refusal is not None:
        return refusal
    if not MIN_ITERATIONS <= upsertion.iterations <= MAX_ITERATIONS:
        return (
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
            f"iterations {upsertion.iterations} outside [{MIN_ITERATIONS}, {MAX_ITERATIONS}]",
        )
    if not upsertion.salt or not upsertion.salted_password:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "no salt or password"
    credential = credential_from_salted_password(
        MECHANISM_NAMES[upsertion.mechanism],
        upsertion.salt,
        upsertion.salted_password,
        upsertion.iterations,
    )
    return UserScramCredentialRecord(
        upsertion.name,
        upsertion.mechanism,
        credential.salt,
        credential.stored_key,
        credential.server_key,
        credential.iterations,
    )


class ScramControl:
    """The controller's SCRAM credential requests (see the module docstring)."""

    def alter(
        self, image: MetadataImage, request: AlterUserScramCredentialsRequest
    ) -> ControllerResult[AlterUserScramCredentialsResponse]:
        accepted: dict[str, MetadataRecord] = {}
        refused: dict[str, _Refusal] = {}
        order: dict[str, None] = {}
        alterations: list[tuple[str, MetadataRecord | _Refusal]] = []
        for deletion in request.deletions:
            alterations.append((deletion.name, _deletion_record(image, deletion)))
        for upsertion in request.upsertions:
            alterations.append((upsertion.name, _upsertion_record(upsertion)))
        for user, outcome in alterations:
            order[user] = None
            if user in refused:
                continue
            if accepted.pop(user, None) is not None:
                refused[user] = _DUPLICATE
            elif isinstance(outcome, tuple):
                refused[user] = outcome
            else:
                accepted[user] = outcome
        results = tuple(
            AlterUserScramCredentialsResult(user, *refused.get(user, (ErrorCode.NONE, "")))
            for user in order
        )
        return ControllerResult(
            list(accepted.values()), AlterUserScramCredentialsResponse(results=results)
        )

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
