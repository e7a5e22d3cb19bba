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
 * NAME=VALUE pairs are librdkafka settings (acks, linger.ms, batch.size, ...), except the
 * load generator's own, named perf.*:
 *   perf.partition=P      produce: to partition P instead of 0.
 *   perf.partitions=N     consume: partitions 0..N-1 (RECORDS in all), from their first
 *                         offsets.
 *   perf.consumers=M      consume: M consumers (librdkafka instances, each with its own
 *                         connection and fetch loop, one thread each), partition i read by
 *                         consumer i % M, as the members of a consumer group share a topic.
 * The timed part
 * starts once the topic's metadata is known (produce: after one record was delivered) and
 * ends when the last record was delivered or read. On success the only output is one line
 * on stdout, "records=N seconds=S"; on failure a message on stderr and exit status 1.
 */
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PAYLOAD_BYTES 100
#define DEADLINE_S 300.0
#define SLICE 10000
#define MAX_PARTITIONS 64

static char payload[PAYLOAD_BYTES];
static long long delivered;
static long long failed;
static char first_failure[512];

/* The load generator's own settings (perf.*), apart from librdkafka's. */
static int partition_produced = 0;
static int partitions_consumed = 1;
static int consumers = 1;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *detail) {
    fprintf(stderr, "perf_client: %s: %s\n", what, detail);
    exit(1);
}

static int own_setting(const char *name, const char *value) {
    char *end;
    long number = strtol(value, &end, 10);
    int valid = *end == '\0' && end != value;
    if (strcmp(name, "perf.partition") == 0) {
        if (!valid || number < 0) die("perf.partition is not a partition", value);
        partition_produced = (int)number;
    } else if (strcmp(name, "perf.partitions") == 0) {
        if (!valid || number < 1 || number > MAX_PARTITIONS)
            die("perf.partitions is not 1..64", value);
        partitions_consumed = (int)number;
    } else if (strcmp(name, "perf.consumers") == 0) {
        if (!valid || number < 1 || number > MAX_PARTITIONS)
            die("perf.consumers is not 1..64", value);
        consumers = (int)number;
    } else if (strncmp(name, "perf.", 5) == 0) {
        die("unknown setting", name);
    } else {
        return 0;
    }
    return 1;
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
        if (own_setting(setting, equals + 1)) continue;
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
    while (rd_kafka_produce(topic, partition_produced, 0, payload, PAYLOAD_BYTES, NULL, 0,
                            NULL) == -1) {
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
        int accepted = rd_kafka_produce_batch(topic, partition_produced, 0, slice, count);
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

/* All consumers' count, and the first error any of them met. */
static pthread_mutex_t consumed_lock = PTHREAD_MUTEX_INITIALIZER;
static long long consumed_total;
static long long consume_errors;
static long long consume_goal;

struct consumer {
    rd_kafka_t *rk;
    rd_kafka_topic_t *topic;
    rd_kafka_queue_t *queue;
    int partitions[MAX_PARTITIONS];
    int partition_count;
    double started;
    long long seen; /* counted here, added to consumed_total after each callback round */
    pthread_t thread;
};

static void on_message(rd_kafka_message_t *message, void *opaque) {
    struct consumer *consumer = opaque;
    if (message->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        consumer->seen++;
    } else if (message->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        pthread_mutex_lock(&consumed_lock);
        if (consume_errors++ == 0)
            snprintf(first_failure, sizeof first_failure, "%s",
                     rd_kafka_message_errstr(message));
        pthread_mutex_unlock(&consumed_lock);
    }
}

static int consuming(void) {
    pthread_mutex_lock(&consumed_lock);
    int more = consumed_total < consume_goal && consume_errors == 0;
    pthread_mutex_unlock(&consumed_lock);
    return more;
}

static void *consume_loop(void *opaque) {
    struct consumer *consumer = opaque;
    for (int i = 0; i < consumer->partition_count; i++)
        if (rd_kafka_consume_start_queue(consumer->topic, consumer->partitions[i],
                                         RD_KAFKA_OFFSET_BEGINNING, consumer->queue) == -1)
            die("consume_start", rd_kafka_err2str(rd_kafka_last_error()));
    while (consuming() && now_s() - consumer->started < DEADLINE_S) {
        consumer->seen = 0;
        rd_kafka_consume_callback_queue(consumer->queue, 100, on_message, consumer);
        pthread_mutex_lock(&consumed_lock);
        consumed_total += consumer->seen;
        pthread_mutex_unlock(&consumed_lock);
    }
    return NULL;
}

static int consume(const char *bootstrap, const char *name, long long records, int argc,
                   char **argv) {
    char error[512];
    static struct consumer each[MAX_PARTITIONS];
    consume_goal = records;
    for (int c = 0; c < consumers; c++) {
        rd_kafka_conf_t *conf = configure(bootstrap, argc, argv);
        each[c].rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, error, sizeof error);
        if (each[c].rk == NULL) die("consumer", error);
        each[c].topic = rd_kafka_topic_new(each[c].rk, name, NULL);
        each[c].queue = rd_kafka_queue_new(each[c].rk);
        /* The connection and the topic's metadata first: not timed. */
        const struct rd_kafka_metadata *metadata;
        rd_kafka_resp_err_t found =
            rd_kafka_metadata(each[c].rk, 0, each[c].topic, &metadata, 30000);
        if (found != RD_KAFKA_RESP_ERR_NO_ERROR) die("metadata", rd_kafka_err2str(found));
        rd_kafka_metadata_destroy(metadata);
    }
    if (consumers > partitions_consumed) die("perf.consumers", "more consumers than partitions");
    for (int p = 0; p < partitions_consumed; p++) {
        struct consumer *consumer = &each[p % consumers];
        consumer->partitions[consumer->partition_count++] = p;
    }
    double started = now_s();
    for (int c = 0; c < consumers; c++) {
        each[c].started = started;
        if (pthread_create(&each[c].thread, NULL, consume_loop, &each[c]) != 0)
            die("pthread_create", "failed");
    }
    for (int c = 0; c < consumers; c++) pthread_join(each[c].thread, NULL);
    double elapsed = now_s() - started;
    for (int c = 0; c < consumers; c++) {
        for (int i = 0; i < each[c].partition_count; i++)
            rd_kafka_consume_stop(each[c].topic, each[c].partitions[i]);
        rd_kafka_queue_destroy(each[c].queue);
        rd_kafka_topic_destroy(each[c].topic);
        rd_kafka_destroy(each[c].rk);
    }
    if (consume_errors || consumed_total < records) {
        fprintf(stderr, "perf_client: read %lld of %lld records, %lld errors (%s)\n",
                consumed_total, records, consume_errors, first_failure);
        return 1;
    }
    printf("records=%lld seconds=%.6f\n", consumed_total, elapsed);
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
    rd_kafka_conf_destroy(configure(argv[2], argc - 5, argv + 5)); /* checked, perf.* read */
    if (strcmp(argv[1], "produce") == 0)
        return produce(argv[2], argv[3], records, argc - 5, argv + 5);
    if (strcmp(argv[1], "consume") == 0)
        return consume(argv[2], argv[3], records, argc - 5, argv + 5);
    die("the first argument is produce or consume, not", argv[1]);
    return 2;
}
