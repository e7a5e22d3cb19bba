// How fast a Node.js client reads records without a RecordBatch codec (make bench).
//
//   node bench.js HOST:PORT TOPIC COUNT session|fetch [GROUP]
//
// `session`: a consumer session in GROUP from the earliest offset, acknowledging each
// delivery as it arrives; `fetch`: Fetch in RECORD_FORMAT_PLAIN from offset 0 of every
// partition. Either stops once COUNT records arrived and prints {records, seconds}.
'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'protos');
const LOAD_OPTIONS = { keepCase: true, longs: String, enums: String, bytes: Buffer, defaults: false, oneofs: true };

const v1 = grpc.loadPackageDefinition(
  protoLoader.loadSync(path.join(PROTO_ROOT, 'highwater/v1/broker.proto'), { ...LOAD_OPTIONS, includeDirs: [PROTO_ROOT] }),
).highwater.v1;

function session(broker, topic, count, group) {
  return new Promise((resolve, reject) => {
    const call = broker.ConsumerSession();
    let seen = 0;
    call.on('data', (event) => {
      if (!event.records) return;
      const { partition = 0, records = [] } = event.records;
      seen += records.length;
      const next = Number(records[records.length - 1].offset || 0) + 1;
      call.write({ ack: { offsets: [{ topic, partition, offset: String(next) }] } });
      if (seen >= count) call.end();
    });
    call.on('error', (error) => (error.code === grpc.status.CANCELLED ? resolve(seen) : reject(error)));
    call.on('end', () => resolve(seen));
    call.write({ start: { group_id: group, topics: [topic], auto_offset_reset: 'OFFSET_RESET_EARLIEST', max_records: 5000, max_bytes: 4 * 1024 * 1024 } });
  });
}

function fetchOnce(broker, request) {
  return new Promise((resolve, reject) => {
    broker.Fetch(request, (error, answer) => (error ? reject(error) : resolve(answer)));
  });
}

async function fetch(broker, topic, count) {
  const metadata = await new Promise((resolve, reject) => {
    broker.Metadata({ topics: [topic] }, (error, answer) => (error ? reject(error) : resolve(answer)));
  });
  const positions = metadata.topics[0].partitions.map(() => 0);
  let seen = 0;
  while (seen < count) {
    const answer = await fetchOnce(broker, {
      record_format: 'RECORD_FORMAT_PLAIN',
      max_wait_ms: 500,
      max_bytes: 4 * 1024 * 1024,
      topics: [{ topic, partitions: positions.map((offset, partition) => ({ partition, fetch_offset: String(offset), partition_max_bytes: 4 * 1024 * 1024 })) }],
    });
    for (const p of answer.topics[0].partitions) {
      const records = p.plain_records || [];
      if (!records.length) continue;
      seen += records.length;
      positions[p.partition || 0] = Number(records[records.length - 1].offset || 0) + 1;
    }
  }
  return seen;
}

async function main() {
  const [address, topic, countText, mode, group] = process.argv.slice(2);
  const count = Number(countText);
  const options = { 'grpc.max_receive_message_length': 64 * 1024 * 1024 };
  const broker = new v1.Broker(address, grpc.credentials.createInsecure(), options);
  const started = process.hrtime.bigint();
  const records = mode === 'session' ? await session(broker, topic, count, group) : await fetch(broker, topic, count);
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  process.stdout.write(`${JSON.stringify({ records, seconds })}\n`);
  broker.close();
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
