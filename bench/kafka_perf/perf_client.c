/* A Kafka load generator in C for the Kafka listener's benchmark (bench/kafka.py), in the
 * manner of Kafka's kafka-producer-perf-test and librdkafka's rdkafka_performance: the
 * client's own cost per record is kept as small as librdkafka allows, so the broker is what
 * the run measures.
 *
 *   perf_client produce BOOTSTRAP TOPIC RECORDS [NAME=VALUE ...]
 *       RECORDS records of 100 bytes (one pre-built payload, handed to librdkafka without a
 *       copy) to partition 0; every delivery report is checked.
 *   perf_client consume BOOTSTRAP TOPIC RECORDS [NAME=VALUE ...]
 *       reads partition 0 from its first offset until RECORDS records have arrived, counting
 *       them without looking at their bytes.
 *
 * NAME=VALUE pairs are librdkafka settings (acks, linger.ms, batch.size, ...). The timed part
 * starts once the topic's metadata is known (produce: after one record was delivered) and
 * ends when the last record was delivered or read. On success the only output is one line
 * on stdout, "records=N seconds=S"; on failure a message on stderr and exit status 1.
 */
#include <librdkafka/rdkafka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PAYLOAD_BYTES 100
#define DEADLINE_S 300.0
#define SLICE 10000

static char payload[PAYLOAD_BYTES];
static long long delivered;
static long long failed;
static char first_failure[512];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *detail) {
    fprintf(stderr, "perf_client: %s: %s\n", what, detail);
    exit(1);
}

static rd_kafka_conf_t *configure(const char *bootstrap, int argc, char **argv) {
    char error[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, error, sizeof error) !=
        RD_KAFKA_CONF_OK)
        die("bootstrap.servers", error);
    for (int i = 0; i < argc; i++) {
        char setting[512];
        snprintf(setting, sizeof setting, "%s", argv[i]);
        char *equals = strchr(setting, '=');
        if (equals == NULL) die("a setting is not NAME=VALUE", argv[i]);
        *equals = '\0';
        if (rd_kafka_conf_set(conf, setting, equals + 1, error, sizeof error) != RD_KAFKA_CONF_OK)
            die(setting, error);
    }
    return conf;
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *message, void *opaque) {
    (void)rk;
    (void)opaque;
    if (message->err) {
        if (failed++ == 0)
            snprintf(first_failure, sizeof first_failure, "%s", rd_kafka_err2str(message->err));
    } else {
        delivered++;
    }
}

static void produce_one(rd_kafka_t *rk, rd_kafka_topic_t *topic) {
    /* Flags 0: librdkafka neither copies nor frees the payload, which outlives the run. */
    while (rd_kafka_produce(topic, 0, 0, payload, PAYLOAD_BYTES, NULL, 0, NULL) == -1) {
        rd_kafka_resp_err_t err = rd_kafka_last_error();
        if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) die("produce", rd_kafka_err2str(err));
        rd_kafka_poll(rk, 1);
    }
}

