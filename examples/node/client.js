// A Highwater client in Node.js: the gRPC API with stubs loaded from protos/ at run time.
//
//   node client.js HOST:PORT TOPIC GROUP
//
// It waits for the cluster to serve (grpc.health.v1), creates TOPIC with three partitions
// through the broker, produces keyed records to partition -1 (the broker places each by
// murmur2 of its key, as Kafka's default partitioner, and says where it went; records
// refused while a new leader creates its log are sent again, as a Kafka producer retries), reads them
// back decoded (RECORD_FORMAT_PLAIN, no RecordBatch codec needed), consumes them again as
// a member of GROUP through a consumer session (the broker runs the group protocol),
// acknowledging and committing as it goes, reads the committed offsets back at the
// group's coordinator and lists the partitions' latest offsets. It sets only the fields
// docs/grpc.md says a minimal client must set, and prints one JSON object of what it saw.
'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'protos');
const HEALTH_PROTO = require.resolve('grpc-health-check/proto/health/v1/health.proto');
const PARTITIONS = 3;
const RECORDS = 30;

// Field names as in the .proto files, int64 as strings, bytes as Buffers, and no defaults
// filled in: an optional field a server left unset stays absent.
const LOAD_OPTIONS = { keepCase: true, longs: String, enums: String, bytes: Buffer, defaults: false, oneofs: true };

function load(file, includeDirs) {
  return grpc.loadPackageDefinition(protoLoader.loadSync(file, { ...LOAD_OPTIONS, includeDirs }));
}

function call(client, method, request, timeoutMs = 30000) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + timeoutMs }, (error, answer) =>
      error ? reject(error) : resolve(answer));
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function waitServing(health) {
  for (let attempt = 0; attempt < 600; attempt += 1) {
    try {
      const answer = await call(health, 'Check', { service: '' }, 2000);
      if (answer.status === 'SERVING') return;
    } catch (error) {
      // Not listening yet: try again.
    }
    await sleep(100);
  }
  throw new Error('the server never reported SERVING');
}

async function waitLeaders(broker, topic) {
  for (let attempt = 0; attempt < 300; attempt += 1) {
    const answer = await call(broker, 'Metadata', { topics: [topic] });
    const partitions = (answer.topics && answer.topics[0] && answer.topics[0].partitions) || [];
    if (partitions.length === PARTITIONS && partitions.every((p) => (p.leader_id || 0) >= 0)) return;
    await sleep(100);
  }
  throw new Error(`${topic} got no leaders`);
}

// A consumer session: start as a member of GROUP, take records as they come, acknowledge
// each delivery (which frees its credit), commit once every record is in, then end the
// stream, which ends the membership.
function consumeInGroup(broker, topic, group) {
  return new Promise((resolve, reject) => {
    const session = broker.ConsumerSession({ deadline: Date.now() + 60000 });
    const seen = { assignments: [], consumed: [], committed: null };
    session.on('data', (event) => {
      if (event.assignment) {
        seen.assignments.push((event.assignment.partitions || []).map((p) => p.partition || 0).sort());
      } else if (event.records) {
        const { partition = 0, records = [] } = event.records;
        for (const r of records) {
          seen.consumed.push({ partition, offset: Number(r.offset || 0), key: r.key ? r.key.toString() : null });
        }
        const next = Number(records[records.length - 1].offset || 0) + 1;
        const done = seen.consumed.length >= RECORDS;
        session.write({ ack: { offsets: [{ topic, partition, offset: String(next) }], commit: done } });
      } else if (event.committed) {
        seen.committed = (event.committed.partitions || [])
          .map((p) => [p.partition || 0, Number(p.offset || 0), p.error || 'NONE'])
          .sort((a, b) => a[0] - b[0]);
        session.end();
      } else if (event.notice) {
        reject(new Error(`session notice: ${event.notice.error} ${event.notice.message}`));
      }
    });
    session.on('error', reject);
    session.on('end', () => resolve(seen));
    session.write({
      start: {
        group_id: group,
        topics: [topic],
        auto_offset_reset: 'OFFSET_RESET_EARLIEST',
        max_records: 10,
      },
    });
  });
}

// Errors a Kafka producer retries: the leader is moving or still creating its log.
const RETRIABLE = new Set(['NOT_LEADER_OR_FOLLOWER', 'LEADER_NOT_AVAILABLE', 'UNKNOWN_TOPIC_OR_PARTITION']);

