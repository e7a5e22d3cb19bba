"""Named listeners: parsing ``listeners``/``advertised.listeners``, what is advertised, which
listener peers use, and each refusal naming its key."""

from __future__ import annotations

import re

import pytest
from highwater.config.listeners import Listener, parse_listener_list, resolve_listeners
from highwater.config.server import load_server_config
from highwater.errors import InvalidConfigError

TWO = "INTERNAL://0.0.0.0:9092,EXTERNAL://0.0.0.0:9094"
ADVERTISED = "INTERNAL://pod.svc:9092,EXTERNAL://203.0.113.7:31001"


def test_listeners_parse_in_order_with_upper_case_names() -> None:
    assert parse_listener_list("internal://[::1]:9092, EXTERNAL://h-1.example:9094") == (
        Listener("INTERNAL", "::1", 9092),
        Listener("EXTERNAL", "h-1.example", 9094),
    )
    assert Listener("INTERNAL", "::1", 9092).address == "[::1]:9092"


def test_each_listener_is_advertised_at_its_advertised_address() -> None:
    resolved = resolve_listeners(listeners=TWO, advertised_listeners=ADVERTISED)
    assert [str(listener) for listener in resolved.advertised] == [
        "INTERNAL://pod.svc:9092",
        "EXTERNAL://203.0.113.7:31001",
    ]
    assert resolved.inter_broker == Listener("INTERNAL", "0.0.0.0", 9092)
    assert resolved.more_bound == (("EXTERNAL", "0.0.0.0:9094"),)


def test_the_inter_broker_listener_comes_first() -> None:
    resolved = resolve_listeners(
        listeners=TWO, advertised_listeners=ADVERTISED, inter_broker_listener_name="external"
    )
    assert resolved.inter_broker_name == "EXTERNAL"
    assert [listener.name for listener in resolved.advertised] == ["EXTERNAL", "INTERNAL"]


def test_a_listener_not_advertised_is_advertised_where_it_binds() -> None:
    resolved = resolve_listeners(
        listeners="A://127.0.0.1:1,B://127.0.0.2:2", advertised_listeners="B://b.example:3"
    )
    assert [str(listener) for listener in resolved.advertised] == [
        "A://127.0.0.1:1",
        "B://b.example:3",
    ]


def test_without_listeners_listen_is_the_one_plaintext_listener() -> None:
    resolved = resolve_listeners(listen="0.0.0.0:9092", advertised_listener="pod.svc:9092")
    assert resolved.bound == (Listener("PLAINTEXT", "0.0.0.0", 9092),)
    assert resolved.advertised == (Listener("PLAINTEXT", "pod.svc", 9092),)
    # --listen alone keeps advertising what it binds, as before named listeners.
    assert resolve_listeners(listen="0.0.0.0:9092").advertised[0].host == "0.0.0.0"


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"listeners": "A://h:1,a://h:2"}, "listeners"),
        ({"listeners": "A://h"}, "listeners"),
        ({"listeners": "A:/h:1"}, "listeners"),
        ({"listeners": "A://h:70000"}, "listeners"),
        ({"listeners": "A://h:1,B://h:1"}, "listeners"),
        ({"listeners": "A://h:1", "advertised_listeners": "B://h:1"}, "advertised.listeners"),
        ({"listeners": "A://h:1", "advertised_listeners": "A://0.0.0.0:1"}, "advertised.listeners"),
        ({"listeners": "A://0.0.0.0:1"}, "advertised.listeners"),
        ({"listeners": "A://h:1", "inter_broker_listener_name": "B"}, "inter.broker.listener.name"),
        ({"listeners": "A://h:1", "listen": "h:2"}, "listeners"),
        ({"listeners": "A://h:1", "advertised_listener": "h:2"}, "listeners"),
        ({}, "listeners"),
    ],
)
def test_bad_listener_settings_are_refused_naming_the_key(keys: dict[str, str], named: str) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(named)):
        resolve_listeners(**keys)


def test_the_keys_are_server_config_keys_checked_when_read() -> None:
    config = load_server_config(None, [f"listeners={TWO}", "inter.broker.listener.name=INTERNAL"])
    assert config.get("listeners") == TWO
    assert config.get("advertised.listeners") == ""
    with pytest.raises(InvalidConfigError, match=re.escape("configuration advertised.listeners")):
        load_server_config(None, ["advertised.listeners=nonsense"])
    with pytest.raises(
        InvalidConfigError, match=re.escape("configuration inter.broker.listener.name")
    ):
        load_server_config(None, ["inter.broker.listener.name=not a name"])


def test_only_several_listeners_need_their_names_on_the_calls() -> None:
    assert resolve_listeners(listen="127.0.0.1:9092").host_listener_name is None
    several = resolve_listeners(listeners=TWO, advertised_listeners=ADVERTISED)
    assert several.host_listener_name == "INTERNAL"
