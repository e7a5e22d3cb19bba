"""The client's one table of errors: a code both halves of the client meet is one class,
caught as a cluster error and as an admin error alike."""

from __future__ import annotations

import pytest
from highwater.client import admin, cluster
from highwater.client.errors import (
    AdminError,
    ClusterError,
    CoordinatorNotAvailableError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from highwater.v1.common_pb2 import ErrorCode


@pytest.mark.parametrize("name", ["UnknownTopicOrPartitionError", "CoordinatorNotAvailableError"])
def test_the_admin_client_and_the_cluster_raise_the_same_class(name: str) -> None:
    assert getattr(admin, name) is getattr(cluster, name)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UnknownTopicOrPartitionError),
        (ErrorCode.COORDINATOR_NOT_AVAILABLE, CoordinatorNotAvailableError),
    ],
)
def test_a_shared_code_is_both_a_cluster_and_an_admin_error(
    code: int, cls: type[AdminError]
) -> None:
    error = error_for_code(code, "no such thing")
    assert type(error) is cls
    assert isinstance(error, ClusterError) and isinstance(error, AdminError)
    assert (error.code, error.message, str(error)) == (code, "no such thing", "no such thing")
    with pytest.raises(ClusterError):
        raise cls("raised by the producer")


def test_a_code_without_a_class_is_a_plain_admin_error_carrying_it() -> None:
    error = error_for_code(ErrorCode.POLICY_VIOLATION)
    assert type(error) is AdminError
    assert (error.code, error.message) == (ErrorCode.POLICY_VIOLATION, "POLICY_VIOLATION")
    assert not isinstance(error_for_code(ErrorCode.TOPIC_ALREADY_EXISTS), ClusterError)
    assert isinstance(error_for_code(ErrorCode.TOPIC_ALREADY_EXISTS), TopicExistsError)
