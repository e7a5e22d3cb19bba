"""The chart's alerts (``metrics.prometheusRule``), tested with ``promtool test rules``:
the rules are taken from the rendered PrometheusRule and run against input series, so
each alert is shown to fire when it should, after its ``for``, and to stay quiet when
the cluster is healthy. ``promtool check rules`` checks the rules as rendered, their
annotation templates included; the metric names are those the services export."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import by_kind, render, tool
from test_deploy_chart_config import assert_exported

NS = 'namespace="streams"'


def rendered_groups(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    docs = render.documents(
        render.render(
            {"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}}}}
            | (values or {}),
            name="hw",
            namespace="streams",
        )
    )
    (rule,) = by_kind(docs, "PrometheusRule").values()
    assert rule["metadata"]["labels"]["release"] == "prom"
    return list(rule["spec"]["groups"])


def promtool(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, cwd=cwd, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def alert(name: str, at: str, *labels: dict[str, str]) -> dict[str, Any]:
    return {
        "eval_time": at,
        "alertname": name,
        "exp_alerts": [{"exp_labels": label} for label in labels],
    }


def volume(claim: str, *, available: int) -> list[dict[str, str]]:
    """The kubelet's stats of a 100-byte volume ``claim`` with ``available`` bytes free."""
    labels = f'{NS}, persistentvolumeclaim="{claim}"'
    return [
        {"series": f"kubelet_volume_stats_capacity_bytes{{{labels}}}", "values": "100x24"},
        {
            "series": f"kubelet_volume_stats_available_bytes{{{labels}}}",
            "values": f"{available}x24",
        },
    ]