static int produce(const char *bootstrap, const char *name, long long records, int argc,
                   char **argv) {
    char error[512];
    rd_kafka_conf_t *conf = configure(bootstrap, argc, argv);
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, error, sizeof error);
    if (rk == NULL) die("producer", error);
    rd_kafka_topic_t *topic = rd_kafka_topic_new(rk, name, NULL);
    for (int i = 0; i < PAYLOAD_BYTES; i++) payload[i] = (char)('0' + i % 64);

    produce_one(rk, topic); /* metadata and the connection to the leader: not timed */
    rd_kafka_flush(rk, 30000);
    if (delivered != 1) die("the first record was not delivered", first_failure);
    delivered = 0;

    /* Enqueued a slice at a time (one lock of the partition's queue per slice). */
    static rd_kafka_message_t slice[SLICE];
    double started = now_s();
    for (long long sent = 0; sent < records;) {
        int count = records - sent < SLICE ? (int)(records - sent) : SLICE;
        for (int i = 0; i < count; i++) {
            memset(&slice[i], 0, sizeof slice[i]);
            slice[i].payload = payload;
            slice[i].len = PAYLOAD_BYTES;
        }
        int accepted = rd_kafka_produce_batch(topic, 0, 0, slice, count);
        for (int i = accepted; i < count; i++)
            if (slice[i].err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
                die("produce", rd_kafka_err2str(slice[i].err));
        sent += accepted;
        rd_kafka_poll(rk, accepted < count ? 1 : 0); /* delivery reports */
    }
    rd_kafka_resp_err_t flushed = rd_kafka_flush(rk, (int)(DEADLINE_S * 1000));
    double elapsed = now_s() - started;
    if (flushed != RD_KAFKA_RESP_ERR_NO_ERROR || failed || delivered != records) {
        fprintf(stderr, "perf_client: %lld of %lld delivered, %lld failed (%s), flush: %s\n",
                delivered, records, failed, first_failure, rd_kafka_err2str(flushed));
        return 1;
    }
    rd_kafka_topic_destroy(topic);
    rd_kafka_destroy(rk);
    printf("records=%lld seconds=%.6f\n", records, elapsed);
    return 0;
}

struct consumed {
    long long records;
    long long errors;
};

static void on_message(rd_kafka_message_t *message, void *opaque) {
    struct consumed *seen = opaque;
    if (message->err == RD_KAFKA_RESP_ERR_NO_ERROR)
        seen->records++;
    else if (message->err != RD_KAFKA_RESP_ERR__PARTITION_EOF && seen->errors++ == 0)
        snprintf(first_failure, sizeof first_failure, "%s", rd_kafka_message_errstr(message));
}

static int consume(const char *bootstrap, const char *name, long long records, int argc,
                   char **argv) {
    char error[512];
    rd_kafka_conf_t *conf = configure(bootstrap, argc, argv);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, error, sizeof error);
    if (rk == NULL) die("consumer", error);
    rd_kafka_topic_t *topic = rd_kafka_topic_new(rk, name, NULL);
    struct consumed seen = {0, 0};
    /* The connection and the topic's metadata first: not timed. */
    const struct rd_kafka_metadata *metadata;
    rd_kafka_resp_err_t found = rd_kafka_metadata(rk, 0, topic, &metadata, 30000);
    if (found != RD_KAFKA_RESP_ERR_NO_ERROR) die("metadata", rd_kafka_err2str(found));
    rd_kafka_metadata_destroy(metadata);
    double started = now_s();
    if (rd_kafka_consume_start(topic, 0, RD_KAFKA_OFFSET_BEGINNING) == -1)
        die("consume_start", rd_kafka_err2str(rd_kafka_last_error()));
    while (seen.records < records && seen.errors == 0 && now_s() - started < DEADLINE_S)
        rd_kafka_consume_callback(topic, 0, 1000, on_message, &seen);
    double elapsed = now_s() - started;
    rd_kafka_consume_stop(topic, 0);
    rd_kafka_topic_destroy(topic);
    rd_kafka_destroy(rk);
    if (seen.errors || seen.records < records) {
        fprintf(stderr, "perf_client: read %lld of %lld records, %lld errors (%s)\n",
                seen.records, records, seen.errors, first_failure);
        return 1;
    }
    printf("records=%lld seconds=%.6f\n", seen.records, elapsed);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s produce|consume BOOTSTRAP TOPIC RECORDS [NAME=VALUE ...]\n",
                argv[0]);
        return 2;
    }
    char *end;
    long long records = strtoll(argv[4], &end, 10);
    if (*end != '\0' || records <= 0) die("RECORDS is not a positive number", argv[4]);
    if (strcmp(argv[1], "produce") == 0)
        return produce(argv[2], argv[3], records, argc - 5, argv + 5);
    if (strcmp(argv[1], "consume") == 0)
        return consume(argv[2], argv[3], records, argc - 5, argv + 5);
    die("the first argument is produce or consume, not", argv[1]);
    return 2;
}
