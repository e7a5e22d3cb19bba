"""A client that sets only the fields docs/grpc.md says a minimal client must set.

Run as ``python minimal_grpc_client.py ADDRESS TOPIC`` with stubs generated from the protos
first on PYTHONPATH (tests/support/proto_stubs.py): it imports none of the project's code,
as a client in another language would not. It prints one JSON object of what each answer
said, for the test to check.
"""

from __future__ import annotations

import json
import sys
import time

import grpc
from highwater.v1 import admin_pb2, broker_pb2_grpc
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode


def main(address: str, topic: str) -> None:
    assert "/services/" not in pb.__file__, f"not the generated stubs: {pb.__file__}"
    out: dict[str, object] = {}
    with grpc.insecure_channel(address) as channel:
        broker = broker_pb2_grpc.BrokerStub(channel)

        # The topic, through the broker, with only its name: the cluster's defaults.
        create = admin_pb2.CreateTopicsRequest(topics=[admin_pb2.CreatableTopic(name=topic)])
        created = broker.CreateTopics(create, timeout=30)
        out["create_topics"] = {
            "error": created.error,
            "topic_error": created.topics[0].error,
            "num_partitions": created.topics[0].num_partitions,
            "replication_factor": created.topics[0].replication_factor,
        }
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            described = broker.Metadata(pb.MetadataRequest(topics=[topic]), timeout=5)
            partitions = described.topics[0].partitions if described.topics else []
            if partitions and all(p.leader_id >= 0 for p in partitions):
                break
            time.sleep(0.05)

        produce = pb.ProduceRequest()
        records = produce.topics.add(topic=topic).partitions.add(partition=0).records
        records.records.add(value=b"one")
        records.records.add(key=b"k", value=b"two")
        # A leader named in the metadata may still be creating its log: retried while it
        # answers NOT_LEADER_OR_FOLLOWER, as a client retries it.
        while True:
            answer = broker.Produce(produce, timeout=10).topics[0].partitions[0]
            if answer.error != ErrorCode.NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        out["produce"] = {"error": answer.error, "base_offset": answer.base_offset}

        fetch = pb.FetchRequest()
        fetch.topics.add(topic=topic).partitions.add(partition=0, fetch_offset=0)
        answer = broker.Fetch(fetch, timeout=10).topics[0].partitions[0]
        out["fetch"] = {
            "error": answer.error,
            "high_watermark": answer.high_watermark,
            "log_start_offset": answer.log_start_offset,
            "records_bytes": len(answer.records),
        }

        for name, timestamp in (("latest", -1), ("earliest", -2)):
            offsets = pb.ListOffsetsRequest()
            offsets.topics.add(topic=topic).partitions.add(partition=0, timestamp=timestamp)
            answer = broker.ListOffsets(offsets, timeout=10).topics[0].partitions[0]
            out[f"list_offsets_{name}"] = {"error": answer.error, "offset": answer.offset}

        epochs = pb.OffsetsForLeaderEpochRequest()
        epochs.topics.add(topic=topic).partitions.add(partition=0, leader_epoch=0)
        answer = broker.OffsetsForLeaderEpoch(epochs, timeout=10).topics[0].partitions[0]
        out["offsets_for_leader_epoch"] = {
            "error": answer.error,
            "leader_epoch": answer.leader_epoch,
            "end_offset": answer.end_offset,
        }

        producer = broker.InitProducerId(pb.InitProducerIdRequest(), timeout=10)
        out["init_producer_id"] = {
            "error": producer.error,
            "producer_id": producer.producer_id,
            "producer_epoch": producer.producer_epoch,
        }

        configs = admin_pb2.DescribeConfigsRequest()
        configs.resources.add(
            resource_type=admin_pb2.CONFIG_RESOURCE_TYPE_TOPIC,
            resource_name=topic,
            config_names=["cleanup.policy"],
        )
        described_configs = broker.DescribeConfigs(configs, timeout=30)
        result = described_configs.results[0]
        out["describe_configs"] = {
            "error": result.error,
            "values": {c.name: c.value for c in result.configs},
        }

        deleted = broker.DeleteTopics(admin_pb2.DeleteTopicsRequest(names=[topic]), timeout=30)
        out["delete_topics"] = {"error": deleted.error, "topic_error": deleted.topics[0].error}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
