# A Highwater client in Ruby: the gRPC API with stubs generated from protos/ by
# grpc_tools_ruby_protoc (Debian's ruby-grpc-tools), grpc from Debian's ruby-grpc.
#
#   grpc_tools_ruby_protoc -I protos --ruby_out=STUBS --grpc_out=STUBS protos/highwater/v1/*.proto
#   ruby -I STUBS examples/ruby/client.rb HOST:PORT TOPIC GROUP
#
# The same story as examples/node/client.js: wait for the cluster to serve, create TOPIC
# with three partitions, produce keyed records to partition -1 (the broker places them by
# murmur2 of the key; records refused while a new leader creates its log are sent again,
# as a Kafka producer retries), consume them as a member of GROUP through a consumer
# session (acknowledging each delivery, committing at the end; the stream's end ends the
# membership), read the committed offsets back and list the latest offsets. It prints one
# JSON object of what it saw.
require 'json'
require 'grpc'
require 'grpc/health/v1/health_services_pb'
require 'highwater/v1/broker_services_pb'
require 'highwater/v1/coordinator_services_pb'

V1 = Highwater::V1
PARTITIONS = 3
RECORDS = 30

def wait_serving(address)
  health = Grpc::Health::V1::Health::Stub.new(address, :this_channel_is_insecure)
  600.times do
    begin
      answer = health.check(Grpc::Health::V1::HealthCheckRequest.new(service: ''), deadline: Time.now + 2)
      return if answer.status == :SERVING
    rescue GRPC::BadStatus
      # not listening yet
    end
    sleep 0.1
  end
  raise 'the server never reported SERVING'
end

def wait_leaders(broker, topic)
  300.times do
    answer = broker.metadata(V1::MetadataRequest.new(topics: [topic]))
    partitions = answer.topics.first&.partitions || []
    return if partitions.size == PARTITIONS && partitions.all? { |p| p.leader_id >= 0 }
    sleep 0.1
  end
  raise "#{topic} got no leaders"
end

# Errors a Kafka producer retries: the leader is moving or still creating its log.
RETRIABLE = %i[NOT_LEADER_OR_FOLLOWER LEADER_NOT_AVAILABLE UNKNOWN_TOPIC_OR_PARTITION].freeze

# Produce records to partition -1 (the broker places each by its key); a record refused
# with a retriable error is sent again after a pause, the others keep their placement.
# Returns the error name ('NONE' once every record is placed) and the placements.
def produce_placed(broker, topic, records)
  placements = Array.new(records.size)
  100.times do
    pending = placements.each_index.select { |i| placements[i].nil? }
    return ['NONE', placements] if pending.empty?

    produced = broker.produce(V1::ProduceRequest.new(
      topics: [V1::ProduceTopic.new(topic: topic, partitions: [V1::ProducePartition.new(
        partition: -1, records: V1::PlainRecords.new(records: pending.map { |i| records[i] })
      )])]
    ))
    placed = produced.topics.first.partitions.first
    return [placed.error.to_s, placements] if placed.placements.empty? && !RETRIABLE.include?(placed.error)

    placed.placements.each_with_index do |p, j|
      if p.error == :NONE
        placements[pending[j]] = p
      elsif !RETRIABLE.include?(p.error)
        return [p.error.to_s, placements]
      end
    end
    sleep 0.1
  end
  raise "#{topic}: records still refused after 100 tries"
end

# Requests of a consumer session come from a queue; nil ends the stream.
def consume_in_group(broker, topic, group)
  requests = Queue.new
  requests << V1::ConsumerSessionRequest.new(
    start: V1::SessionStart.new(group_id: group, topics: [topic],
                                auto_offset_reset: :OFFSET_RESET_EARLIEST, max_records: 10)
  )
  outgoing = Enumerator.new do |out|
    while (request = requests.pop)
      out << request
    end
  end
  seen = { 'assignments' => [], 'consumed' => [], 'committed' => nil }
  broker.consumer_session(outgoing, deadline: Time.now + 60).each do |event|
    case event.event
    when :assignment
      seen['assignments'] << event.assignment.partitions.map(&:partition).sort
    when :records
      batch = event.records
      batch.records.each do |r|
        seen['consumed'] << { 'partition' => batch.partition, 'offset' => r.offset, 'key' => r.key }
      end
      done = seen['consumed'].size >= RECORDS
      ack = V1::SessionOffset.new(topic: topic, partition: batch.partition, offset: batch.records.last.offset + 1)
      requests << V1::ConsumerSessionRequest.new(ack: V1::SessionAck.new(offsets: [ack], commit: done))
    when :committed
      seen['committed'] = event.committed.partitions.map { |p| [p.partition, p.offset, p.error.to_s] }.sort
      requests << nil
    when :notice
      raise "session notice: #{event.notice.error} #{event.notice.message}"
    end
  end
  seen
end

address, topic, group = ARGV
wait_serving(address)
broker = V1::Broker::Stub.new(address, :this_channel_is_insecure)
out = {}

created = broker.create_topics(V1::CreateTopicsRequest.new(topics: [V1::CreatableTopic.new(name: topic, num_partitions: PARTITIONS)]))
out['create_topics'] = created.topics.first.error.to_s
wait_leaders(broker, topic)

records = (0...RECORDS).map { |i| V1::Record.new(key: "key-#{i}", value: "value-#{i}") }
out['produce_error'], placements = produce_placed(broker, topic, records)
out['placements'] = placements.each_with_index.map { |p, i| ["key-#{i}", p.partition, p.offset] }

out['session'] = consume_in_group(broker, topic, group)

where = broker.find_coordinator(V1::FindCoordinatorRequest.new(keys: [group])).coordinators.first
coordinator = V1::GroupCoordinator::Stub.new("#{where.host}:#{where.port}", :this_channel_is_insecure)
fetched = coordinator.offset_fetch(V1::OffsetFetchRequest.new(
  group_id: group, topics: [V1::OffsetFetchTopic.new(name: topic, partition_indexes: [0, 1, 2])]
))
out['committed'] = fetched.topics.first.partitions.map { |p| [p.partition_index, p.committed_offset] }.sort

latest = broker.list_offsets(V1::ListOffsetsRequest.new(
  topics: [V1::ListOffsetsTopic.new(topic: topic, partitions: (0...PARTITIONS).map { |p| V1::ListOffsetsPartition.new(partition: p, timestamp: -1) })]
))
out['latest'] = latest.topics.first.partitions.map { |p| [p.partition, p.offset] }.sort

puts JSON.generate(out)