// Produce records to partition -1 (the broker places each by its key); a record refused
// with a retriable error is sent again after a pause, the others keep their placement.
// Resolves to the error name ('NONE' once every record is placed) and the placements.
async function producePlaced(broker, topic, records) {
  const placements = new Array(records.length).fill(null);
  for (let attempt = 0; attempt < 100; attempt += 1) {
    const pending = [...placements.keys()].filter((i) => placements[i] === null);
    if (pending.length === 0) return ['NONE', placements];
    const produced = await call(broker, 'Produce', {
      topics: [{ topic, partitions: [{ partition: -1, records: { records: pending.map((i) => records[i]) } }] }],
    });
    const placed = produced.topics[0].partitions[0];
    const error = placed.error || 'NONE';
    const answers = placed.placements || [];
    if (answers.length === 0 && !RETRIABLE.has(error)) return [error, placements];
    for (let j = 0; j < answers.length; j += 1) {
      const placementError = answers[j].error || 'NONE';
      if (placementError === 'NONE') placements[pending[j]] = answers[j];
      else if (!RETRIABLE.has(placementError)) return [placementError, placements];
    }
    await sleep(100);
  }
  throw new Error(`${topic}: records still refused after 100 tries`);
}

async function main() {
  const [address, topic, group] = process.argv.slice(2);
  const v1 = load(
    ['highwater/v1/broker.proto', 'highwater/v1/coordinator.proto'].map((f) => path.join(PROTO_ROOT, f)),
    [PROTO_ROOT],
  ).highwater.v1;
  const health = new (load(HEALTH_PROTO, []).grpc.health.v1.Health)(address, grpc.credentials.createInsecure());
  const broker = new v1.Broker(address, grpc.credentials.createInsecure());
  const out = {};

  await waitServing(health);

  const created = await call(broker, 'CreateTopics', { topics: [{ name: topic, num_partitions: PARTITIONS }] });
  out.create_topics = created.topics[0].error || 'NONE';
  await waitLeaders(broker, topic);

  // Produce: keyed records to partition -1; the broker places them by key.
  const records = [];
  for (let i = 0; i < RECORDS; i += 1) {
    records.push({
      key: Buffer.from(`key-${i}`),
      value: Buffer.from(`value-${i}`),
      headers: [{ key: 'source', value: Buffer.from('node') }],
    });
  }
  const [produceError, placements] = await producePlaced(broker, topic, records);
  out.produce_error = produceError;
  out.placements = placements.map((p, i) => [`key-${i}`, p.partition || 0, Number(p.offset || 0)]);

  // Consume: every partition from offset 0, records decoded by the broker.
  const positions = new Array(PARTITIONS).fill(0);
  const consumed = [];
  for (let round = 0; round < 100 && consumed.length < RECORDS; round += 1) {
    const answer = await call(broker, 'Fetch', {
      record_format: 'RECORD_FORMAT_PLAIN',
      max_wait_ms: 200,
      topics: [{ topic, partitions: positions.map((offset, partition) => ({ partition, fetch_offset: offset })) }],
    });
    for (const p of answer.topics[0].partitions) {
      if (p.error && p.error !== 'NONE') throw new Error(`partition ${p.partition}: ${p.error}`);
      for (const r of p.plain_records || []) {
        consumed.push({
          partition: p.partition || 0,
          offset: Number(r.offset || 0),
          key: r.key ? r.key.toString() : null,
          value: r.value ? r.value.toString() : null,
          headers: (r.headers || []).map((h) => [h.key, h.value ? h.value.toString() : null]),
        });
        positions[p.partition || 0] = Number(r.offset || 0) + 1;
      }
    }
  }
  out.consumed = consumed;

  // Consume again as a member of the group, through a consumer session.
  out.session = await consumeInGroup(broker, topic, group);

  // The group's committed offsets, at its coordinator.
  const found = await call(broker, 'FindCoordinator', { keys: [group] });
  const where = found.coordinators[0];
  const coordinator = new v1.GroupCoordinator(`${where.host}:${where.port}`, grpc.credentials.createInsecure());
  const fetched = await call(coordinator, 'OffsetFetch', { group_id: group, topics: [{ name: topic, partition_indexes: [0, 1, 2] }] });
  out.committed = fetched.topics[0].partitions
    .map((p) => [p.partition_index || 0, Number(p.committed_offset || 0)])
    .sort((a, b) => a[0] - b[0]);

  const latest = await call(broker, 'ListOffsets', {
    topics: [{ topic, partitions: [0, 1, 2].map((partition) => ({ partition, timestamp: '-1' })) }],
  });
  out.latest = latest.topics[0].partitions
    .map((p) => [p.partition || 0, Number(p.offset || 0)])
    .sort((a, b) => a[0] - b[0]);

  process.stdout.write(`${JSON.stringify(out)}\n`);
  for (const client of [health, broker, coordinator]) client.close();
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