def without_annotations(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rule groups without their annotations (templated text ``check rules`` covers)."""
    return [
        {
            **group,
            "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in group["rules"]],
        }
        for group in groups
    ]


CRITICAL = {"severity": "critical"}
WARNING = {"severity": "warning"}

# Input series, one sample a minute (promtool's expanding notation: 'a+bxN').
SERIES = [
    # Offline partitions: none for 5 minutes, then 2 reported by the active controller.
    {"series": f'highwater_controller_offline_partitions{{{NS}, pod="hw-highwater-controller-0"}}',
     "values": "0x4 2x20"},
    {"series": f'highwater_controller_offline_partitions{{{NS}, pod="hw-highwater-controller-1"}}',
     "values": "0x24"},
    # Under-replicated and under-min-ISR: one broker's partition from minute 2 on.
    {"series": f'highwater_broker_under_replicated_partitions{{{NS}, pod="hw-highwater-broker-0"}}',
     "values": "0 0 1x22"},
    {"series": f'highwater_broker_under_min_isr_partitions{{{NS}, pod="hw-highwater-broker-0"}}',
     "values": "0 0 1x22"},
    # Another release's namespace: never counted.
    {"series": 'highwater_broker_under_replicated_partitions{namespace="other", pod="b-0"}',
     "values": "5x24"},
    # Three controllers; one is active until minute 10; from minute 12 only one reports.
    {"series": f'highwater_controller_active{{{NS}, pod="hw-highwater-controller-0"}}',
     "values": "1x10 0x14"},
    {"series": f'highwater_controller_active{{{NS}, pod="hw-highwater-controller-1"}}',
     "values": "0x11 stale"},
    {"series": f'highwater_controller_active{{{NS}, pod="hw-highwater-controller-2"}}',
     "values": "0x11 stale"},
    # Consumer lag: "grows" keeps growing past the threshold; "steady" is high but flat.
    {"series": 'highwater_consumer_lag{messaging_consumer_group_name="grows", '
               'messaging_destination_name="orders", messaging_destination_partition_id="0"}',
     "values": "0+100x40"},
    {"series": 'highwater_consumer_lag{messaging_consumer_group_name="steady", '
               'messaging_destination_name="orders", messaging_destination_partition_id="0"}',
     "values": "5000x40"},
    # Volumes: a broker's 90 % full, a controller's 50 %, another release's 99 %.
    *volume("data-hw-highwater-broker-0", available=10),
    *volume("data-hw-highwater-controller-0", available=50),
    *volume("data-other-broker-0", available=1),
]  # fmt: skip

ALERTS = [
    alert("HighwaterOfflinePartitions", "5m"),  # pending: not yet 1 minute
    alert("HighwaterOfflinePartitions", "7m", CRITICAL),
    alert("HighwaterUnderReplicatedPartitions", "6m"),  # 4 minutes: not yet 5
    alert("HighwaterUnderReplicatedPartitions", "8m", WARNING),
    alert("HighwaterUnderMinIsrPartitions", "6m"),
    alert("HighwaterUnderMinIsrPartitions", "8m", CRITICAL),
    alert("HighwaterNoActiveController", "10m"),
    alert("HighwaterNoActiveController", "13m", CRITICAL),
    alert("HighwaterControllerQuorumWithoutMajority", "10m"),
    alert("HighwaterControllerQuorumWithoutMajority", "20m", CRITICAL),
    alert("HighwaterConsumerLagGrowing", "10m"),
    alert(
        "HighwaterConsumerLagGrowing",
        "40m",
        {
            **WARNING,
            "messaging_consumer_group_name": "grows",
            "messaging_destination_name": "orders",
        },
    ),
    alert("HighwaterDiskNearlyFull", "5m"),
    alert(
        "HighwaterDiskNearlyFull",
        "15m",
        {**WARNING, "namespace": "streams", "persistentvolumeclaim": "data-hw-highwater-broker-0"},
    ),
]  # fmt: skip


def test_the_alerts_fire_when_they_should(tmp_path: Path) -> None:
    groups = rendered_groups()
    (tmp_path / "rendered.yaml").write_text(yaml.safe_dump({"groups": groups}))
    promtool("check", "rules", "rendered.yaml", cwd=tmp_path)
    names = {rule["alert"] for group in groups for rule in group["rules"]}
    assert names == {a["alertname"] for a in ALERTS}
    assert_exported(" ".join(rule["expr"] for group in groups for rule in group["rules"]))
    # The expected alerts name their labels; promtool would also compare annotations, which
    # `check rules` has validated above: the tested copy leaves them out.
    bare = without_annotations(groups)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": bare}))
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": SERIES, "alert_rule_test": ALERTS}],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    promtool("test", "rules", "tests.yaml", cwd=tmp_path)


def test_a_quiet_cluster_raises_nothing(tmp_path: Path) -> None:
    groups = rendered_groups({"controller": {"replicaCount": 5}})
    bare = without_annotations(groups)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": bare}))
    healthy = [
        {"series": f'highwater_controller_active{{{NS}, pod="c-{i}"}}',
         "values": ("1" if i == 0 else "0") + "x30"}
        for i in range(5)
    ] + [
        {"series": f'highwater_controller_offline_partitions{{{NS}}}', "values": "0x30"},
        {"series": f'highwater_broker_under_replicated_partitions{{{NS}}}', "values": "0x30"},
        {"series": f'highwater_broker_under_min_isr_partitions{{{NS}}}', "values": "0x30"},
    ]  # fmt: skip
    names = sorted({rule["alert"] for group in groups for rule in group["rules"]})
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": healthy,
                "alert_rule_test": [alert(name, "30m") for name in names],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    promtool("test", "rules", "tests.yaml", cwd=tmp_path)


@pytest.mark.parametrize("replicas", [1, 3, 5])
def test_the_majority_follows_the_quorum_size(replicas: int) -> None:
    (group,) = rendered_groups({"controller": {"replicaCount": replicas}})
    (rule,) = [
        r for r in group["rules"] if r["alert"] == "HighwaterControllerQuorumWithoutMajority"
    ]
    assert rule["expr"].endswith(f"< {replicas // 2 + 1}")


def test_in_the_etcd_mode_the_active_controller_is_watched_and_no_quorum_is() -> None:
    """In the etcd mode every broker runs a controller candidate, which exports
    ``highwater_controller_active``: the no-active-controller alert holds as it is; there is
    no controller quorum whose majority could be lost."""
    values = {"metadata": {"mode": "etcd", "etcd": {"endpoints": ["etcd-0.etcd:2379"]}}}
    (group,) = rendered_groups(values)
    names = {rule["alert"] for rule in group["rules"]}
    assert "HighwaterNoActiveController" in names
    assert "HighwaterControllerQuorumWithoutMajority" not in names
    (kraft,) = rendered_groups()
    assert names == {rule["alert"] for rule in kraft["rules"]} - {
        "HighwaterControllerQuorumWithoutMajority"
    }
