/* The compiled twin of the RecordBatch v2 hot paths (highwater.records._codec).
 *
 * Each function here stands in for a pure-Python one that stays the reference
 * (HIGHWATER_PURE_PYTHON=1 selects those): record_size, encode_records, read_records,
 * plain_records (read_records writing protobuf FetchedRecord messages, for the broker's
 * RECORD_FORMAT_PLAIN), scan_keys (RecordBatch.iter_keys), check_batch, crc32c and murmur2. They accept a
 * subset of their inputs that they handle byte for byte as the reference does; anything
 * else (a record that does not add up, a value out of range, an unusual type) is handed
 * back to the pure-Python code, which decodes it or raises the typed error with its
 * message. So the compiled code never has error messages of its own to keep in step,
 * and a corrupt batch meets the very same checks either way.
 *
 * Every read is checked against the end of the buffer (or of the record) before it is
 * made; nothing is read past a buffer whatever its bytes say. Buffers come through the
 * buffer protocol (bytes, bytearray, memoryview, mmap) and are released before return.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <limits.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HW_CRC_X86 1
#endif

/* ---------------------------------------------------------------------------------- */
/* Module state: the reference functions and types the compiled ones hand over to.     */

static PyObject *fallback_record_size;  /* record.record_size (pure) */
static PyObject *fallback_check_batch;  /* header.check_batch (pure) */
static PyTypeObject *batch_header_type; /* header.BatchHeader */
static PyTypeObject *append_info_type;  /* storage.log.AppendInfo */
static PyObject *empty_tuple;
static int unbound(PyObject *f);

/* ---------------------------------------------------------------------------------- */
/* CRC-32C (Castagnoli, reflected 0x82F63B78).                                          */

static uint32_t crc_table[8][256];

static void crc_init_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = (c >> 8) ^ crc_table[0][c & 0xFF];
            crc_table[t][i] = c;
        }
    }
}

static uint32_t crc32c_soft(uint32_t crc, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc; /* little-endian hosts: the low bytes come first */
        crc = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^
              crc_table[5][(w >> 16) & 0xFF] ^ crc_table[4][(w >> 24) & 0xFF] ^
              crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
              crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

#ifdef HW_CRC_X86
static int crc_hw;

/* Three independent streams hide the crc32 instruction's latency (three cycles, one per
 * cycle in flight): a block of 3 * len bytes is summed as three runs from zero, which are
 * then joined by shifting the first over len zero bytes (a GF(2) matrix applied with four
 * 256-entry tables, built once for each of the two block lengths) and adding the next.
 * The method of Mark Adler's crc32c.c, written here from its description. A 16 KiB batch
 * costs about half of one stream's time. */
#define CRC_LONG 4096
#define CRC_SHORT 256
static uint32_t crc_shift_long[4][256], crc_shift_short[4][256];

static uint32_t gf2_times(const uint32_t *matrix, uint32_t vector) {
    uint32_t sum = 0;
    for (; vector; vector >>= 1, matrix++)
        if (vector & 1) sum ^= *matrix;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *matrix) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(matrix, matrix[n]);
}

/* The tables that shift a CRC register over ``length`` zero bytes (a power of two). */
static void crc_shift_tables(uint32_t tables[4][256], size_t length) {
    uint32_t odd[32], even[32], *op;
    odd[0] = 0x82F63B78u; /* one zero bit */
    for (int n = 1; n < 32; n++) odd[n] = 1u << (n - 1);
    gf2_square(even, odd); /* two bits */
    gf2_square(odd, even); /* four bits */
    op = odd;
    for (;;) {
        gf2_square(even, odd); /* 8, 32, 128... bits: 1, 4, 16... bytes */
        op = even;
        length >>= 1;
        if (length == 0) break;
        gf2_square(odd, even);
        op = odd;
        length >>= 1;
        if (length == 0) break;
    }
    for (uint32_t n = 0; n < 256; n++) {
        tables[0][n] = gf2_times(op, n);
        tables[1][n] = gf2_times(op, n << 8);
        tables[2][n] = gf2_times(op, n << 16);
        tables[3][n] = gf2_times(op, n << 24);
    }
}

static inline uint64_t crc_shift(uint32_t tables[4][256], uint64_t crc) {
    return tables[0][crc & 0xFF] ^ tables[1][(crc >> 8) & 0xFF] ^ tables[2][(crc >> 16) & 0xFF] ^
           tables[3][(crc >> 24) & 0xFF];
}

__attribute__((target("sse4.2"))) static uint64_t crc_blocks(uint64_t c, const uint8_t **pp,
                                                             size_t *np, size_t block,
                                                             uint32_t tables[4][256]) {
    const uint8_t *p = *pp;
    size_t n = *np;
    while (n >= 3 * block) {
        uint64_t c1 = 0, c2 = 0;
        for (const uint8_t *end = p + block; p < end; p += 8) {
            uint64_t a, b, d;
            memcpy(&a, p, 8);
            memcpy(&b, p + block, 8);
            memcpy(&d, p + 2 * block, 8);
            c = _mm_crc32_u64(c, a);
            c1 = _mm_crc32_u64(c1, b);
            c2 = _mm_crc32_u64(c2, d);
        }
        c = crc_shift(tables, c) ^ c1;
        c = crc_shift(tables, c) ^ c2;
        p += 2 * block;
        n -= 3 * block;
    }
    *pp = p;
    *np = n;
    return c;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const uint8_t *p,
                                                             size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    c = crc_blocks(c, &p, &n, CRC_LONG, crc_shift_long);
    c = crc_blocks(c, &p, &n, CRC_SHORT, crc_shift_short);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}

/* Folding with carry-less multiplication (AVX-512 VPCLMULQDQ), where the CPU has it.
 *
 * A 16-byte piece X of the message, followed by d more bits, may be replaced by any Y with
 * Y = X * x^d (mod P) placed over the 16 bytes that start d bits later (added to them):
 * the CRC, a remainder mod P, does not change. With X = H * x^64 + L (H its first 8
 * bytes), Y = H * (x^(64+d) mod P) + L * (x^d mod P), two 64 x 32-bit carry-less products
 * of under 128 bits. In the bit-reflected order of the CRC's bytes a product of two 64-bit
 * lanes comes out shifted one degree up, so each constant is taken one degree lower,
 * x^(64+d-1) and x^(d-1) mod P, computed once at import. Sixteen 16-byte accumulators in
 * four 512-bit registers fold forward by 256 bytes per step; they are then folded into
 * one, which the crc32 instruction reduces (from a zero register: the folded pieces carry
 * the same remainder) before the last bytes. The register's incoming state is added into
 * the first four bytes. A 16 KiB batch: about 0.3 µs on this machine, against 0.8 µs for
 * the three streams above. */
#define CRC_FOLD_MIN 256
static int crc_fold;
static __m128i crc_fold_128, crc_fold_256, crc_fold_384, crc_fold_512, crc_fold_2048;

/* x^n mod P, P = the CRC-32C polynomial (0x1EDC6F41 with x^32), in the normal bit order. */
static uint32_t crc_x_power(unsigned n) {
    uint64_t r = 1;
    for (unsigned i = 0; i < n; i++) {
        r <<= 1;
        if (r & (1ull << 32)) r ^= 0x11EDC6F41ull;
    }
    return (uint32_t)r;
}

/* A polynomial of degree < 32 as a 64-bit lane in the reflected order (x^63 at bit 0). */
static uint64_t crc_reflected_lane(uint32_t k) {
    uint64_t lane = 0;
    for (int i = 0; i < 32; i++)
        if (k & (1u << i)) lane |= 1ull << (63 - i);
    return lane;
}

/* The pair of constants that folds a 16-byte piece ``bits`` further: for its first
 * 8 bytes (the low lane) and for its last 8 (the high lane). */
static __m128i crc_fold_constants(unsigned bits) {
    return _mm_set_epi64x((long long)crc_reflected_lane(crc_x_power(bits - 1)),
                          (long long)crc_reflected_lane(crc_x_power(64 + bits - 1)));
}

#define CRC_FOLD_TARGET __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2")))
#define CRC_FOLD512(z, k, next)                                                              \
    _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(z, k, 0x00),                         \
                              _mm512_clmulepi64_epi128(z, k, 0x11), next, 0x96)
#define CRC_FOLD128(x, k)                                                                    \
    _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11))

/* The running state after ``n`` >= CRC_FOLD_MIN more bytes, by folding. */
CRC_FOLD_TARGET static uint32_t crc32c_folded(uint32_t state, const uint8_t *p, size_t n) {
    __m512i z0 = _mm512_loadu_si512(p), z1 = _mm512_loadu_si512(p + 64);
    __m512i z2 = _mm512_loadu_si512(p + 128), z3 = _mm512_loadu_si512(p + 192);
    const __m128i incoming = _mm_cvtsi32_si128((int)state);
    z0 = _mm512_xor_si512(z0, _mm512_inserti32x4(_mm512_setzero_si512(), incoming, 0));
    p += 256;
    n -= 256;
    const __m512i step = _mm512_broadcast_i32x4(crc_fold_2048);
    while (n >= 256) {
        z0 = CRC_FOLD512(z0, step, _mm512_loadu_si512(p));
        z1 = CRC_FOLD512(z1, step, _mm512_loadu_si512(p + 64));
        z2 = CRC_FOLD512(z2, step, _mm512_loadu_si512(p + 128));
        z3 = CRC_FOLD512(z3, step, _mm512_loadu_si512(p + 192));
        p += 256;
        n -= 256;
    }
    const __m512i join = _mm512_broadcast_i32x4(crc_fold_512);
    z1 = CRC_FOLD512(z0, join, z1);
    z2 = CRC_FOLD512(z1, join, z2);
    z3 = CRC_FOLD512(z2, join, z3);
    __m128i x = _mm_xor_si128(
        _mm_xor_si128(CRC_FOLD128(_mm512_extracti32x4_epi32(z3, 0), crc_fold_384),
                      CRC_FOLD128(_mm512_extracti32x4_epi32(z3, 1), crc_fold_256)),
        _mm_xor_si128(CRC_FOLD128(_mm512_extracti32x4_epi32(z3, 2), crc_fold_128),
                      _mm512_extracti32x4_epi32(z3, 3)));
    for (; n >= 16; p += 16, n -= 16)
        x = _mm_xor_si128(CRC_FOLD128(x, crc_fold_128), _mm_loadu_si128((const __m128i *)p));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(x, 1));
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}

static void crc_fold_init(void) {
    crc_fold = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul") &&
               __builtin_cpu_supports("sse4.2");
    if (!crc_fold) return;
    crc_fold_128 = crc_fold_constants(128);
    crc_fold_256 = crc_fold_constants(256);
    crc_fold_384 = crc_fold_constants(384);
    crc_fold_512 = crc_fold_constants(512);
    crc_fold_2048 = crc_fold_constants(2048);
}
#endif

/* The running (not inverted) CRC-32C state after ``n`` more bytes: a sum over pieces
 * that are not contiguous starts from 0xFFFFFFFF and inverts at the end. */
static uint32_t crc32c_update(uint32_t state, const uint8_t *p, size_t n) {
#ifdef HW_CRC_X86
    if (crc_fold && n >= CRC_FOLD_MIN) return crc32c_folded(state, p, n);
    if (crc_hw) return crc32c_hw(state, p, n);
#endif
    return crc32c_soft(state, p, n);
}

static uint32_t crc32c_of(const uint8_t *p, size_t n) { return ~crc32c_update(0xFFFFFFFFu, p, n); }

/* ---------------------------------------------------------------------------------- */
/* Buffers.                                                                             */

typedef struct {
    const uint8_t *p;
    Py_ssize_t n;
    Py_buffer view; /* view.obj NULL when p points into a bytes object directly */
} Bytes;

/* Borrow the bytes of ``o`` (bytes fast, anything with the buffer protocol else).
 * Returns -1 without an exception set when ``o`` has no contiguous bytes. */
static int bytes_get(PyObject *o, Bytes *b) {
    b->view.obj = NULL;
    if (PyBytes_CheckExact(o)) {
        b->p = (const uint8_t *)PyBytes_AS_STRING(o);
        b->n = PyBytes_GET_SIZE(o);
        return 0;
    }
    if (PyObject_GetBuffer(o, &b->view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        b->view.obj = NULL;
        return -1;
    }
    b->p = (const uint8_t *)b->view.buf;
    b->n = b->view.len;
    return 0;
}

static void bytes_release(Bytes *b) {
    if (b->view.obj != NULL) PyBuffer_Release(&b->view);
    b->view.obj = NULL;
}

/* ---------------------------------------------------------------------------------- */
/* Varints (zigzag), strict as varint.py: at most 5 bytes for an int32 (the fifth at   */
/* most 0x0F), 10 for an int64 (the tenth at most 0x01). 0 on success, -1 otherwise.    */

static inline int get_varint(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end, int32_t *out) {
    Py_ssize_t p = *pos;
    uint32_t v = 0;
    for (int i = 0; i < 5; i++) {
        if (p >= end) return -1;
        uint8_t b = buf[p++];
        if (i == 4) {
            if (b > 0x0F) return -1;
        }
        v |= (uint32_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *out = (int32_t)((v >> 1) ^ (0u - (v & 1u)));
            *pos = p;
            return 0;
        }
    }
    return -1;
}

static inline int get_varlong(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end, int64_t *out) {
    Py_ssize_t p = *pos;
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end) return -1;
        uint8_t b = buf[p++];
        if (i == 9 && b > 0x01) return -1;
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *out = (int64_t)((v >> 1) ^ (0ull - (v & 1ull)));
            *pos = p;
            return 0;
        }
    }
    return -1;
}

static inline int size_of_unsigned(uint64_t u) {
    int n = 1;
    while (u >= 0x80) {
        u >>= 7;
        n++;
    }
    return n;
}

static inline int size_of_varint64(int64_t v) {
    return size_of_unsigned(((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}

static inline uint8_t *put_varint64(uint8_t *out, int64_t v) {
    uint64_t u = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (u >= 0x80) {
        *out++ = (uint8_t)((u & 0x7F) | 0x80);
        u >>= 7;
    }
    *out++ = (uint8_t)u;
    return out;
}

/* ---------------------------------------------------------------------------------- */
/* Integer arguments.                                                                   */

/* ``o`` as an int64; 0 if it is an int in range, -1 (no exception) otherwise. An exact int
 * of up to two digits (below 2**60: sizes, counts, timestamps) is read from its digits
 * where the layout is known (3.11; 3.12 on have a public call for it), the rest through
 * PyLong_AsLongLongAndOverflow. The producer's lane reads several ints per record. */
static inline int as_int64(PyObject *o, int64_t *out) {
    if (PyLong_CheckExact(o)) {
#if PY_VERSION_HEX >= 0x030C0000
        if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
            *out = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
            return 0;
        }
#elif PY_VERSION_HEX >= 0x030B0000 && PYLONG_BITS_IN_DIGIT == 30
        Py_ssize_t n = Py_SIZE(o);
        const digit *d = ((PyLongObject *)o)->ob_digit;
        switch (n) {
        case 0: *out = 0; return 0;
        case 1: *out = (int64_t)d[0]; return 0;
        case -1: *out = -(int64_t)d[0]; return 0;
        case 2: *out = (int64_t)d[0] | ((int64_t)d[1] << PyLong_SHIFT); return 0;
        case -2: *out = -((int64_t)d[0] | ((int64_t)d[1] << PyLong_SHIFT)); return 0;
        default: break;
        }
#endif
    } else if (!PyLong_Check(o)) {
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* record_size: the bytes write_record appends for one record.                          */

/* The size of one record, or -1 (no exception) when it is not the common kind the
 * compiled code sizes: then the pure function decides (and raises where it must). An
 * exception set means a real error (memory). */
static Py_ssize_t record_size_of(int64_t offset_delta, int64_t timestamp_delta, PyObject *key,
                                 PyObject *value, PyObject *headers) {
    if (offset_delta < INT32_MIN || offset_delta > INT32_MAX) return -1;
    Py_ssize_t size = 1 + size_of_varint64(timestamp_delta) + size_of_varint64(offset_delta);
    Py_ssize_t n;
    if (key == Py_None) {
        size += 1;
    } else {
        if (PyBytes_CheckExact(key)) n = PyBytes_GET_SIZE(key);
        else if (PyByteArray_CheckExact(key)) n = PyByteArray_GET_SIZE(key);
        else return -1;
        if (n > INT32_MAX) return -1;
        size += size_of_varint64(n) + n;
    }
    if (value == Py_None) {
        size += 1;
    } else {
        if (PyBytes_CheckExact(value)) n = PyBytes_GET_SIZE(value);
        else if (PyByteArray_CheckExact(value)) n = PyByteArray_GET_SIZE(value);
        else return -1;
        if (n > INT32_MAX) return -1;
        size += size_of_varint64(n) + n;
    }
    if (PyTuple_CheckExact(headers) || PyList_CheckExact(headers)) {
        Py_ssize_t count = PySequence_Fast_GET_SIZE(headers);
        PyObject **items = PySequence_Fast_ITEMS(headers);
        size += size_of_varint64(count);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *h = items[i];
            if (!PyTuple_CheckExact(h) || PyTuple_GET_SIZE(h) != 2) return -1;
            PyObject *hk = PyTuple_GET_ITEM(h, 0), *hv = PyTuple_GET_ITEM(h, 1);
            if (!PyUnicode_CheckExact(hk)) return -1;
            Py_ssize_t kn;
            if (PyUnicode_AsUTF8AndSize(hk, &kn) == NULL) {
                PyErr_Clear(); /* lone surrogates: the pure code raises what it raises */
                return -1;
            }
            if (kn > INT32_MAX) return -1;
            size += size_of_varint64(kn) + kn;
            if (hv == Py_None) {
                size += 1;
            } else {
                if (PyBytes_CheckExact(hv)) n = PyBytes_GET_SIZE(hv);
                else if (PyByteArray_CheckExact(hv)) n = PyByteArray_GET_SIZE(hv);
                else return -1;
                if (n > INT32_MAX) return -1;
                size += size_of_varint64(n) + n;
            }
        }
    } else {
        return -1;
    }
    if (size > INT32_MAX) return -1;
    return size + size_of_varint64(size);
}

static PyObject *codec_record_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs == 4 || nargs == 5) {
        int64_t od, td;
        PyObject *headers = nargs == 5 ? args[4] : empty_tuple;
        if (as_int64(args[0], &od) == 0 && as_int64(args[1], &td) == 0) {
            Py_ssize_t size = record_size_of(od, td, args[2], args[3], headers);
            if (size >= 0) return PyLong_FromSsize_t(size);
            if (PyErr_Occurred()) return NULL;
        }
    }
    if (unbound(fallback_record_size)) return NULL;
    return PyObject_Vectorcall(fallback_record_size, args, nargs, NULL);
}

/* ---------------------------------------------------------------------------------- */
/* append_fields: RecordBatchBuilder.append_fields, on the builder's slots.              */

enum {
    B_BUILT, B_RECORDS, B_SIZES, B_SIZE, B_BASE_TS, B_MAX_TS, B_MAX_BYTES, B_ENCODED, B_BUFFER,
    B_SLOTS
};
static const char *builder_slot_names[B_SLOTS] = {
    "_built",         "_records",       "_sizes",     "_size",
    "_base_timestamp", "_max_timestamp", "_max_bytes", "_encoded", "_buffer"};
static PyTypeObject *builder_type;
static Py_ssize_t builder_offsets[B_SLOTS];
static PyObject *fallback_append_fields; /* batch.RecordBatchBuilder.append_fields (pure) */

static int slot_offset(PyTypeObject *cls, PyObject *name, Py_ssize_t *offset);

static inline PyObject *slot_get(PyObject *obj, int i) {
    return *(PyObject **)((char *)obj + builder_offsets[i]);
}

static inline void slot_put(PyObject *obj, int i, PyObject *value) { /* steals value */
    PyObject **slot = (PyObject **)((char *)obj + builder_offsets[i]);
    PyObject *old = *slot;
    *slot = value;
    Py_XDECREF(old);
}

typedef struct RecordBufferObject RecordBufferObject;
static PyTypeObject RecordBufferType;
static Py_ssize_t buffer_append(RecordBufferObject *b, PyObject *key, PyObject *value,
                                PyObject *headers, int64_t timestamp);

/* The builder's append when every value is one handled here: the size added (0: it does
 * not fit), -1 to hand over to the pure method (nothing changed), -2 on an error. */
static Py_ssize_t builder_append(PyObject *builder, PyObject *fields) {
    if (builder_type == NULL || !PyObject_TypeCheck(builder, builder_type)) return -1;
    if (!PyTuple_CheckExact(fields) || PyTuple_GET_SIZE(fields) != 4) return -1;
    PyObject *built = slot_get(builder, B_BUILT), *records = slot_get(builder, B_RECORDS);
    PyObject *sizes = slot_get(builder, B_SIZES), *size_obj = slot_get(builder, B_SIZE);
    PyObject *base_obj = slot_get(builder, B_BASE_TS), *max_obj = slot_get(builder, B_MAX_TS);
    PyObject *max_bytes_obj = slot_get(builder, B_MAX_BYTES);
    PyObject *buffer = slot_get(builder, B_BUFFER);
    if (built == Py_None && buffer != NULL && Py_IS_TYPE(buffer, &RecordBufferType) &&
        slot_get(builder, B_ENCODED) == Py_None) { /* the records go straight into bytes */
        int64_t ts;
        if (as_int64(PyTuple_GET_ITEM(fields, 3), &ts) < 0) return -1;
        return buffer_append((RecordBufferObject *)buffer, PyTuple_GET_ITEM(fields, 0),
                             PyTuple_GET_ITEM(fields, 1), PyTuple_GET_ITEM(fields, 2), ts);
    }
    if (buffer != Py_None) return -1;
    if (built != Py_None || slot_get(builder, B_ENCODED) != Py_None || records == NULL ||
        !PyList_CheckExact(records) || sizes == NULL ||
        !PyList_CheckExact(sizes) || size_obj == NULL || base_obj == NULL || max_obj == NULL ||
        max_bytes_obj == NULL)
        return -1;
    int64_t timestamp, total, base_ts = 0, max_ts, max_bytes, delta = 0;
    if (as_int64(PyTuple_GET_ITEM(fields, 3), &timestamp) < 0 || as_int64(size_obj, &total) < 0 ||
        as_int64(max_obj, &max_ts) < 0 || as_int64(max_bytes_obj, &max_bytes) < 0)
        return -1;
    int first = base_obj == Py_None;
    if (!first && (as_int64(base_obj, &base_ts) < 0 ||
                   __builtin_sub_overflow(timestamp, base_ts, &delta)))
        return -1;
    Py_ssize_t count = PyList_GET_SIZE(records);
    Py_ssize_t size = record_size_of(first ? 0 : count, delta, PyTuple_GET_ITEM(fields, 0),
                                     PyTuple_GET_ITEM(fields, 1), PyTuple_GET_ITEM(fields, 2));
    if (size < 0) return PyErr_Occurred() ? -2 : -1;
    if (!first && total + size > max_bytes) return 0;
    PyObject *size_value = PyLong_FromSsize_t(size), *total_value = PyLong_FromLongLong(total + size);
    PyObject *ts_value = NULL;
    if (first || timestamp > max_ts) {
        /* The record's own int, as the pure method keeps it (a subclass becomes an int). */
        PyObject *given = PyTuple_GET_ITEM(fields, 3);
        if (PyLong_CheckExact(given)) {
            Py_INCREF(given);
            ts_value = given;
        } else {
            ts_value = PyLong_FromLongLong(timestamp);
        }
    }
    if (size_value == NULL || total_value == NULL || ((first || timestamp > max_ts) && !ts_value) ||
        PyList_Append(records, fields) < 0) {
        Py_XDECREF(size_value);
        Py_XDECREF(total_value);
        Py_XDECREF(ts_value);
        return -2;
    }
    if (PyList_Append(sizes, size_value) < 0) {
        PyList_SetSlice(records, count, count + 1, NULL);
        Py_DECREF(size_value);
        Py_DECREF(total_value);
        Py_XDECREF(ts_value);
        return -2;
    }
    Py_DECREF(size_value);
    slot_put(builder, B_SIZE, total_value);
    if (ts_value != NULL) {
        if (first) {
            Py_INCREF(ts_value);
            slot_put(builder, B_BASE_TS, ts_value);
        }
        slot_put(builder, B_MAX_TS, ts_value);
    }
    return size;
}

/* append_fields(builder, fields) -> int */
static PyObject *codec_append_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs == 2) {
        Py_ssize_t size = builder_append(args[0], args[1]);
        if (size >= 0) return PyLong_FromSsize_t(size);
        if (size == -2) return NULL;
    }
    if (unbound(fallback_append_fields)) return NULL;
    return PyObject_Vectorcall(fallback_append_fields, args, nargs, NULL);
}

/* ---------------------------------------------------------------------------------- */
/* encode_records: the bodies of a batch's records, from (key, value, headers, ts).     */

static inline uint8_t *put_bytes_field(uint8_t *out, PyObject *o) {
    if (o == Py_None) {
        *out++ = 1;
        return out;
    }
    const char *p;
    Py_ssize_t n;
    if (PyBytes_CheckExact(o)) {
        p = PyBytes_AS_STRING(o);
        n = PyBytes_GET_SIZE(o);
    } else {
        p = PyByteArray_AS_STRING(o);
        n = PyByteArray_GET_SIZE(o);
    }
    out = put_varint64(out, n);
    memcpy(out, p, (size_t)n);
    return out + n;
}

/* One record's bytes at ``out``, of ``size`` bytes (record_size_of's, which checked the
 * fields: their types, that a header key encodes); returns where they end. */
static uint8_t *write_record_at(uint8_t *out, Py_ssize_t size, int64_t delta,
                                int64_t offset_delta, PyObject *key, PyObject *value,
                                PyObject *headers) {
    /* The length is what record_size_of gave less its own varint. */
    Py_ssize_t body = size - 1;
    while (size_of_varint64(body) + body > size) body--;
    out = put_varint64(out, body);
    *out++ = 0; /* attributes */
    out = put_varint64(out, delta);
    out = put_varint64(out, offset_delta);
    out = put_bytes_field(out, key);
    out = put_bytes_field(out, value);
    Py_ssize_t hcount = PySequence_Fast_GET_SIZE(headers);
    PyObject **hitems = PySequence_Fast_ITEMS(headers);
    out = put_varint64(out, hcount);
    for (Py_ssize_t j = 0; j < hcount; j++) {
        Py_ssize_t kn;
        const char *k = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(hitems[j], 0), &kn);
        out = put_varint64(out, kn);
        memcpy(out, k, (size_t)kn);
        out += kn;
        out = put_bytes_field(out, PyTuple_GET_ITEM(hitems[j], 1));
    }
    return out;
}

/* encode_records(records, base_timestamp) -> bytes, or None when a record is not one
 * the compiled code writes (the caller then runs the pure function). */
static PyObject *codec_encode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "encode_records(records, base_timestamp)");
        return NULL;
    }
    PyObject *records = args[0];
    int64_t base_timestamp;
    if (!(PyList_CheckExact(records) || PyTuple_CheckExact(records)) ||
        as_int64(args[1], &base_timestamp) < 0)
        Py_RETURN_NONE;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(records);
    PyObject **items = PySequence_Fast_ITEMS(records);
    if (count > INT32_MAX) Py_RETURN_NONE;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *r = items[i];
        int64_t ts, delta;
        if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) != 4 ||
            as_int64(PyTuple_GET_ITEM(r, 3), &ts) < 0 ||
            __builtin_sub_overflow(ts, base_timestamp, &delta))
            Py_RETURN_NONE;
        Py_ssize_t size = record_size_of(i, delta, PyTuple_GET_ITEM(r, 0), PyTuple_GET_ITEM(r, 1),
                                         PyTuple_GET_ITEM(r, 2));
        if (size < 0) {
            if (PyErr_Occurred()) return NULL;
            Py_RETURN_NONE;
        }
        if (total > PY_SSIZE_T_MAX - size) Py_RETURN_NONE;
        total += size;
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) return NULL;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *r = items[i];
        PyObject *key = PyTuple_GET_ITEM(r, 0), *value = PyTuple_GET_ITEM(r, 1);
        PyObject *headers = PyTuple_GET_ITEM(r, 2);
        int64_t ts = 0, delta; /* checked in the sizing pass above */
        as_int64(PyTuple_GET_ITEM(r, 3), &ts);
        delta = ts - base_timestamp;
        Py_ssize_t size = record_size_of(i, delta, key, value, headers);
        uint8_t *start = out;
        out = write_record_at(out, size, delta, i, key, value, headers);
        if (out - start != size) { /* cannot happen: the sizes are computed alike */
            Py_DECREF(result);
            PyErr_SetString(PyExc_SystemError, "encode_records: record size mismatch");
            return NULL;
        }
    }
    return result;
}

/* ---------------------------------------------------------------------------------- */
/* SlotFactory: makes an instance of a __slots__ class from a decoded record, without   */
/* running its __init__ (the consumer's messages).                                      */

#define FACTORY_FIELDS 5 /* key, value, headers, timestamp, offset */
#define FACTORY_MAX_CONSTANTS 16

typedef struct {
    PyObject_HEAD
    PyTypeObject *cls;
    Py_ssize_t field_offsets[FACTORY_FIELDS];
    Py_ssize_t nconstants;
    Py_ssize_t constant_offsets[FACTORY_MAX_CONSTANTS];
    PyObject *constant_values[FACTORY_MAX_CONSTANTS];
    int constants_atomic; /* every constant is an atomic value (atomic_value) */
    vectorcallfunc vectorcall;
} SlotFactoryObject;

static PyTypeObject SlotFactoryType;

static int slot_offset(PyTypeObject *cls, PyObject *name, Py_ssize_t *offset) {
    PyObject *d = PyObject_GetAttr((PyObject *)cls, name);
    if (d == NULL) return -1;
    if (!Py_IS_TYPE(d, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX ||
        (((PyMemberDescrObject *)d)->d_member->flags & READONLY)) {
        Py_DECREF(d);
        PyErr_Format(PyExc_TypeError, "%R is not a writable slot of %R", name, cls);
        return -1;
    }
    *offset = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    return 0;
}

static inline void set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value) {
    PyObject **slot = (PyObject **)((char *)obj + offset);
    PyObject *old = *slot;
    Py_INCREF(value);
    *slot = value;
    Py_XDECREF(old);
}

/* A value that refers to no other object: it can be in no reference cycle. */
static inline int atomic_value(PyObject *v) {
    return v == Py_None || PyBytes_CheckExact(v) || PyUnicode_CheckExact(v) ||
           PyLong_CheckExact(v) || PyBool_Check(v) || PyFloat_CheckExact(v);
}

/* Headers as the decoder makes them: a tuple of (name, value) tuples of atomic values. */
static int atomic_headers(PyObject *headers) {
    if (!PyTuple_CheckExact(headers)) return 0;
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(headers); i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(headers, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !atomic_value(PyTuple_GET_ITEM(pair, 0)) || !atomic_value(PyTuple_GET_ITEM(pair, 1)))
            return 0;
    }
    return 1;
}

/* A new instance with the five fields (borrowed references) and the constants.
 *
 * An instance whose every slot holds an atomic value (and headers made of them) can be in
 * no reference cycle, so it is taken out of the cycle collector's lists, as CPython does
 * for tuples and dicts of atomic values. A consumer holds a fetched batch's messages while
 * it hands them out: tracked, thousands of them at a time were promoted to the older
 * generations and every collection walked them (with 1 MB batches, over 40 % of a
 * consumer's CPU went to the collector). */
static PyObject *factory_make(SlotFactoryObject *f, PyObject *const *fields) {
    PyObject *obj = f->cls->tp_alloc(f->cls, 0);
    if (obj == NULL) return NULL;
    for (int i = 0; i < FACTORY_FIELDS; i++) set_slot(obj, f->field_offsets[i], fields[i]);
    for (Py_ssize_t i = 0; i < f->nconstants; i++)
        set_slot(obj, f->constant_offsets[i], f->constant_values[i]);
    if (f->constants_atomic && PyObject_GC_IsTracked(obj) && atomic_value(fields[0]) &&
        atomic_value(fields[1]) && atomic_headers(fields[2]) && atomic_value(fields[3]) &&
        atomic_value(fields[4]))
        PyObject_GC_UnTrack(obj);
    return obj;
}

static PyObject *factory_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != FACTORY_FIELDS || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError,
                        "a slot factory takes (key, value, headers, timestamp, offset)");
        return NULL;
    }
    return factory_make((SlotFactoryObject *)self, args);
}

static PyObject *factory_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *cls, *fields, *constants;
    static char *kwlist[] = {"cls", "fields", "constants", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!:SlotFactory", kwlist, &PyType_Type, &cls,
                                     &PyTuple_Type, &fields, &PyDict_Type, &constants))
        return NULL;
    PyTypeObject *c = (PyTypeObject *)cls;
    if (PyTuple_GET_SIZE(fields) != FACTORY_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "fields names the slots of the five record fields");
        return NULL;
    }
    if (PyDict_GET_SIZE(constants) > FACTORY_MAX_CONSTANTS) {
        PyErr_SetString(PyExc_ValueError, "too many constants");
        return NULL;
    }
    if (c->tp_dictoffset != 0 || c->tp_alloc == NULL) {
        PyErr_Format(PyExc_TypeError, "%R must have __slots__ and no __dict__", cls);
        return NULL;
    }
    SlotFactoryObject *f = (SlotFactoryObject *)type->tp_alloc(type, 0);
    if (f == NULL) return NULL;
    Py_INCREF(cls);
    f->cls = c;
    f->vectorcall = factory_vectorcall;
    for (int i = 0; i < FACTORY_FIELDS; i++) {
        if (slot_offset(c, PyTuple_GET_ITEM(fields, i), &f->field_offsets[i]) < 0) goto fail;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    f->constants_atomic = 1;
    while (PyDict_Next(constants, &pos, &k, &v)) {
        Py_ssize_t i = f->nconstants;
        if (!atomic_value(v)) f->constants_atomic = 0;
        if (slot_offset(c, k, &f->constant_offsets[i]) < 0) goto fail;
        Py_INCREF(v);
        f->constant_values[i] = v;
        f->nconstants++;
    }
    return (PyObject *)f;
fail:
    Py_DECREF(f);
    return NULL;
}

static void factory_dealloc(SlotFactoryObject *f) {
    PyObject_GC_UnTrack(f);
    Py_XDECREF(f->cls);
    for (Py_ssize_t i = 0; i < f->nconstants; i++) Py_XDECREF(f->constant_values[i]);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static int factory_traverse(SlotFactoryObject *f, visitproc visit, void *arg) {
    Py_VISIT(f->cls);
    for (Py_ssize_t i = 0; i < f->nconstants; i++) Py_VISIT(f->constant_values[i]);
    return 0;
}

static PyTypeObject SlotFactoryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "highwater.records._codec.SlotFactory",
    .tp_basicsize = sizeof(SlotFactoryObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "SlotFactory(cls, fields, constants): make(key, value, headers, timestamp, "
              "offset) -> an instance of cls with those slots and the constant ones set, "
              "its __init__ not run.",
    .tp_new = factory_new,
    .tp_dealloc = (destructor)factory_dealloc,
    .tp_traverse = (traverseproc)factory_traverse,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(SlotFactoryObject, vectorcall),
};

/* ---------------------------------------------------------------------------------- */
/* read_records: decode records into make(key, value, headers, timestamp, offset).      */

/* Decode the headers of a record: count at *pos, up to record_end. A new tuple, or NULL
 * with no exception when they do not add up (the pure code says why), NULL with an
 * exception on a real error. */
static PyObject *decode_headers(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t record_end,
                                int32_t count) {
    Py_ssize_t p = *pos;
    if (count < 0 || 2 * (Py_ssize_t)count > record_end - p) return NULL;
    PyObject *headers = PyTuple_New(count);
    if (headers == NULL) return NULL;
    for (int32_t i = 0; i < count; i++) {
        int32_t kn, vn;
        if (get_varint(buf, &p, record_end, &kn) < 0 || kn < 0 || kn > record_end - p) goto odd;
        PyObject *hk = PyUnicode_DecodeUTF8((const char *)buf + p, kn, NULL);
        if (hk == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto error;
            PyErr_Clear();
            goto odd;
        }
        p += kn;
        PyObject *hv;
        if (get_varint(buf, &p, record_end, &vn) < 0 || vn < -1 || vn > record_end - p) {
            Py_DECREF(hk);
            goto odd;
        }
        if (vn == -1) {
            hv = Py_None;
            Py_INCREF(hv);
        } else {
            hv = PyBytes_FromStringAndSize((const char *)buf + p, vn);
            if (hv == NULL) {
                Py_DECREF(hk);
                goto error;
            }
            p += vn;
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(hk);
            Py_DECREF(hv);
            goto error;
        }
        PyTuple_SET_ITEM(pair, 0, hk);
        PyTuple_SET_ITEM(pair, 1, hv);
        PyTuple_SET_ITEM(headers, i, pair);
    }
    if (p != record_end) goto odd;
    *pos = p;
    return headers;
odd:
    Py_DECREF(headers);
    return NULL;
error:
    Py_DECREF(headers);
    return NULL;
}

/* Decode one record at *pos (before end) into its fields; 1 on success, 0 when the
 * record is not one the compiled code takes (the pure code decides), -1 on an error. */
typedef struct {
    int64_t timestamp_delta;
    int32_t offset_delta;
    PyObject *key, *value, *headers; /* new references on success */
    Py_ssize_t end;
} Decoded;

static int decode_one(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end, Decoded *d) {
    int32_t length, kn, vn, hcount;
    Py_ssize_t p = pos;
    if (get_varint(buf, &p, end, &length) < 0 || length < 6 || length > end - p) return 0;
    Py_ssize_t record_end = p + length;
    p += 1; /* attributes */
    if (get_varlong(buf, &p, record_end, &d->timestamp_delta) < 0) return 0;
    if (get_varint(buf, &p, record_end, &d->offset_delta) < 0) return 0;
    if (get_varint(buf, &p, record_end, &kn) < 0 || kn < -1 || kn > record_end - p) return 0;
    const uint8_t *key = buf + p;
    if (kn > 0) p += kn;
    if (get_varint(buf, &p, record_end, &vn) < 0 || vn < -1 || vn > record_end - p) return 0;
    const uint8_t *value = buf + p;
    if (vn > 0) p += vn;
    if (get_varint(buf, &p, record_end, &hcount) < 0) return 0;
    if (hcount == 0 && p != record_end) return 0;
    PyObject *headers;
    if (hcount == 0) {
        headers = empty_tuple;
        Py_INCREF(headers);
    } else {
        headers = decode_headers(buf, &p, record_end, hcount);
        if (headers == NULL) return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *k, *v;
    if (kn == -1) {
        k = Py_None;
        Py_INCREF(k);
    } else if ((k = PyBytes_FromStringAndSize((const char *)key, kn)) == NULL) {
        Py_DECREF(headers);
        return -1;
    }
    if (vn == -1) {
        v = Py_None;
        Py_INCREF(v);
    } else if ((v = PyBytes_FromStringAndSize((const char *)value, vn)) == NULL) {
        Py_DECREF(headers);
        Py_DECREF(k);
        return -1;
    }
    d->key = k;
    d->value = v;
    d->headers = headers;
    d->end = record_end;
    return 1;
}

/* read_records(buf, pos, end, count, base_offset, base_timestamp, log_append_time,
 *              last_offset_delta, out, make) -> (pos, decoded, previous_delta)
 *
 * Decodes records as the pure read_records does, appending make(...) of each to out,
 * and stops at the first record it does not take (or count records, or end): the
 * caller hands the rest to the pure code from (pos, previous_delta). */
static PyObject *codec_read_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "read_records takes 10 arguments");
        return NULL;
    }
    Py_ssize_t pos, end, count;
    int64_t base_offset, base_timestamp, log_append_time = 0, last_delta;
    pos = PyLong_AsSsize_t(args[1]);
    end = PyLong_AsSsize_t(args[2]);
    count = PyLong_AsSsize_t(args[3]);
    if ((pos == -1 || end == -1 || count == -1) && PyErr_Occurred()) return NULL;
    PyObject *out = args[8], *make = args[9];
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        return NULL;
    }
    int have_lat = args[6] != Py_None;
    Py_ssize_t done = 0;
    int64_t previous = -1;
    if (as_int64(args[4], &base_offset) < 0 || as_int64(args[5], &base_timestamp) < 0 ||
        (have_lat && as_int64(args[6], &log_append_time) < 0) ||
        as_int64(args[7], &last_delta) < 0)
        return Py_BuildValue("(nnL)", pos, done, (long long)previous);
    Bytes b;
    if (bytes_get(args[0], &b) < 0) return Py_BuildValue("(nnL)", pos, done, (long long)previous);
    if (end > b.n) end = b.n; /* never past the buffer, whatever the caller says */
    SlotFactoryObject *factory =
        Py_IS_TYPE(make, &SlotFactoryType) ? (SlotFactoryObject *)make : NULL;
    PyObject *timestamp_obj = NULL; /* shared for log-append-time batches */
    if (have_lat) {
        timestamp_obj = args[6];
        Py_INCREF(timestamp_obj);
    }
    PyObject *result = NULL;
    while (done < count && pos >= 0 && pos < end) {
        Decoded d;
        int r = decode_one(b.p, pos, end, &d);
        if (r < 0) goto finally;
        if (r == 0) break;
        int64_t offset, timestamp;
        if (d.offset_delta <= previous || d.offset_delta > last_delta ||
            __builtin_add_overflow(base_offset, (int64_t)d.offset_delta, &offset) ||
            (!have_lat &&
             __builtin_add_overflow(base_timestamp, d.timestamp_delta, &timestamp))) {
            Py_DECREF(d.key);
            Py_DECREF(d.value);
            Py_DECREF(d.headers);
            break;
        }
        PyObject *fields[FACTORY_FIELDS];
        fields[0] = d.key;
        fields[1] = d.value;
        fields[2] = d.headers;
        fields[3] = have_lat ? (Py_INCREF(timestamp_obj), timestamp_obj)
                             : PyLong_FromLongLong(timestamp);
        fields[4] = PyLong_FromLongLong(offset);
        PyObject *item = NULL;
        if (fields[3] != NULL && fields[4] != NULL)
            item = factory != NULL ? factory_make(factory, fields)
                                   : PyObject_Vectorcall(make, fields, FACTORY_FIELDS, NULL);
        for (int i = 0; i < FACTORY_FIELDS; i++) Py_XDECREF(fields[i]);
        if (item == NULL) goto finally;
        int failed = PyList_Append(out, item);
        Py_DECREF(item);
        if (failed) goto finally;
        previous = d.offset_delta;
        pos = d.end;
        done++;
    }
    result = Py_BuildValue("(nnL)", pos, done, (long long)previous);
finally:
    Py_XDECREF(timestamp_obj);
    bytes_release(&b);
    return result;
}

/* ---------------------------------------------------------------------------------- */
/* plain_records: records as protobuf wire, one FetchedRecord message each.             */

/* A record as plain_records needs it: its fields where they lie in the buffer. */
typedef struct {
    int64_t timestamp_delta;
    int32_t offset_delta, kn, vn, hcount;
    const uint8_t *key, *value;
    Py_ssize_t headers, end;
    Py_ssize_t headers_wire; /* what its headers take as RecordHeader messages */
} PlainRecord;

static inline Py_ssize_t bytes_field_size(int32_t n) { /* tag, length, bytes */
    return 1 + size_of_unsigned((uint64_t)n) + n;
}

/* 1 when valid UTF-8 (as bytes.decode("utf-8") says), 0 when not, -1 on an error. */
static int utf8_ok(const uint8_t *p, int32_t n) {
    if (n == 0) return 1;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    if (s != NULL) {
        Py_DECREF(s);
        return 1;
    }
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
    PyErr_Clear();
    return 0;
}

/* As decode_one, without making objects: 1 on success, 0 when the record is not one the
 * compiled code takes, -1 on an error. */
static int plain_one(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end, PlainRecord *d) {
    int32_t length;
    Py_ssize_t p = pos;
    if (get_varint(buf, &p, end, &length) < 0 || length < 6 || length > end - p) return 0;
    Py_ssize_t record_end = p + length;
    p += 1; /* attributes */
    if (get_varlong(buf, &p, record_end, &d->timestamp_delta) < 0) return 0;
    if (get_varint(buf, &p, record_end, &d->offset_delta) < 0) return 0;
    if (get_varint(buf, &p, record_end, &d->kn) < 0 || d->kn < -1 || d->kn > record_end - p)
        return 0;
    d->key = buf + p;
    if (d->kn > 0) p += d->kn;
    if (get_varint(buf, &p, record_end, &d->vn) < 0 || d->vn < -1 || d->vn > record_end - p)
        return 0;
    d->value = buf + p;
    if (d->vn > 0) p += d->vn;
    if (get_varint(buf, &p, record_end, &d->hcount) < 0) return 0;
    if (d->hcount < 0 || 2 * (Py_ssize_t)d->hcount > record_end - p) return 0;
    d->headers = p;
    d->headers_wire = 0;
    for (int32_t i = 0; i < d->hcount; i++) {
        int32_t hk = 0, hv = 0;
        if (get_varint(buf, &p, record_end, &hk) < 0 || hk < 0 || hk > record_end - p) return 0;
        int ok = utf8_ok(buf + p, hk);
        if (ok <= 0) return ok;
        p += hk;
        if (get_varint(buf, &p, record_end, &hv) < 0 || hv < -1 || hv > record_end - p) return 0;
        if (hv > 0) p += hv;
        Py_ssize_t inner = (hk ? bytes_field_size(hk) : 0) + (hv >= 0 ? bytes_field_size(hv) : 0);
        d->headers_wire += 1 + size_of_unsigned((uint64_t)inner) + inner;
    }
    if (p != record_end) return 0;
    d->end = record_end;
    return 1;
}

typedef struct {
    uint8_t *p;
    Py_ssize_t n, cap;
} Out;

static int out_reserve(Out *o, Py_ssize_t more) {
    if (o->n + more <= o->cap) return 0;
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap < o->n + more) cap *= 2;
    uint8_t *p = PyMem_Realloc(o->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->p = p;
    o->cap = cap;
    return 0;
}

static inline uint8_t *put_uvarint(uint8_t *out, uint64_t u) {
    while (u >= 0x80) {
        *out++ = (uint8_t)((u & 0x7F) | 0x80);
        u >>= 7;
    }
    *out++ = (uint8_t)u;
    return out;
}

static inline uint8_t *put_bytes(uint8_t *out, uint8_t tag, const uint8_t *p, int32_t n) {
    *out++ = tag;
    out = put_uvarint(out, (uint64_t)n);
    if (n > 0) memcpy(out, p, (size_t)n);
    return out + (n > 0 ? n : 0);
}

/* Write the record's FetchedRecord (offset 1, timestamp_ms 2, timestamp_type 3, key 4,
 * value 5, headers 6 as RecordHeader {key 1, value 2}, leader_epoch 7) as an entry of the
 * repeated field whose tag is ``tag``. Zero scalars are left out, as proto3 does. */
static int put_plain(Out *o, uint8_t tag, const uint8_t *buf, const PlainRecord *d,
                     int64_t offset, int64_t timestamp, int32_t timestamp_type,
                     int32_t leader_epoch) {
    uint64_t epoch = (uint64_t)(int64_t)leader_epoch; /* an int32 goes out sign-extended */
    Py_ssize_t inner = (offset ? 1 + size_of_unsigned((uint64_t)offset) : 0) +
                       (timestamp ? 1 + size_of_unsigned((uint64_t)timestamp) : 0) +
                       (timestamp_type ? 1 + size_of_unsigned((uint64_t)timestamp_type) : 0) +
                       (d->kn >= 0 ? bytes_field_size(d->kn) : 0) +
                       (d->vn >= 0 ? bytes_field_size(d->vn) : 0) + d->headers_wire +
                       (leader_epoch ? 1 + size_of_unsigned(epoch) : 0);
    if (out_reserve(o, 1 + 10 + inner) < 0) return -1;
    uint8_t *w = o->p + o->n;
    *w++ = tag;
    w = put_uvarint(w, (uint64_t)inner);
    if (offset) {
        *w++ = 0x08;
        w = put_uvarint(w, (uint64_t)offset);
    }
    if (timestamp) {
        *w++ = 0x10;
        w = put_uvarint(w, (uint64_t)timestamp);
    }
    if (timestamp_type) {
        *w++ = 0x18;
        w = put_uvarint(w, (uint64_t)timestamp_type);
    }
    if (d->kn >= 0) w = put_bytes(w, 0x22, d->key, d->kn);
    if (d->vn >= 0) w = put_bytes(w, 0x2A, d->value, d->vn);
    Py_ssize_t p = d->headers;
    for (int32_t i = 0; i < d->hcount; i++) { /* plain_one checked every length */
        int32_t hk = 0, hv = 0;
        get_varint(buf, &p, d->end, &hk);
        const uint8_t *k = buf + p;
        p += hk;
        get_varint(buf, &p, d->end, &hv);
        const uint8_t *v = buf + p;
        if (hv > 0) p += hv;
        Py_ssize_t size = (hk ? bytes_field_size(hk) : 0) + (hv >= 0 ? bytes_field_size(hv) : 0);
        *w++ = 0x32;
        w = put_uvarint(w, (uint64_t)size);
        if (hk) w = put_bytes(w, 0x0A, k, hk);
        if (hv >= 0) w = put_bytes(w, 0x12, v, hv);
    }
    if (leader_epoch) {
        *w++ = 0x38;
        w = put_uvarint(w, epoch);
    }
    o->n = w - o->p;
    return 0;
}

/* plain_records(buf, pos, end, count, base_offset, base_timestamp, log_append_time,
 *               last_offset_delta, fetch_offset, timestamp_type, leader_epoch, limit, tag)
 *   -> (wire, pos, decoded, previous_delta, added)
 *
 * Walks the records as read_records does (the same checks), and writes each one at or
 * after fetch_offset as a FetchedRecord entry (see put_plain), at most ``limit`` of them
 * (negative: no limit). Stops at the first record it does not take, at the limit, or
 * after count records: the caller checks which (the pure code decodes what it left). */
static PyObject *codec_plain_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "plain_records takes 13 arguments");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    Py_ssize_t count = PyLong_AsSsize_t(args[3]), limit = PyLong_AsSsize_t(args[11]);
    long timestamp_type = PyLong_AsLong(args[9]), leader_epoch = PyLong_AsLong(args[10]);
    long tag = PyLong_AsLong(args[12]);
    if (PyErr_Occurred()) return NULL;
    int64_t base_offset, base_timestamp, log_append_time = 0, last_delta, fetch_offset;
    int have_lat = args[6] != Py_None;
    Py_ssize_t done = 0, added = 0;
    int64_t previous = -1;
    if (as_int64(args[4], &base_offset) < 0 || as_int64(args[5], &base_timestamp) < 0 ||
        (have_lat && as_int64(args[6], &log_append_time) < 0) ||
        as_int64(args[7], &last_delta) < 0 || as_int64(args[8], &fetch_offset) < 0 ||
        timestamp_type < 0 || timestamp_type > 0x7F || leader_epoch < INT32_MIN ||
        leader_epoch > INT32_MAX || tag < 0 || tag > 0x7F)
        return Py_BuildValue("(y#nnLn)", "", (Py_ssize_t)0, pos, done, (long long)previous, added);
    Bytes b;
    if (bytes_get(args[0], &b) < 0)
        return Py_BuildValue("(y#nnLn)", "", (Py_ssize_t)0, pos, done, (long long)previous, added);
    if (end > b.n) end = b.n;
    Out out = {NULL, 0, 0};
    PyObject *result = NULL;
    while (done < count && pos >= 0 && pos < end && (limit < 0 || added < limit)) {
        PlainRecord d;
        int r = plain_one(b.p, pos, end, &d);
        if (r < 0) goto finally;
        if (r == 0) break;
        int64_t offset, timestamp;
        if (d.offset_delta <= previous || d.offset_delta > last_delta ||
            __builtin_add_overflow(base_offset, (int64_t)d.offset_delta, &offset) ||
            (!have_lat && __builtin_add_overflow(base_timestamp, d.timestamp_delta, &timestamp)))
            break;
        if (have_lat) timestamp = log_append_time;
        if (offset >= fetch_offset) {
            if (put_plain(&out, (uint8_t)tag, b.p, &d, offset, timestamp, (int32_t)timestamp_type,
                          (int32_t)leader_epoch) < 0)
                goto finally;
            added++;
        }
        previous = d.offset_delta;
        pos = d.end;
        done++;
    }
    result = Py_BuildValue("(y#nnLn)", out.p ? (const char *)out.p : "", out.n, pos, done,
                           (long long)previous, added);
finally:
    PyMem_Free(out.p);
    bytes_release(&b);
    return result;
}

/* ---------------------------------------------------------------------------------- */
/* scan_keys: (offset, key, value_is_null) of each record, for the log cleaner.          */

/* One record's framing as the key scans read it (RecordBatch.iter_keys): its length,
 * attributes, timestamp delta, an offset delta above ``previous`` and at most
 * ``last_delta``, the key, and a value that leaves at least one byte for the header count.
 * 0 with ``out`` filled; -1 where the scan stops (the pure loop then raises the typed error). */
typedef struct {
    Py_ssize_t end; /* where the next record starts */
    int32_t delta, key_length, value_length;
    int64_t offset;
    const uint8_t *key;
} KeyedRecord;

static inline int next_keyed_record(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end,
                                    int64_t base_offset, int64_t last_delta, int64_t previous,
                                    KeyedRecord *out) {
    Py_ssize_t p = pos;
    int32_t length, delta, kn, vn;
    int64_t td, offset;
    if (get_varint(buf, &p, end, &length) < 0 || length < 6 || length > end - p) return -1;
    Py_ssize_t record_end = p + length;
    p += 1;
    if (get_varlong(buf, &p, record_end, &td) < 0) return -1;
    if (get_varint(buf, &p, record_end, &delta) < 0) return -1;
    if (delta <= previous || delta > last_delta ||
        __builtin_add_overflow(base_offset, (int64_t)delta, &offset))
        return -1;
    if (get_varint(buf, &p, record_end, &kn) < 0 || kn < -1 || kn > record_end - p) return -1;
    const uint8_t *key = buf + p;
    if (kn > 0) p += kn;
    if (get_varint(buf, &p, record_end, &vn) < 0 || vn < -1) return -1;
    /* The value, then at least one byte of header count, must fit. */
    if (p + (vn > 0 ? vn : 0) >= record_end) return -1;
    *out = (KeyedRecord){record_end, delta, kn, vn, offset, key};
    return 0;
}

/* scan_keys(data, pos, end, count, base_offset, last_offset_delta)
 *   -> (keys, pos, decoded, previous_delta)
 * As RecordBatch.iter_keys: values and headers are skipped (not parsed), the framing
 * that leads to them checked. Stops at the first record it does not take. */
static PyObject *codec_scan_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "scan_keys takes 6 arguments");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    Py_ssize_t count = PyLong_AsSsize_t(args[3]);
    if ((pos == -1 || end == -1 || count == -1) && PyErr_Occurred()) return NULL;
    int64_t base_offset, last_delta, previous = -1;
    Py_ssize_t done = 0;
    PyObject *keys = PyList_New(0);
    if (keys == NULL) return NULL;
    Bytes b;
    if (as_int64(args[4], &base_offset) < 0 || as_int64(args[5], &last_delta) < 0 ||
        bytes_get(args[0], &b) < 0)
        return Py_BuildValue("(NnnL)", keys, pos, done, (long long)previous);
    if (end > b.n) end = b.n;
    const uint8_t *buf = b.p;
    PyObject *result = NULL;
    KeyedRecord r;
    while (done < count && pos >= 0 && pos < end &&
           next_keyed_record(buf, pos, end, base_offset, last_delta, previous, &r) == 0) {
        PyObject *k;
        if (r.key_length == -1) {
            k = Py_None;
            Py_INCREF(k);
        } else if ((k = PyBytes_FromStringAndSize((const char *)r.key, r.key_length)) == NULL) {
            goto finally;
        }
        PyObject *item = Py_BuildValue("(LNO)", (long long)r.offset, k,
                                       r.value_length == -1 ? Py_True : Py_False);
        if (item == NULL) goto finally;
        int failed = PyList_Append(keys, item);
        Py_DECREF(item);
        if (failed) goto finally;
        previous = r.delta;
        pos = r.end;
        done++;
    }
    result = Py_BuildValue("(OnnL)", keys, pos, done, (long long)previous);
finally:
    Py_DECREF(keys);
    bytes_release(&b);
    return result;
}

/* ---------------------------------------------------------------------------------- */
/* check_batch: the 61-byte header's checks and the CRC-32C of bytes 21..end.            */

static inline int64_t be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return (int64_t)v;
}
static inline int32_t be32(const uint8_t *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}
static inline int16_t be16(const uint8_t *p) {
    return (int16_t)(((uint16_t)p[0] << 8) | (uint16_t)p[1]);
}

#define HEADER_SIZE 61
#define LOG_OVERHEAD 12

static PyObject *header_tuple(const uint8_t *h) {
    PyObject *t = batch_header_type->tp_alloc(batch_header_type, 13);
    if (t == NULL) return NULL;
    PyObject *v[13];
    v[0] = PyLong_FromLongLong(be64(h));
    v[1] = PyLong_FromLong(be32(h + 8));
    v[2] = PyLong_FromLong(be32(h + 12));
    v[3] = PyLong_FromLong((signed char)h[16]);
    v[4] = PyLong_FromUnsignedLong((uint32_t)be32(h + 17));
    v[5] = PyLong_FromLong(be16(h + 21));
    v[6] = PyLong_FromLong(be32(h + 23));
    v[7] = PyLong_FromLongLong(be64(h + 27));
    v[8] = PyLong_FromLongLong(be64(h + 35));
    v[9] = PyLong_FromLongLong(be64(h + 43));
    v[10] = PyLong_FromLong(be16(h + 51));
    v[11] = PyLong_FromLong(be32(h + 53));
    v[12] = PyLong_FromLong(be32(h + 57));
    int failed = 0;
    for (int i = 0; i < 13; i++) {
        if (v[i] == NULL) failed = 1;
        PyTuple_SET_ITEM(t, i, v[i]);
    }
    if (failed) {
        Py_DECREF(t);
        return NULL;
    }
    return t;
}

/* 1 when the batch at pos passes every check of the pure check_batch, 0 otherwise. */
static int batch_ok(const uint8_t *buf, Py_ssize_t n, Py_ssize_t pos, int verify_crc) {
    if (pos < 0 || pos > n || n - pos < HEADER_SIZE) return 0;
    const uint8_t *h = buf + pos;
    int32_t length = be32(h + 8);
    if (h[16] != 2 || length < HEADER_SIZE - LOG_OVERHEAD) return 0;
    Py_ssize_t size = (Py_ssize_t)length + LOG_OVERHEAD;
    if (size > n - pos) return 0;
    if (be32(h + 23) < 0 || be32(h + 57) < 0) return 0;
    if ((be16(h + 21) & 0x07) > 4) return 0;
    if (verify_crc && crc32c_of(h + 21, (size_t)(size - 21)) != (uint32_t)be32(h + 17)) return 0;
    return 1;
}

/* check_batch(buf, pos=0, *, verify_crc=True) -> BatchHeader */
static PyObject *codec_check_batch(PyObject *self, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t pos = 0;
    int verify_crc = 1, simple = nargs >= 1 && nargs <= 2;
    if (kwnames != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i);
            if (PyUnicode_CompareWithASCIIString(name, "verify_crc") == 0) {
                int t = PyObject_IsTrue(args[nargs + i]);
                if (t < 0) return NULL;
                verify_crc = t;
            } else {
                simple = 0;
            }
        }
    }
    if (simple && nargs == 2) {
        if (!PyLong_CheckExact(args[1])) simple = 0;
        else {
            pos = PyLong_AsSsize_t(args[1]);
            if (pos == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                simple = 0;
            }
        }
    }
    if (simple && batch_header_type != NULL) {
        Bytes b;
        if (bytes_get(args[0], &b) == 0) {
            PyObject *result = NULL;
            int ok = batch_ok(b.p, b.n, pos, verify_crc);
            if (ok) result = header_tuple(b.p + pos);
            bytes_release(&b);
            if (ok) return result;
        }
    }
    /* Not a batch the checks pass (or unusual arguments): the pure code raises. */
    if (unbound(fallback_check_batch)) return NULL;
    return PyObject_Vectorcall(fallback_check_batch, args, nargsf, kwnames);
}

/* A growable byte buffer for the storage functions below (index entries, filtered
 * records). */
typedef struct {
    uint8_t *p;
    Py_ssize_t n, cap;
} StoreBuf;

static int sb_reserve(StoreBuf *b, Py_ssize_t extra) {
    if (extra <= b->cap - b->n) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap - b->n < extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    uint8_t *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}
static inline void put_be64(uint8_t *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static PyObject *sb_bytes(StoreBuf *b) {
    return PyBytes_FromStringAndSize((const char *)b->p, b->n);
}

static void sb_free(StoreBuf *b) {
    PyMem_Free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* scan_batches(buf, pos, end, next_offset, max_offset, max_batch_size, index_interval,
 *              since_index_entry, max_timestamp, offset_of_max_timestamp, index_base_offset)
 *   -> (end, next_offset, max_timestamp, offset_of_max, since, offset_index, time_index,
 *       notable)
 * or None when an argument or an index entry is out of the range handled here. The walk
 * of header.scan_batches, with a Python object only per notable batch: the index entries
 * come encoded as the index files hold them. */
static PyObject *codec_scan_batches(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "scan_batches takes 11 arguments");
        return NULL;
    }
    int64_t v[10];
    for (int i = 0; i < 10; i++) {
        if (as_int64(args[i + 1], &v[i]) < 0) Py_RETURN_NONE;
    }
    int64_t pos = v[0], end = v[1], next_offset = v[2], max_offset = v[3];
    int64_t max_batch_size = v[4], interval = v[5], since = v[6], max_ts = v[7], offset_of_max = v[8];
    int64_t index_base = v[9];
    if (pos < 0 || batch_header_type == NULL) Py_RETURN_NONE;
    Bytes b;
    if (bytes_get(args[0], &b) < 0) Py_RETURN_NONE;
    if (end > b.n) end = b.n;
    StoreBuf offsets = {0}, times = {0};
    PyObject *notable = PyList_New(0), *result = NULL, *offset_index = NULL, *time_index = NULL;
    if (notable == NULL) goto finally;
    int64_t valid = pos, epoch = -1, time_last = 0;
    int have_time = 0, out_of_range = 0;
    while (valid < end) {
        if (!batch_ok(b.p, (Py_ssize_t)end, (Py_ssize_t)valid, 1)) break;
        const uint8_t *h = b.p + valid;
        int64_t base_offset = be64(h), size = (int64_t)be32(h + 8) + LOG_OVERHEAD, last_offset;
        if (__builtin_add_overflow(base_offset, (int64_t)be32(h + 23), &last_offset)) break;
        if (base_offset < next_offset || last_offset > max_offset || size > max_batch_size) break;
        int64_t ts = be64(h + 35);
        if (ts > max_ts) {
            max_ts = ts;
            offset_of_max = last_offset;
        }
        if (since > interval) {
            int64_t relative, time_relative;
            if (__builtin_sub_overflow(last_offset, index_base, &relative) ||
                __builtin_sub_overflow(offset_of_max, index_base, &time_relative) ||
                relative < INT32_MIN || relative > INT32_MAX || time_relative < INT32_MIN ||
                time_relative > INT32_MAX || valid > INT32_MAX) {
                out_of_range = 1; /* the pure walk raises struct.error, as the index would */
                break;
            }
            if (sb_reserve(&offsets, 8) < 0) goto finally;
            put_be32(offsets.p + offsets.n, (uint32_t)(int32_t)relative);
            put_be32(offsets.p + offsets.n + 4, (uint32_t)(int32_t)valid);
            offsets.n += 8;
            if (!have_time || max_ts > time_last) {
                if (sb_reserve(&times, 12) < 0) goto finally;
                put_be64(times.p + times.n, (uint64_t)max_ts);
                put_be32(times.p + times.n + 8, (uint32_t)(int32_t)time_relative);
                times.n += 12;
                have_time = 1;
                time_last = max_ts;
            }
            since = 0;
        }
        since += size;
        int32_t leader_epoch = be32(h + 12);
        if (leader_epoch > epoch || be64(h + 43) >= 0) {
            if (leader_epoch > epoch) epoch = leader_epoch;
            PyObject *header = header_tuple(h);
            if (header == NULL) goto finally;
            int failed = PyList_Append(notable, header);
            Py_DECREF(header);
            if (failed) goto finally;
        }
        next_offset = last_offset + 1;
        valid += size;
    }
    if (out_of_range) {
        result = Py_None;
        Py_INCREF(result);
        goto finally;
    }
    if ((offset_index = sb_bytes(&offsets)) == NULL || (time_index = sb_bytes(&times)) == NULL)
        goto finally;
    result = Py_BuildValue("(LLLLLOOO)", (long long)valid, (long long)next_offset,
                           (long long)max_ts, (long long)offset_of_max, (long long)since,
                           offset_index, time_index, notable);
finally:
    Py_XDECREF(notable);
    Py_XDECREF(offset_index);
    Py_XDECREF(time_index);
    sb_free(&offsets);
    sb_free(&times);
    bytes_release(&b);
    return result;
}

/* crc32c(data) -> int: CRC-32C of a buffer. */
static PyObject *codec_crc32c(PyObject *self, PyObject *data) {
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t crc;
    if (view.len > 65536) {
        Py_BEGIN_ALLOW_THREADS crc = crc32c_of(view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc32c_of(view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* crc32c_by_path(data) -> dict: the CRC-32C of a buffer by each way this CPU can compute it
 * ("table" always; "streams" with SSE4.2; "folded" with VPCLMULQDQ, for buffers of
 * CRC_FOLD_MIN bytes or more), so that tests hold every one to the reference whichever
 * crc32c picks. */
static PyObject *codec_crc32c_by_path(PyObject *self, PyObject *data) {
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = view.buf;
    size_t n = (size_t)view.len;
    PyObject *paths = PyDict_New();
    PyObject *crc = NULL;
    if (paths == NULL) goto failed;
    crc = PyLong_FromUnsignedLong(~crc32c_soft(0xFFFFFFFFu, p, n));
    if (crc == NULL || PyDict_SetItemString(paths, "table", crc) < 0) goto failed;
    Py_CLEAR(crc);
#ifdef HW_CRC_X86
    if (crc_hw) {
        crc = PyLong_FromUnsignedLong(~crc32c_hw(0xFFFFFFFFu, p, n));
        if (crc == NULL || PyDict_SetItemString(paths, "streams", crc) < 0) goto failed;
        Py_CLEAR(crc);
    }
    if (crc_fold && n >= CRC_FOLD_MIN) {
        crc = PyLong_FromUnsignedLong(~crc32c_folded(0xFFFFFFFFu, p, n));
        if (crc == NULL || PyDict_SetItemString(paths, "folded", crc) < 0) goto failed;
        Py_CLEAR(crc);
    }
#endif
    PyBuffer_Release(&view);
    return paths;
failed:
    Py_XDECREF(crc);
    Py_XDECREF(paths);
    PyBuffer_Release(&view);
    return NULL;
}


/* ---------------------------------------------------------------------------------- */
/* The log cleaner's per-record loops (storage.cleaner).                                */

/* map_keys(data, pos, end, count, base_offset, last_offset_delta, min_offset, offsets)
 *   -> (decoded, pos)
 * The offset map's step for one batch: offsets[key] = offset for every record with a key
 * at or above min_offset, the framing checked as scan_keys (RecordBatch.iter_keys) does.
 * Returns (records decoded, position after them). It stops at the first record it does
 * not take; the caller then runs the pure loop over the whole batch, which stores the
 * same values again and raises the typed error. */
static PyObject *codec_map_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyDict_CheckExact(args[7])) {
        PyErr_SetString(PyExc_TypeError, "map_keys takes 7 ints and a dict");
        return NULL;
    }
    int64_t v[6];
    for (int i = 0; i < 6; i++) {
        if (as_int64(args[i + 1], &v[i]) < 0) return Py_BuildValue("(ii)", 0, -1);
    }
    Py_ssize_t pos = (Py_ssize_t)v[0], end = (Py_ssize_t)v[1];
    int64_t count = v[2], base_offset = v[3], last_delta = v[4], min_offset = v[5];
    PyObject *offsets = args[7];
    Bytes b;
    if (pos < 0 || bytes_get(args[0], &b) < 0) return Py_BuildValue("(ii)", 0, -1);
    if (end > b.n) end = b.n;
    const uint8_t *buf = b.p;
    int64_t done = 0, previous = -1;
    KeyedRecord r;
    while (done < count && pos < end &&
           next_keyed_record(buf, pos, end, base_offset, last_delta, previous, &r) == 0) {
        if (r.key_length >= 0 && r.offset >= min_offset) {
            PyObject *k = PyBytes_FromStringAndSize((const char *)r.key, r.key_length);
            PyObject *o = k == NULL ? NULL : PyLong_FromLongLong(r.offset);
            if (o == NULL || PyDict_SetItem(offsets, k, o) < 0) {
                Py_XDECREF(k);
                Py_XDECREF(o);
                bytes_release(&b);
                return NULL;
            }
            Py_DECREF(k);
            Py_DECREF(o);
        }
        previous = r.delta;
        pos = r.end;
        done++;
    }
    bytes_release(&b);
    return Py_BuildValue("(Ln)", (long long)done, pos);
}

/* A varint of exactly the bytes write_varint would give (the kept records' bytes are
 * copied, so they must be what re-encoding them would write). */
static inline int get_canonical_varint(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end,
                                       int32_t *out) {
    Py_ssize_t start = *pos;
    if (get_varint(buf, pos, end, out) < 0) return -1;
    return *pos - start == size_of_varint64(*out) ? 0 : -1;
}

/* filter_records(data, pos, end, count, base_offset, last_offset_delta, base_timestamp,
 *                log_append_time, offsets, now, horizon, new_horizon)
 *   -> (kept, keyless_removed, tombstones_removed, tombstones_kept, horizon, records,
 *       base_timestamp, max_timestamp), or None
 * One batch's pass of the cleaner (LogCleaner._clean_into and _rebuild): a record is
 * dropped without a key, below the offset map's offset for its key, or as a tombstone
 * whose batch's delete horizon (None: none) has passed at ``now``. The horizon written is
 * the batch's, else ``new_horizon`` when a tombstone is kept. When a record is dropped or
 * the horizon changes, ``records`` holds the kept records as build_batch writes them
 * (attributes 0, timestamp deltas from the new base timestamp: the horizon, else the
 * first kept record's timestamp; offset deltas kept; keys, values and headers copied),
 * with that base and the kept records' largest timestamp; otherwise ``records`` is None
 * (the batch is copied as it is). ``log_append_time`` (None: CreateTime) is each record's
 * timestamp in a LogAppendTime batch. Every record must be one RecordBatch.records()
 * takes, in canonical varints; anything else gives None and the pure cleaner runs. */
static PyObject *codec_filter_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12 || !PyDict_CheckExact(args[8])) {
        PyErr_SetString(PyExc_TypeError, "filter_records takes 12 arguments, the 9th a dict");
        return NULL;
    }
    int64_t v[6], append_time = 0, now, horizon = 0, new_horizon;
    int has_append_time = args[7] != Py_None, has_horizon = args[10] != Py_None;
    for (int i = 0; i < 6; i++) {
        if (as_int64(args[i + 1], &v[i]) < 0) Py_RETURN_NONE;
    }
    if ((has_append_time && as_int64(args[7], &append_time) < 0) ||
        as_int64(args[9], &now) < 0 || (has_horizon && as_int64(args[10], &horizon) < 0) ||
        as_int64(args[11], &new_horizon) < 0)
        Py_RETURN_NONE;
    Py_ssize_t pos = (Py_ssize_t)v[0], end = (Py_ssize_t)v[1];
    int64_t count = v[2], base_offset = v[3], last_delta = v[4], base_ts = v[5];
    PyObject *offsets = args[8];
    if (pos < 0 || count < 0 || count > INT32_MAX) Py_RETURN_NONE;
    Bytes b;
    if (bytes_get(args[0], &b) < 0) Py_RETURN_NONE;
    if (end > b.n) end = b.n;
    const uint8_t *buf = b.p;
    /* Where each kept record's tail (from its key length on) lies, and its timestamp. */
    typedef struct {
        Py_ssize_t tail, tail_end;
        int64_t timestamp;
        int32_t delta;
    } Kept;
    Kept *kept = PyMem_Malloc(sizeof(Kept) * (size_t)(count ? count : 1));
    StoreBuf out = {0};
    PyObject *result = NULL;
    if (kept == NULL) {
        bytes_release(&b);
        return PyErr_NoMemory();
    }
    int64_t nkept = 0, keyless = 0, tombstones_removed = 0, previous = -1, done = 0;
    int tombstones_kept = 0, refuse = 0;
    while (done < count) {
        Py_ssize_t p = pos;
        int32_t length, delta, kn, vn, hn;
        int64_t td, offset, timestamp;
        if (pos >= end || get_canonical_varint(buf, &p, end, &length) < 0 || length < 6 ||
            length > end - p)
            goto refused;
        Py_ssize_t record_end = p + length;
        p += 1; /* attributes: build_batch writes 0 */
        Py_ssize_t ts_start = p;
        if (get_varlong(buf, &p, record_end, &td) < 0 || p - ts_start != size_of_varint64(td))
            goto refused;
        if (get_canonical_varint(buf, &p, record_end, &delta) < 0 || delta <= previous ||
            delta > last_delta || __builtin_add_overflow(base_offset, (int64_t)delta, &offset))
            goto refused;
        if (has_append_time) timestamp = append_time;
        else if (__builtin_add_overflow(base_ts, td, &timestamp)) goto refused;
        Py_ssize_t tail = p;
        if (get_canonical_varint(buf, &p, record_end, &kn) < 0 || kn < -1 || kn > record_end - p)
            goto refused;
        const uint8_t *key = buf + p;
        if (kn > 0) p += kn;
        if (get_canonical_varint(buf, &p, record_end, &vn) < 0 || vn < -1 ||
            vn > record_end - p)
            goto refused;
        if (vn > 0) p += vn;
        if (get_canonical_varint(buf, &p, record_end, &hn) < 0 || hn < 0) goto refused;
        for (int32_t i = 0; i < hn; i++) {
            int32_t hk, hv;
            if (get_canonical_varint(buf, &p, record_end, &hk) < 0 || hk < 0 ||
                hk > record_end - p)
                goto refused;
            int ok = utf8_ok(buf + p, hk);
            if (ok < 0) goto failed;
            if (!ok) goto refused;
            p += hk;
            if (get_canonical_varint(buf, &p, record_end, &hv) < 0 || hv < -1 ||
                hv > record_end - p)
                goto refused;
            if (hv > 0) p += hv;
        }
        if (p != record_end) goto refused;
        previous = delta;
        pos = record_end;
        done++;
        /* The cleaner's decision. */
        if (kn < 0) {
            keyless++;
            continue;
        }
        PyObject *k = PyBytes_FromStringAndSize((const char *)key, kn);
        if (k == NULL) goto failed;
        PyObject *latest = PyDict_GetItemWithError(offsets, k);
        Py_DECREF(k);
        if (latest == NULL && PyErr_Occurred()) goto failed;
        if (latest != NULL) {
            int64_t latest_offset;
            if (as_int64(latest, &latest_offset) < 0) goto refused;
            if (offset < latest_offset) {
                if (vn < 0) tombstones_removed++;
                continue;
            }
        }
        if (vn < 0) {
            if (has_horizon && now >= horizon) {
                tombstones_removed++;
                continue;
            }
            tombstones_kept = 1;
        }
        kept[nkept].tail = tail;
        kept[nkept].tail_end = record_end;
        kept[nkept].timestamp = timestamp;
        kept[nkept].delta = delta;
        nkept++;
    }
    if (pos != end) goto refused;
    int has_written_horizon = has_horizon || tombstones_kept;
    int64_t written_horizon = has_horizon ? horizon : new_horizon;
    PyObject *records = Py_None, *horizon_object;
    int64_t new_base = 0, max_ts = -1;
    Py_INCREF(records);
    if (nkept && (nkept < count || has_written_horizon != has_horizon)) {
        new_base = has_written_horizon ? written_horizon : kept[0].timestamp;
        for (int64_t i = 0; i < nkept; i++) {
            int64_t ts_delta;
            if (__builtin_sub_overflow(kept[i].timestamp, new_base, &ts_delta)) {
                Py_DECREF(records);
                goto refused;
            }
            if (i == 0 || kept[i].timestamp > max_ts) max_ts = kept[i].timestamp;
            Py_ssize_t tail_size = kept[i].tail_end - kept[i].tail;
            int64_t body = 1 + size_of_varint64(ts_delta) + size_of_varint64(kept[i].delta) +
                           tail_size;
            if (body > INT32_MAX || sb_reserve(&out, (Py_ssize_t)body + 5) < 0) {
                Py_DECREF(records);
                if (body > INT32_MAX) goto refused;
                goto failed;
            }
            uint8_t *o = out.p + out.n;
            o = put_varint64(o, body);
            *o++ = 0;
            o = put_varint64(o, ts_delta);
            o = put_varint64(o, kept[i].delta);
            memcpy(o, buf + kept[i].tail, (size_t)tail_size);
            o += tail_size;
            out.n = o - out.p;
        }
        Py_DECREF(records);
        if ((records = sb_bytes(&out)) == NULL) goto failed;
    }
    if (has_written_horizon) {
        horizon_object = PyLong_FromLongLong(written_horizon);
        if (horizon_object == NULL) {
            Py_DECREF(records);
            goto failed;
        }
    } else {
        horizon_object = Py_None;
        Py_INCREF(horizon_object);
    }
    result = Py_BuildValue("(LLLONNLL)", (long long)nkept, (long long)keyless,
                           (long long)tombstones_removed, tombstones_kept ? Py_True : Py_False,
                           horizon_object, records, (long long)new_base, (long long)max_ts);
    goto finally;
refused:
    refuse = 1;
failed:
    if (refuse) {
        result = Py_None;
        Py_INCREF(result);
    }
finally:
    PyMem_Free(kept);
    sb_free(&out);
    bytes_release(&b);
    return result;
}

/* ---------------------------------------------------------------------------------- */
/* check_records: the records of one batch as a leader takes them from a client.        */

/* 1 when p[0..n) is UTF-8 that bytes.decode("utf-8") accepts (no overlong form, no
 * surrogate, nothing above U+10FFFF), 0 otherwise. No Python object. */
static int utf8_strict(const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (n - i < 2 || (p[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (n - i < 3 || (p[i + 1] & 0xC0) != 0x80 || (p[i + 2] & 0xC0) != 0x80) return 0;
            if ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] > 0x9F)) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (n - i < 4 || (p[i + 1] & 0xC0) != 0x80 || (p[i + 2] & 0xC0) != 0x80 ||
                (p[i + 3] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xF0 && p[i + 1] < 0x90) || (c == 0xF4 && p[i + 1] > 0x8F)) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* The headers of one record from *pos: ``count`` (> 0) of them, each a key (length >= 0,
 * UTF-8) and a value (length -1 or >= 0), all inside the record. 0, or -1 when they are
 * not. */
static int walk_headers(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t record_end,
                        int32_t count) {
    Py_ssize_t p = *pos;
    if (2 * (Py_ssize_t)count > record_end - p) return -1;
    for (int32_t i = 0; i < count; i++) {
        int32_t kn, vn;
        if (get_varint(buf, &p, record_end, &kn) < 0 || kn < 0 || kn > record_end - p) return -1;
        if (!utf8_strict(buf + p, kn)) return -1;
        p += kn;
        if (get_varint(buf, &p, record_end, &vn) < 0 || vn < -1 || vn > record_end - p) return -1;
        if (vn > 0) p += vn;
    }
    *pos = p;
    return 0;
}

/* One record of a batch at *pos (before end), read with every varint bounded by the
 * record: 0 with *pos past it, its offset delta in *delta and its timestamp delta in *td;
 * -1 when it is not a record (see walk_records). */
static int walk_one(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end, int32_t *delta,
                    int64_t *td) {
    Py_ssize_t p = *pos;
    int32_t length, kn, vn, hn;
    if (get_varint(buf, &p, end, &length) < 0 || length < 6 || length > end - p) return -1;
    const Py_ssize_t record_end = p + length;
    p++; /* attributes: unused */
    if (get_varlong(buf, &p, record_end, td) < 0) return -1;
    if (get_varint(buf, &p, record_end, delta) < 0) return -1;
    if (get_varint(buf, &p, record_end, &kn) < 0 || kn < -1 || kn > record_end - p) return -1;
    if (kn > 0) p += kn;
    if (get_varint(buf, &p, record_end, &vn) < 0 || vn < -1 || vn > record_end - p) return -1;
    if (vn > 0) p += vn;
    if (get_varint(buf, &p, record_end, &hn) < 0 || hn < 0) return -1;
    if (hn > 0 && walk_headers(buf, &p, record_end, hn) < 0) return -1;
    if (p != record_end) return -1;
    *pos = p;
    return 0;
}

/* A zigzag varint of one or two bytes at s (both readable): the bytes it takes, its
 * zigzag-encoded value in *v; 0 when it is longer (walk_one reads it). */
static inline Py_ssize_t short_varint(const uint8_t *s, uint32_t *v) {
    uint32_t b0 = s[0], b1 = s[1];
    if (b0 < 0x80) {
        *v = b0;
        return 1;
    }
    if (b1 < 0x80) {
        *v = (b0 & 0x7F) | (b1 << 7);
        return 2;
    }
    return 0;
}

#define UNZIGZAG(v) ((int32_t)(((v) >> 1) ^ (0u - ((v) & 1u))))

/* Walk the ``count`` records of buf[pos:end) as RecordBatch.records reads them (Kafka's
 * DefaultRecordBatch iterator and DefaultRecord.readFrom): each record's varint length
 * inside the batch; in it the attributes, the timestamp delta (varlong), an offset delta
 * above the previous one and at most ``last_delta``, the key (length -1 or >= 0), the
 * value (the same), the header count (>= 0) and each header, ending exactly at the
 * record's length; exactly ``count`` records and no byte after the last. Every varint is
 * read as varint.py reads it. Each timestamp (base + delta, which must fit 64 bits) other
 * than NO_TIMESTAMP (-1) widens [*low, *high]. 0, or -1 when anything is not so (the pure
 * check_records says why).
 *
 * The common record (varints of one or two bytes, no header) is read inline, its fields
 * without a bound of their own: each read stays below end (the record ends SHORT_SLACK
 * bytes before it at least), each field only moves the position on, and the fields must
 * end exactly at the record's length, so a field that crossed it fails that test as a
 * bounded read would have failed. Any other record (and the last few bytes) goes through
 * walk_one. The next record starts where the length says, so only the lengths chain one
 * record to the next. */
#define SHORT_SLACK 16
static int walk_records(const uint8_t *buf, Py_ssize_t p, Py_ssize_t end, int64_t count,
                        int64_t last_delta, int64_t base_ts, int64_t *low, int64_t *high) {
    int64_t lo = *low, hi = *high;
    int64_t previous = -1;
    for (int64_t i = 0; i < count; i++) {
        int32_t delta;
        int64_t td, ts;
        uint32_t v;
        Py_ssize_t n, q;
        if (end - p < SHORT_SLACK || !(n = short_varint(buf + p, &v)) || (v & 1) || v < 12 ||
            (Py_ssize_t)(v >> 1) > end - p - n - SHORT_SLACK)
            goto careful;
        const Py_ssize_t record_end = p + n + (v >> 1);
        q = p + n + 1; /* after the attributes: unused */
        if (!(n = short_varint(buf + q, &v))) goto careful;
        td = UNZIGZAG(v);
        q += n;
        if (!(n = short_varint(buf + q, &v))) goto careful;
        delta = UNZIGZAG(v);
        q += n;
        if (!(n = short_varint(buf + q, &v))) goto careful;
        q += n;
        if (v != 1) { /* not a null key */
            if ((v & 1) || (Py_ssize_t)(v >> 1) > record_end - q) goto careful;
            q += v >> 1;
        }
        if (!(n = short_varint(buf + q, &v))) goto careful;
        q += n;
        if (v != 1) { /* not a null value */
            if ((v & 1) || (Py_ssize_t)(v >> 1) > record_end - q) goto careful;
            q += v >> 1;
        }
        if (q + 1 != record_end || buf[q] != 0) goto careful; /* headers, or a lying length */
        p = record_end;
        goto checked;
    careful:
        if (walk_one(buf, &p, end, &delta, &td) < 0) return -1;
    checked:
        if (delta <= previous || delta > last_delta) return -1;
        previous = delta;
        if (__builtin_add_overflow(base_ts, td, &ts)) return -1;
        if (ts != -1) {
            lo = ts < lo ? ts : lo;
            hi = ts > hi ? ts : hi;
        }
    }
    if (p != end) return -1;
    *low = lo;
    *high = hi;
    return 0;
}

/* check_records(buf, pos, end, count, last_offset_delta, base_timestamp) -> (low, high)
 * The walk above over buf[pos:end) (a batch's records, decompressed if it was
 * compressed); (low, high) bound the records' timestamps other than -1 (INT64_MAX,
 * INT64_MIN when there is none). None when the walk refuses them or an argument is out of
 * range: record.check_records, the reference, then raises the typed error. */
static PyObject *codec_check_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "check_records takes 6 arguments");
        return NULL;
    }
    int64_t v[5];
    for (int i = 0; i < 5; i++) {
        if (as_int64(args[i + 1], &v[i]) < 0) Py_RETURN_NONE;
    }
    Bytes b;
    if (bytes_get(args[0], &b) < 0) Py_RETURN_NONE;
    int64_t low = INT64_MAX, high = INT64_MIN;
    int ok = v[0] >= 0 && v[1] >= v[0] && v[1] <= (int64_t)b.n && v[2] >= 0 &&
             v[3] >= 0 && v[3] <= INT32_MAX &&
             walk_records(b.p, (Py_ssize_t)v[0], (Py_ssize_t)v[1], v[2], v[3], v[4], &low,
                          &high) == 0;
    bytes_release(&b);
    if (!ok) Py_RETURN_NONE;
    return Py_BuildValue("(LL)", (long long)low, (long long)high);
}

/* ---------------------------------------------------------------------------------- */
/* stamp_batches: a leader's append in one call (storage.log.PartitionLog).             */

/* stamp_batches(data, next_offset, leader_epoch, max_batch_size, segment_bytes, now,
 *               before_ms, after_ms, log_append_time, log_start_offset)
 *   -> (stamped, headers, info, tracked), or None
 * Every check PartitionLog.append_as_leader makes of client batches (check_batch's, CRC
 * included; the size limits; records_count == last_offset_delta + 1; every record walked
 * (walk_records); no producer batch flagged LogAppendTime; with CreateTime
 * (log_append_time < 0) each record's timestamp in the window; no control batch and no
 * producer id without a base sequence, which Kafka's LogValidator refuses from clients
 * and the log refuses by origin), then each batch's 61-byte header stamped with its base
 * offset and partition leader epoch (with LogAppendTime also its timestamp type, max
 * timestamp and CRC, the CRC summed over the stamped header's bytes 21..61 and then the
 * caller's record bytes; with CreateTime the max timestamp and CRC the same way, only
 * when the header's is not the records' largest, as Kafka's setMaxTimestamp). A
 * compressed batch is left to the pure path, which decompresses it to walk it. ``stamped``: the stamped 61-byte headers one after another (the record
 * bytes are not copied: write_stamped writes each stamped header beside the caller's
 * bytes after it, one writev); ``headers``: the stamped headers as BatchHeader tuples
 * where the log reads them, that is for two batches or more (the segment indexes each)
 * or any batch with a producer id (the producer state checks each), else empty (one
 * batch without a producer id: ``info`` says all the segment needs); ``info``: the
 * append's storage.log.AppendInfo (bound by storage.log: first and last offset, the
 * largest max timestamp (as stamped) with the last offset of its batch, log_append_time,
 * log_start_offset as given, the records' count, the bytes); ``tracked``: whether any
 * batch carries a producer id. None whenever anything is not as those checks want (or
 * out of the range handled here, or AppendInfo is not bound): the log then runs its pure
 * checks, which raise the typed error. */
static PyObject *codec_stamp_batches(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "stamp_batches takes 10 arguments");
        return NULL;
    }
    int64_t v[9];
    for (int i = 0; i < 9; i++) {
        if (as_int64(args[i + 1], &v[i]) < 0) Py_RETURN_NONE;
    }
    int64_t next_offset = v[0], leader_epoch = v[1], max_batch_size = v[2], segment_bytes = v[3];
    int64_t now = v[4], before = v[5], after = v[6], append_time = v[7], log_start_offset = v[8];
    if (leader_epoch < INT32_MIN || leader_epoch > INT32_MAX || batch_header_type == NULL ||
        append_info_type == NULL)
        Py_RETURN_NONE;
    Bytes b;
    if (bytes_get(args[0], &b) < 0) Py_RETURN_NONE;
    const uint8_t *buf = b.p;
    Py_ssize_t n = b.n, pos = 0;
    int64_t records = 0, max_ts = -1, offset_of_max = next_offset, offset = next_offset;
    int tracked = 0, batches = 0, restamp = 0;
    /* First every check, on the caller's bytes, before anything is made. */
    while (pos < n) {
        if (!batch_ok(buf, n, pos, 1)) goto refuse;
        const uint8_t *h = buf + pos;
        int64_t size = (int64_t)be32(h + 8) + LOG_OVERHEAD;
        int64_t count = (int64_t)be32(h + 23) + 1, last_offset;
        if (size > max_batch_size || (int64_t)be32(h + 57) != count) goto refuse;
        /* A control batch, or a producer id with a negative base sequence; a producer's
         * LogAppendTime; a compressed batch, whose records the pure path decompresses. */
        int attributes = be16(h + 21);
        if ((attributes & (0x20 | 0x08 | 0x07)) ||
            ((int64_t)be64(h + 43) >= 0 && (int32_t)be32(h + 53) < 0))
            goto refuse;
        int64_t low = INT64_MAX, high = INT64_MIN, late, early;
        if (walk_records(buf, pos + HEADER_SIZE, pos + (Py_ssize_t)size, count, count - 1,
                         be64(h + 27), &low, &high) < 0)
            goto refuse;
        int64_t true_max = high > -1 ? high : -1;
        if (append_time < 0) {
            /* Each record's timestamp but NO_TIMESTAMP in [now - before, now + after]. */
            if (low != INT64_MAX && (__builtin_sub_overflow(now, low, &late) ||
                                     __builtin_sub_overflow(high, now, &early) ||
                                     late > before || early > after))
                goto refuse;
            if (true_max != be64(h + 35)) restamp = 1;
        }
        if (__builtin_add_overflow(offset, count - 1, &last_offset) || last_offset == INT64_MAX)
            goto refuse;
        int64_t batch_max = append_time >= 0 ? append_time : true_max;
        if (batch_max > max_ts) {
            max_ts = batch_max;
            offset_of_max = last_offset;
        }
        records += count;
        if (be64(h + 43) >= 0) tracked = 1;
        offset = last_offset + 1;
        pos += (Py_ssize_t)size;
        batches++;
    }
    /* The whole append must fit a segment (Kafka's UnifiedLog.append). */
    if (batches == 0 || (int64_t)n > segment_bytes) goto refuse;
    /* Only the stamped headers: write_stamped writes the record bytes from the caller's
     * buffer beside them (no copy of a batch, whatever its size). */
    PyObject *heads = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)batches * HEADER_SIZE);
    int with_headers = batches > 1 || tracked;
    PyObject *headers = PyList_New(with_headers ? batches : 0);
    if (heads == NULL || headers == NULL) {
        Py_XDECREF(heads);
        Py_XDECREF(headers);
        bytes_release(&b);
        return NULL;
    }
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(heads);
    pos = 0;
    offset = next_offset;
    for (int i = 0; i < batches; i++) {
        const uint8_t *in = buf + pos;
        Py_ssize_t size = (Py_ssize_t)be32(in + 8) + LOG_OVERHEAD;
        uint8_t *h = out + (Py_ssize_t)i * HEADER_SIZE;
        memcpy(h, in, HEADER_SIZE);
        put_be64(h, (uint64_t)offset);
        put_be32(h + 12, (uint32_t)(int32_t)leader_epoch);
        if (append_time >= 0) {
            uint16_t attributes = (uint16_t)be16(h + 21) | 0x08;
            h[21] = (uint8_t)(attributes >> 8);
            h[22] = (uint8_t)attributes;
            put_be64(h + 35, (uint64_t)append_time);
            uint32_t crc = crc32c_update(0xFFFFFFFFu, h + 21, HEADER_SIZE - 21);
            crc = crc32c_update(crc, in + HEADER_SIZE, (size_t)(size - HEADER_SIZE));
            put_be32(h + 17, ~crc);
        } else if (restamp) {
            /* A max timestamp that is not the records' largest: set to it, and the CRC
             * summed again (Kafka's setMaxTimestamp). The walk passed above. */
            int64_t low = INT64_MAX, high = INT64_MIN;
            walk_records(in, HEADER_SIZE, size, (int64_t)be32(h + 23) + 1, be32(h + 23),
                         be64(h + 27), &low, &high);
            int64_t true_max = high > -1 ? high : -1;
            if (true_max != be64(h + 35)) {
                put_be64(h + 35, (uint64_t)true_max);
                uint32_t crc = crc32c_update(0xFFFFFFFFu, h + 21, HEADER_SIZE - 21);
                crc = crc32c_update(crc, in + HEADER_SIZE, (size_t)(size - HEADER_SIZE));
                put_be32(h + 17, ~crc);
            }
        }
        if (with_headers) {
            PyObject *header = header_tuple(h);
            if (header == NULL) {
                Py_DECREF(heads);
                Py_DECREF(headers);
                bytes_release(&b);
                return NULL;
            }
            PyList_SET_ITEM(headers, i, header);
        }
        offset += (int64_t)be32(h + 23) + 1;
        pos += size;
    }
    bytes_release(&b);
    PyObject *info = append_info_type->tp_alloc(append_info_type, 9);
    PyObject *result = PyTuple_New(4);
    if (info == NULL || result == NULL) goto fail;
    int64_t fields[8] = {next_offset, offset - 1, max_ts, offset_of_max, append_time,
                         log_start_offset, records, (int64_t)n};
    for (int i = 0; i < 8; i++) {
        PyObject *field = PyLong_FromLongLong((long long)fields[i]);
        if (field == NULL) goto fail;
        PyTuple_SET_ITEM(info, i, field);
    }
    PyTuple_SET_ITEM(info, 8, Py_NewRef(Py_False));
    PyTuple_SET_ITEM(result, 0, heads);
    PyTuple_SET_ITEM(result, 1, headers);
    PyTuple_SET_ITEM(result, 2, info);
    PyTuple_SET_ITEM(result, 3, Py_NewRef(tracked ? Py_True : Py_False));
    return result;
fail:
    Py_DECREF(heads);
    Py_DECREF(headers);
    Py_XDECREF(info);
    Py_XDECREF(result);
    return NULL;
refuse:
    bytes_release(&b);
    Py_RETURN_NONE;
}


/* write_stamped(fd, stamped, data) -> None
 * The storage edge of a leader's append (storage.segment.LogSegment.append_stamped):
 * writes the batches of ``data`` to ``fd`` with each batch's first 61 bytes taken from
 * ``stamped`` (stamp_batches' stamped headers, one after another) and the rest of the
 * batch from ``data`` itself, so no batch is copied in memory. One writev (IOV_MAX pieces
 * at a time), made without the GIL as os.writev is, continued after a short write and
 * retried on EINTR after the signal handlers ran (PEP 475, as os.writev); an error raises
 * OSError with its errno, some bytes possibly written (the segment cuts them off).
 * ``stamped`` and ``data`` must agree (as many headers as ``data`` has batches, each
 * batch's length inside ``data``): ValueError otherwise, before anything is written. */
static PyObject *codec_write_stamped(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "write_stamped takes 3 arguments");
        return NULL;
    }
    int fd = PyObject_AsFileDescriptor(args[0]);
    if (fd < 0) return NULL;
    Bytes hb, db;
    if (bytes_get(args[1], &hb) < 0) {
        PyErr_SetString(PyExc_TypeError, "write_stamped needs the stamped headers as bytes");
        return NULL;
    }
    if (bytes_get(args[2], &db) < 0) {
        bytes_release(&hb);
        PyErr_SetString(PyExc_TypeError, "write_stamped needs the batches as a buffer");
        return NULL;
    }
    Py_ssize_t count = hb.n / HEADER_SIZE, pos = 0, i = 0;
    struct iovec small[16], *iov = small;
    PyObject *result = NULL;
    if (hb.n % HEADER_SIZE || count == 0) goto mismatch;
    if (count > 8) {
        iov = PyMem_New(struct iovec, (size_t)count * 2);
        if (iov == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (; pos < db.n; i++) {
        if (i >= count || db.n - pos < HEADER_SIZE) goto mismatch;
        int64_t size = (int64_t)be32(db.p + pos + 8) + LOG_OVERHEAD;
        if (size < HEADER_SIZE || size > db.n - pos) goto mismatch;
        iov[2 * i].iov_base = (void *)(hb.p + i * HEADER_SIZE);
        iov[2 * i].iov_len = HEADER_SIZE;
        iov[2 * i + 1].iov_base = (void *)(db.p + pos + HEADER_SIZE);
        iov[2 * i + 1].iov_len = (size_t)(size - HEADER_SIZE);
        pos += (Py_ssize_t)size;
    }
    if (i != count) goto mismatch;
    Py_ssize_t next = 0, pieces = 2 * count;
    while (next < pieces) {
        int chunk = pieces - next < IOV_MAX ? (int)(pieces - next) : IOV_MAX;
        ssize_t written;
        int error;
        Py_BEGIN_ALLOW_THREADS written = writev(fd, iov + next, chunk);
        error = errno;
        Py_END_ALLOW_THREADS if (written == 0) {
            written = -1;
            error = EIO; /* a regular file takes a byte or fails: never loop on nothing */
        }
        if (written < 0) {
            if (error == EINTR) {
                if (PyErr_CheckSignals() < 0) goto done;
                continue;
            }
            errno = error;
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        while (written > 0 || (next < pieces && iov[next].iov_len == 0)) {
            if ((size_t)written >= iov[next].iov_len) {
                written -= (ssize_t)iov[next].iov_len;
                next++;
            } else {
                iov[next].iov_base = (uint8_t *)iov[next].iov_base + written;
                iov[next].iov_len -= (size_t)written;
                written = 0;
            }
        }
    }
    result = Py_NewRef(Py_None);
    goto done;
mismatch:
    PyErr_SetString(PyExc_ValueError, "write_stamped: the stamped headers do not match the batches");
done:
    if (iov != small) PyMem_Free(iov);
    bytes_release(&hb);
    bytes_release(&db);
    return result;
}

/* ---------------------------------------------------------------------------------- */
/* murmur2: Kafka's Utils.murmur2 (MurmurHash2, seed 0x9747b28c) as a signed int32.     */

static inline uint32_t murmur2_of(const uint8_t *p, Py_ssize_t length) {
    const uint32_t m = 0x5BD1E995u;
    uint32_t h = 0x9747B28Cu ^ (uint32_t)length;
    Py_ssize_t body = length & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < body; i += 4) {
        uint32_t k = (uint32_t)p[i] | ((uint32_t)p[i + 1] << 8) | ((uint32_t)p[i + 2] << 16) |
                     ((uint32_t)p[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h = (h * m) ^ k;
    }
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)p[body + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)p[body + 1] << 8;
        /* fall through */
    case 1:
        h ^= p[body];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

static PyObject *codec_murmur2(PyObject *self, PyObject *data) {
    Bytes b;
    if (bytes_get(data, &b) < 0) {
        PyErr_Format(PyExc_TypeError, "murmur2 needs bytes, not %.100s", Py_TYPE(data)->tp_name);
        return NULL;
    }
    uint32_t h = murmur2_of(b.p, b.n);
    bytes_release(&b);
    return PyLong_FromLong((int32_t)h);
}

/* ---------------------------------------------------------------------------------- */
/* RecordColumns: decoded records as Arrow's columns (columnar.py has the pure twin).   */
/*                                                                                      */
/* Keys and values are Arrow binary columns (a validity bitmap, int32 offsets, the      */
/* bytes), offsets and timestamps int64, timestamp types int32 and, with headers, a    */
/* list<struct<key: string, value: binary>> column; all in the host's (little-endian)  */
/* byte order, as Arrow lays them out. No Python object is made per record.             */

typedef struct {
    char *p;
    Py_ssize_t n, cap;
} GrowBuf;

static int gb_reserve(GrowBuf *b, Py_ssize_t extra) {
    if (b->n + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int gb_put(GrowBuf *b, const void *data, Py_ssize_t n) {
    if (gb_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->p + b->n, data, (size_t)n);
    b->n += n;
    return 0;
}

static inline int gb_put_i32(GrowBuf *b, int32_t v) { return gb_put(b, &v, 4); }
static inline int gb_put_i64(GrowBuf *b, int64_t v) { return gb_put(b, &v, 8); }

static void gb_free(GrowBuf *b) {
    PyMem_Free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* Bit ``index`` of a validity bitmap (bytes added as the bitmap grows, zeroed). */
static inline int bitmap_push(GrowBuf *b, Py_ssize_t index, int valid) {
    if ((index & 7) == 0) {
        uint8_t zero = 0;
        if (gb_put(b, &zero, 1) < 0) return -1;
    }
    if (valid) b->p[index >> 3] |= (char)(1u << (index & 7));
    return 0;
}

typedef struct {
    GrowBuf validity, offsets, data;
    Py_ssize_t length;
} BinaryColumn;

static int bincol_reset(BinaryColumn *c) {
    c->validity.n = c->offsets.n = c->data.n = 0;
    c->length = 0;
    return gb_put_i32(&c->offsets, 0);
}

static void bincol_free(BinaryColumn *c) {
    gb_free(&c->validity);
    gb_free(&c->offsets);
    gb_free(&c->data);
}

/* Append a value (``n`` -1: null) to the column. */
static int bincol_push(BinaryColumn *c, const uint8_t *p, Py_ssize_t n) {
    if (n > 0 && c->data.n > (Py_ssize_t)INT32_MAX - n) {
        PyErr_SetString(PyExc_OverflowError,
                        "a column holds more than 2 GiB of bytes: take the columns sooner");
        return -1;
    }
    if (bitmap_push(&c->validity, c->length, n >= 0) < 0) return -1;
    if (n > 0 && gb_put(&c->data, p, n) < 0) return -1;
    if (gb_put_i32(&c->offsets, (int32_t)c->data.n) < 0) return -1;
    c->length++;
    return 0;
}

typedef struct {
    PyObject_HEAD
    int include_headers;
    int timestamp_type; /* of the records appended next: 0 create time, 1 log-append time */
    Py_ssize_t count;
    BinaryColumn keys, values, header_keys, header_values;
    GrowBuf offsets, timestamps, types, header_offsets;
} RecordColumnsObject;

static PyTypeObject RecordColumnsType;

static int columns_reset(RecordColumnsObject *c) {
    c->count = 0;
    c->offsets.n = c->timestamps.n = c->types.n = c->header_offsets.n = 0;
    if (bincol_reset(&c->keys) < 0 || bincol_reset(&c->values) < 0 ||
        bincol_reset(&c->header_keys) < 0 || bincol_reset(&c->header_values) < 0)
        return -1;
    return gb_put_i32(&c->header_offsets, 0);
}

static PyObject *columns_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    int include_headers = 0;
    static char *kwlist[] = {"include_headers", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p:RecordColumns", kwlist, &include_headers))
        return NULL;
    RecordColumnsObject *c = (RecordColumnsObject *)type->tp_alloc(type, 0);
    if (c == NULL) return NULL;
    c->include_headers = include_headers;
    if (columns_reset(c) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

static void columns_dealloc(RecordColumnsObject *c) {
    bincol_free(&c->keys);
    bincol_free(&c->values);
    bincol_free(&c->header_keys);
    bincol_free(&c->header_values);
    gb_free(&c->offsets);
    gb_free(&c->timestamps);
    gb_free(&c->types);
    gb_free(&c->header_offsets);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static Py_ssize_t columns_len(RecordColumnsObject *c) { return c->count; }

/* The fixed-width columns of one record; the binary ones are appended by the caller. */
static int columns_push_record(RecordColumnsObject *c, int64_t offset, int64_t timestamp) {
    if (gb_put_i64(&c->offsets, offset) < 0 || gb_put_i64(&c->timestamps, timestamp) < 0 ||
        gb_put_i32(&c->types, c->timestamp_type) < 0)
        return -1;
    c->count++;
    return 0;
}

static int columns_close_headers(RecordColumnsObject *c) {
    if (!c->include_headers) return 0;
    if (c->header_keys.length > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2**31 headers in one set of columns");
        return -1;
    }
    return gb_put_i32(&c->header_offsets, (int32_t)c->header_keys.length);
}

/* Whether n bytes are valid UTF-8 as Python's strict decoder says (ASCII at once). */
static int utf8_valid(const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n && p[i] < 0x80) i++;
    if (i == n) return 1;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    if (s != NULL) {
        Py_DECREF(s);
        return 1;
    }
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
    PyErr_Clear();
    return 0;
}

/* Check the ``count`` headers from p up to record_end as _decode_headers does: 1 when
 * they add up, 0 when they do not (the pure code raises), -1 on an error. */
static int check_headers(const uint8_t *buf, Py_ssize_t p, Py_ssize_t record_end, int32_t count) {
    if (count < 0 || 2 * (Py_ssize_t)count > record_end - p) return 0;
    for (int32_t i = 0; i < count; i++) {
        int32_t kn, vn;
        if (get_varint(buf, &p, record_end, &kn) < 0 || kn < 0 || kn > record_end - p) return 0;
        int ok = utf8_valid(buf + p, kn);
        if (ok <= 0) return ok;
        p += kn;
        if (get_varint(buf, &p, record_end, &vn) < 0 || vn < -1) return 0;
        if (vn > record_end - p) return 0;
        if (vn > 0) p += vn;
    }
    return p == record_end;
}

/* Append checked headers (check_headers said 1). */
static int push_headers(RecordColumnsObject *c, const uint8_t *buf, Py_ssize_t p,
                        Py_ssize_t record_end, int32_t count) {
    for (int32_t i = 0; i < count; i++) {
        int32_t kn = 0, vn = -1;
        get_varint(buf, &p, record_end, &kn);
        if (bincol_push(&c->header_keys, buf + p, kn) < 0) return -1;
        p += kn;
        get_varint(buf, &p, record_end, &vn);
        if (bincol_push(&c->header_values, buf + p, vn) < 0) return -1;
        if (vn > 0) p += vn;
    }
    return 0;
}

/* columns.read_records(buf, pos, end, count, base_offset, base_timestamp,
 *                      log_append_time, last_offset_delta) -> (pos, decoded, previous)
 * codec.read_records into the columns: stops at the first record it does not take. */
static PyObject *columns_read_records(RecordColumnsObject *c, PyObject *const *args,
                                      Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "read_records takes 8 arguments");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    Py_ssize_t count = PyLong_AsSsize_t(args[3]);
    if ((pos == -1 || end == -1 || count == -1) && PyErr_Occurred()) return NULL;
    int have_lat = args[6] != Py_None;
    c->timestamp_type = have_lat;
    int64_t base_offset, base_timestamp, log_append_time = 0, last_delta, previous = -1;
    Py_ssize_t done = 0;
    if (as_int64(args[4], &base_offset) < 0 || as_int64(args[5], &base_timestamp) < 0 ||
        (have_lat && as_int64(args[6], &log_append_time) < 0) ||
        as_int64(args[7], &last_delta) < 0)
        return Py_BuildValue("(nnL)", pos, done, (long long)previous);
    Bytes b;
    if (bytes_get(args[0], &b) < 0) return Py_BuildValue("(nnL)", pos, done, (long long)previous);
    if (end > b.n) end = b.n;
    const uint8_t *buf = b.p;
    PyObject *result = NULL;
    while (done < count && pos >= 0 && pos < end) {
        Py_ssize_t p = pos;
        int32_t length, delta, kn, vn, hcount;
        int64_t td, offset, timestamp = log_append_time;
        if (get_varint(buf, &p, end, &length) < 0 || length < 6 || length > end - p) break;
        Py_ssize_t record_end = p + length;
        p += 1; /* attributes */
        if (get_varlong(buf, &p, record_end, &td) < 0) break;
        if (get_varint(buf, &p, record_end, &delta) < 0) break;
        if (get_varint(buf, &p, record_end, &kn) < 0 || kn < -1 || kn > record_end - p) break;
        const uint8_t *key = buf + p;
        if (kn > 0) p += kn;
        if (get_varint(buf, &p, record_end, &vn) < 0 || vn < -1 || vn > record_end - p) break;
        const uint8_t *value = buf + p;
        if (vn > 0) p += vn;
        if (get_varint(buf, &p, record_end, &hcount) < 0) break;
        if (hcount == 0) {
            if (p != record_end) break;
        } else {
            int ok = check_headers(buf, p, record_end, hcount);
            if (ok < 0) goto finally;
            if (ok == 0) break;
        }
        if (delta <= previous || delta > last_delta ||
            __builtin_add_overflow(base_offset, (int64_t)delta, &offset) ||
            (!have_lat && __builtin_add_overflow(base_timestamp, td, &timestamp)))
            break;
        if (bincol_push(&c->keys, key, kn) < 0 || bincol_push(&c->values, value, vn) < 0)
            goto finally;
        if (c->include_headers) {
            if (hcount && push_headers(c, buf, p, record_end, hcount) < 0) goto finally;
            if (columns_close_headers(c) < 0) goto finally;
        }
        if (columns_push_record(c, offset, timestamp) < 0) goto finally;
        previous = delta;
        pos = record_end;
        done++;
    }
    result = Py_BuildValue("(nnL)", pos, done, (long long)previous);
finally:
    bytes_release(&b);
    return result;
}

/* A key or value given to columns(...): bytes-like or None. */
static int push_value_object(BinaryColumn *col, PyObject *o, const char *what) {
    if (o == Py_None) return bincol_push(col, NULL, -1);
    Bytes b;
    if (bytes_get(o, &b) < 0) {
        PyErr_Format(PyExc_TypeError, "a record's %s must be bytes or None, not %.100s", what,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    int r = bincol_push(col, b.p, b.n);
    bytes_release(&b);
    return r;
}

/* columns(key, value, headers, timestamp, offset): append one record, as the pure
 * read_records' ``make`` (the records the compiled loop leaves to it). */
static PyObject *columns_call(RecordColumnsObject *c, PyObject *args, PyObject *kwds) {
    PyObject *key, *value, *headers, *ts_obj, *offset_obj;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "columns(key, value, headers, timestamp, offset)");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "RecordColumns", 5, 5, &key, &value, &headers, &ts_obj,
                           &offset_obj))
        return NULL;
    int64_t timestamp, offset;
    if (as_int64(ts_obj, &timestamp) < 0 || as_int64(offset_obj, &offset) < 0) {
        PyErr_SetString(PyExc_OverflowError, "a record's timestamp or offset is not an int64");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(headers, "headers must be a sequence of (key, value)");
    if (seq == NULL) return NULL;
    Py_ssize_t hcount = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < hcount; i++) {
        if (!PyTuple_Check(items[i]) || PyTuple_GET_SIZE(items[i]) != 2 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(items[i], 0))) {
            PyErr_SetString(PyExc_TypeError, "a header must be a (str, bytes | None) pair");
            goto error;
        }
    }
    if (push_value_object(&c->keys, key, "key") < 0 ||
        push_value_object(&c->values, value, "value") < 0)
        goto error;
    if (c->include_headers) {
        for (Py_ssize_t i = 0; i < hcount; i++) {
            Py_ssize_t kn;
            const char *k = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(items[i], 0), &kn);
            if (k == NULL || bincol_push(&c->header_keys, (const uint8_t *)k, kn) < 0 ||
                push_value_object(&c->header_values, PyTuple_GET_ITEM(items[i], 1),
                                  "header value") < 0)
                goto error;
        }
        if (columns_close_headers(c) < 0) goto error;
    }
    Py_DECREF(seq);
    if (columns_push_record(c, offset, timestamp) < 0) return NULL;
    Py_RETURN_NONE;
error:
    Py_DECREF(seq);
    return NULL;
}

static PyObject *gb_bytes(GrowBuf *b) { return PyBytes_FromStringAndSize(b->p, b->n); }

/* columns.finish() -> the fields of ColumnBuffers (the length, then 15 buffers); starts afresh. */
static PyObject *columns_finish(RecordColumnsObject *c, PyObject *unused) {
    PyObject *t = PyTuple_New(16);
    if (t == NULL) return NULL;
    int h = c->include_headers;
    PyObject *v[16] = {
        PyLong_FromSsize_t(c->count),
        gb_bytes(&c->keys.validity),
        gb_bytes(&c->keys.offsets),
        gb_bytes(&c->keys.data),
        gb_bytes(&c->values.validity),
        gb_bytes(&c->values.offsets),
        gb_bytes(&c->values.data),
        gb_bytes(&c->offsets),
        gb_bytes(&c->timestamps),
        gb_bytes(&c->types),
        h ? gb_bytes(&c->header_offsets) : PyBytes_FromStringAndSize(NULL, 0),
        h ? gb_bytes(&c->header_keys.offsets) : PyBytes_FromStringAndSize(NULL, 0),
        h ? gb_bytes(&c->header_keys.data) : PyBytes_FromStringAndSize(NULL, 0),
        h ? gb_bytes(&c->header_values.validity) : PyBytes_FromStringAndSize(NULL, 0),
        h ? gb_bytes(&c->header_values.offsets) : PyBytes_FromStringAndSize(NULL, 0),
        h ? gb_bytes(&c->header_values.data) : PyBytes_FromStringAndSize(NULL, 0),
    };
    int failed = 0;
    for (int i = 0; i < 16; i++) {
        if (v[i] == NULL) failed = 1;
        PyTuple_SET_ITEM(t, i, v[i]);
    }
    if (failed || columns_reset(c) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    return t;
}

static PyObject *columns_get_nbytes(RecordColumnsObject *c, void *unused) {
    return PyLong_FromSsize_t(c->keys.data.n + c->values.data.n + c->header_keys.data.n +
                              c->header_values.data.n + 20 * c->count);
}

static PyObject *columns_get_last_offset(RecordColumnsObject *c, void *unused) {
    int64_t last = -1;
    if (c->count) memcpy(&last, c->offsets.p + c->offsets.n - 8, 8);
    return PyLong_FromLongLong(last);
}

static PyObject *columns_get_include_headers(RecordColumnsObject *c, void *unused) {
    return PyBool_FromLong(c->include_headers);
}

static PyObject *columns_get_timestamp_type(RecordColumnsObject *c, void *unused) {
    return PyLong_FromLong(c->timestamp_type);
}

static int columns_set_timestamp_type(RecordColumnsObject *c, PyObject *v, void *unused) {
    long t = v == NULL ? -1 : PyLong_AsLong(v);
    if (t == -1 && PyErr_Occurred()) return -1;
    if (t != 0 && t != 1) {
        PyErr_SetString(PyExc_ValueError, "timestamp_type is 0 (create time) or 1 (log-append)");
        return -1;
    }
    c->timestamp_type = (int)t;
    return 0;
}

static PyMethodDef columns_methods[] = {
    {"read_records", (PyCFunction)(void (*)(void))columns_read_records, METH_FASTCALL,
     "read_records(buf, pos, end, count, base_offset, base_timestamp, log_append_time, "
     "last_offset_delta) -> (pos, decoded, previous_delta)"},
    {"finish", (PyCFunction)columns_finish, METH_NOARGS,
     "finish() -> the column buffers, as a tuple; starts afresh"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef columns_getset[] = {
    {"nbytes", (getter)columns_get_nbytes, NULL, "bytes held (data and fixed columns)", NULL},
    {"last_offset", (getter)columns_get_last_offset, NULL, "the last record's offset (-1: none)",
     NULL},
    {"include_headers", (getter)columns_get_include_headers, NULL, "whether headers are kept",
     NULL},
    {"timestamp_type", (getter)columns_get_timestamp_type, (setter)columns_set_timestamp_type,
     "the timestamp type of the records appended next", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods columns_as_sequence = {.sq_length = (lenfunc)columns_len};

static PyTypeObject RecordColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "highwater.records._codec.RecordColumns",
    .tp_basicsize = sizeof(RecordColumnsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RecordColumns(include_headers=False): decoded records as Arrow column buffers.",
    .tp_new = columns_new,
    .tp_dealloc = (destructor)columns_dealloc,
    .tp_call = (ternaryfunc)columns_call,
    .tp_methods = columns_methods,
    .tp_getset = columns_getset,
    .tp_as_sequence = &columns_as_sequence,
};

/* ---------------------------------------------------------------------------------- */
/* encode_rows and partition_rows: records from Arrow binary columns (the producer's     */
/* produce_batch and the Spark sink).                                                   */

/* An Arrow binary column as passed from Python: (validity or None, offsets, data,
 * array offset, length). Its buffers are borrowed until column_release. */
typedef struct {
    Bytes validity, offsets, data;
    int has_validity, present;
    Py_ssize_t offset, length;
} ArrowBinary;

static void column_release(ArrowBinary *c) {
    if (!c->present) return;
    if (c->has_validity) bytes_release(&c->validity);
    bytes_release(&c->offsets);
    bytes_release(&c->data);
    c->present = 0;
}

/* Borrow the column ``o`` (None: absent, every row null). The buffers' sizes are checked
 * here; each row's offsets when it is read. */
static int column_get(PyObject *o, ArrowBinary *c, const char *what) {
    memset(c, 0, sizeof *c);
    if (o == Py_None) return 0;
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 5) {
        PyErr_Format(PyExc_TypeError,
                     "the %s column is (validity, offsets, data, offset, length)", what);
        return -1;
    }
    c->offset = PyLong_AsSsize_t(PyTuple_GET_ITEM(o, 3));
    c->length = PyLong_AsSsize_t(PyTuple_GET_ITEM(o, 4));
    if ((c->offset == -1 || c->length == -1) && PyErr_Occurred()) return -1;
    PyObject *v = PyTuple_GET_ITEM(o, 0);
    c->has_validity = v != Py_None;
    if (c->has_validity && bytes_get(v, &c->validity) < 0) goto nobuffer;
    if (bytes_get(PyTuple_GET_ITEM(o, 1), &c->offsets) < 0) {
        if (c->has_validity) bytes_release(&c->validity);
        goto nobuffer;
    }
    if (bytes_get(PyTuple_GET_ITEM(o, 2), &c->data) < 0) {
        if (c->has_validity) bytes_release(&c->validity);
        bytes_release(&c->offsets);
        goto nobuffer;
    }
    c->present = 1;
    if (c->offset < 0 || c->length < 0 || c->offset > PY_SSIZE_T_MAX / 8 - c->length - 1 ||
        c->offsets.n < (c->offset + c->length + 1) * 4 ||
        (c->has_validity && c->validity.n < (c->offset + c->length + 7) / 8)) {
        PyErr_Format(PyExc_ValueError, "the %s column's buffers are shorter than its length",
                     what);
        column_release(c);
        return -1;
    }
    return 0;
nobuffer:
    PyErr_Format(PyExc_TypeError, "the %s column's buffers must be bytes-like", what);
    return -1;
}

/* Row ``row`` of the column: 0 with (*p, *n), *n -1 for null; -1 with ValueError when its
 * offsets are not inside the data. */
static inline int column_value(const ArrowBinary *c, Py_ssize_t row, const char *what,
                               const uint8_t **p, Py_ssize_t *n) {
    if (!c->present) {
        *n = -1;
        return 0;
    }
    Py_ssize_t i = c->offset + row;
    if (c->has_validity && !((c->validity.p[i >> 3] >> (i & 7)) & 1)) {
        *n = -1;
        return 0;
    }
    int32_t start, stop;
    memcpy(&start, c->offsets.p + 4 * i, 4);
    memcpy(&stop, c->offsets.p + 4 * (i + 1), 4);
    if (start < 0 || stop < start || stop > c->data.n) {
        PyErr_Format(PyExc_ValueError, "the %s column's offsets at row %zd are not inside its data",
                     what, row);
        return -1;
    }
    *p = c->data.p + start;
    *n = stop - start;
    return 0;
}

/* encode_rows(keys, values, rows, start, max_bytes) -> (records, next)
 * The bodies of records from rows[start:] (rows: an int32 buffer of row numbers, or
 * None for every row in order), offset deltas from 0, timestamp delta 0, no headers,
 * until the next would pass max_bytes (one at least); next: where the following batch
 * starts. */
static PyObject *codec_encode_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "encode_rows(keys, values, rows, start, max_bytes)");
        return NULL;
    }
    ArrowBinary keys, values;
    Bytes rows;
    int have_rows = args[2] != Py_None;
    Py_ssize_t start = PyLong_AsSsize_t(args[3]), max_bytes = PyLong_AsSsize_t(args[4]);
    if ((start == -1 || max_bytes == -1) && PyErr_Occurred()) return NULL;
    if (column_get(args[0], &keys, "key") < 0) return NULL;
    if (column_get(args[1], &values, "value") < 0) {
        column_release(&keys);
        return NULL;
    }
    PyObject *result = NULL;
    GrowBuf out = {0};
    Py_ssize_t length = values.present ? values.length : keys.length;
    if (keys.present && values.present && keys.length != values.length) {
        PyErr_SetString(PyExc_ValueError, "the key and value columns differ in length");
        goto done_columns;
    }
    if (have_rows) {
        if (bytes_get(args[2], &rows) < 0) {
            PyErr_SetString(PyExc_TypeError, "rows must be an int32 buffer or None");
            goto done_columns;
        }
    }
    Py_ssize_t total = have_rows ? rows.n / 4 : length;
    if (start < 0 || start > total) {
        PyErr_SetString(PyExc_ValueError, "start is outside the rows");
        goto finally;
    }
    Py_ssize_t i = start;
    for (; i < total; i++) {
        Py_ssize_t row = i;
        if (have_rows) {
            int32_t r;
            memcpy(&r, rows.p + 4 * i, 4);
            row = r;
        }
        if (row < 0 || row >= length) {
            PyErr_Format(PyExc_ValueError, "row %zd is outside the columns' %zd rows", row,
                         length);
            goto finally;
        }
        const uint8_t *kp = NULL, *vp = NULL;
        Py_ssize_t kn, vn;
        if (column_value(&keys, row, "key", &kp, &kn) < 0 ||
            column_value(&values, row, "value", &vp, &vn) < 0)
            goto finally;
        int64_t delta = i - start;
        if (delta > INT32_MAX) break;
        Py_ssize_t body = 1 + 1 + size_of_varint64(delta) +
                          (kn < 0 ? 1 : size_of_varint64(kn) + kn) +
                          (vn < 0 ? 1 : size_of_varint64(vn) + vn) + 1;
        Py_ssize_t size = size_of_varint64(body) + body;
        if (i > start && out.n + size > max_bytes) break;
        if (gb_reserve(&out, size) < 0) goto finally;
        uint8_t *o = (uint8_t *)out.p + out.n, *begin = o;
        o = put_varint64(o, body);
        *o++ = 0; /* attributes */
        *o++ = 0; /* timestamp delta */
        o = put_varint64(o, delta);
        if (kn < 0) {
            *o++ = 1;
        } else {
            o = put_varint64(o, kn);
            memcpy(o, kp, (size_t)kn);
            o += kn;
        }
        if (vn < 0) {
            *o++ = 1;
        } else {
            o = put_varint64(o, vn);
            memcpy(o, vp, (size_t)vn);
            o += vn;
        }
        *o++ = 0; /* no headers */
        out.n += o - begin;
    }
    result = Py_BuildValue("(y#n)", out.p ? out.p : "", out.n, i);
finally:
    if (have_rows) bytes_release(&rows);
done_columns:
    gb_free(&out);
    column_release(&keys);
    column_release(&values);
    return result;
}

static inline uint32_t murmur2_of(const uint8_t *p, Py_ssize_t length);

/* partition_rows(keys, num_partitions) -> tuple of num_partitions + 1 int32 buffers: the
 * rows of each partition by to_positive(murmur2(key)) % num_partitions, in order, and
 * last the rows with a null key (for the sticky partitioner). */
static PyObject *codec_partition_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "partition_rows(keys, num_partitions)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "num_partitions must be at least 1");
        return NULL;
    }
    if (args[0] == Py_None) {
        PyErr_SetString(PyExc_TypeError, "partition_rows needs a key column");
        return NULL;
    }
    ArrowBinary keys;
    if (column_get(args[0], &keys, "key") < 0) return NULL;
    if (keys.length > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "more than 2**31 rows");
        column_release(&keys);
        return NULL;
    }
    GrowBuf *parts = PyMem_Calloc((size_t)n + 1, sizeof(GrowBuf));
    PyObject *result = NULL;
    if (parts == NULL) {
        PyErr_NoMemory();
        column_release(&keys);
        return NULL;
    }
    for (Py_ssize_t row = 0; row < keys.length; row++) {
        const uint8_t *kp = NULL;
        Py_ssize_t kn;
        if (column_value(&keys, row, "key", &kp, &kn) < 0) goto finally;
        Py_ssize_t part = kn < 0 ? n : (Py_ssize_t)((murmur2_of(kp, kn) & 0x7FFFFFFFu) % (uint32_t)n);
        if (gb_put_i32(&parts[part], (int32_t)row) < 0) goto finally;
    }
    result = PyTuple_New(n + 1);
    if (result == NULL) goto finally;
    for (Py_ssize_t i = 0; i <= n; i++) {
        PyObject *b = gb_bytes(&parts[i]);
        if (b == NULL) {
            Py_CLEAR(result);
            goto finally;
        }
        PyTuple_SET_ITEM(result, i, b);
    }
finally:
    for (Py_ssize_t i = 0; i <= n; i++) gb_free(&parts[i]);
    PyMem_Free(parts);
    column_release(&keys);
    return result;
}

/* ---------------------------------------------------------------------------------- */
/* binary_column: the rows of an Arrow binary column as a list of bytes (None: null).   */

/* binary_column(validity, offsets, data, length) -> list: the first ``length`` rows; row i
 * is data[offsets[i]:offsets[i + 1]] (int32 offsets, native order), None where its bit of
 * ``validity`` is clear (or beyond it). Offsets outside ``data`` are a ValueError. */
static PyObject *codec_binary_column(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "binary_column(validity, offsets, data, length)");
        return NULL;
    }
    Py_ssize_t length = PyLong_AsSsize_t(args[3]);
    if (length == -1 && PyErr_Occurred()) return NULL;
    if (length < 0) {
        PyErr_SetString(PyExc_ValueError, "length must be >= 0");
        return NULL;
    }
    Py_buffer validity, offsets, data;
    if (PyObject_GetBuffer(args[0], &validity, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &offsets, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&validity);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&validity);
        PyBuffer_Release(&offsets);
        return NULL;
    }
    PyObject *rows = NULL;
    if (length > 0 && offsets.len / 4 < length + 1) {
        PyErr_SetString(PyExc_ValueError, "binary_column: fewer offsets than rows");
        goto done;
    }
    rows = PyList_New(length);
    if (rows == NULL) goto done;
    const uint8_t *bits = validity.buf, *bytes = data.buf;
    const char *offs = offsets.buf;
    for (Py_ssize_t row = 0; row < length; row++) {
        PyObject *item;
        if (row >> 3 >= validity.len || !(bits[row >> 3] >> (row & 7) & 1)) {
            item = Py_None;
            Py_INCREF(item);
        } else {
            int32_t start, end;
            memcpy(&start, offs + row * 4, 4);
            memcpy(&end, offs + row * 4 + 4, 4);
            if (start < 0 || end < start || end > data.len) {
                PyErr_SetString(PyExc_ValueError, "binary_column: an offset outside the data");
                Py_CLEAR(rows);
                goto done;
            }
            item = PyBytes_FromStringAndSize((const char *)bytes + start, end - start);
            if (item == NULL) {
                Py_CLEAR(rows);
                goto done;
            }
        }
        PyList_SET_ITEM(rows, row, item);
    }
done:
    PyBuffer_Release(&validity);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&data);
    return rows;
}

/* ---------------------------------------------------------------------------------- */
/* deliver_records: a written batch's delivery callbacks, each with its message.        */

/* deliver_records(records, callbacks, make_message, offset, step, append_time, start) ->
 * None when every callback from ``start`` on ran, else (index, exception, message) for the
 * first that raised (the caller logs it and goes on from index + 1). ``records`` holds the
 * batch's (key, value, headers, timestamp) tuples and ``callbacks`` each one's callback or
 * None; record i's offset is offset + i * step, its timestamp append_time when that is >= 0. */
static PyObject *codec_deliver_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "deliver_records(records: list, callbacks: list, "
                                         "make_message, offset, step, append_time, start)");
        return NULL;
    }
    PyObject *records = args[0], *callbacks = args[1], *make = args[2];
    int64_t offset, step, append_time, start;
    if (as_int64(args[3], &offset) < 0 || as_int64(args[4], &step) < 0 ||
        as_int64(args[5], &append_time) < 0 || as_int64(args[6], &start) < 0 || start < 0) {
        PyErr_SetString(PyExc_TypeError, "offset, step, append_time and start must be ints");
        return NULL;
    }
    PyObject *append_ts = NULL;
    if (append_time >= 0 && (append_ts = PyLong_FromLongLong(append_time)) == NULL) return NULL;
    for (Py_ssize_t i = (Py_ssize_t)start; i < PyList_GET_SIZE(callbacks); i++) {
        PyObject *callback = PyList_GET_ITEM(callbacks, i);
        if (callback == Py_None) continue;
        if (i >= PyList_GET_SIZE(records)) {
            PyErr_SetString(PyExc_ValueError, "deliver_records: more callbacks than records");
            Py_XDECREF(append_ts);
            return NULL;
        }
        PyObject *record = PyList_GET_ITEM(records, i);
        if (!PyTuple_CheckExact(record) || PyTuple_GET_SIZE(record) != 4) {
            PyErr_SetString(PyExc_TypeError, "deliver_records: a record is not a 4-tuple");
            Py_XDECREF(append_ts);
            return NULL;
        }
        Py_INCREF(callback); /* a callback may change the lists */
        Py_INCREF(record);
        PyObject *offset_obj = PyLong_FromLongLong(offset + (int64_t)i * step);
        PyObject *message = NULL;
        if (offset_obj != NULL) {
            PyObject *fields[5] = {PyTuple_GET_ITEM(record, 0), PyTuple_GET_ITEM(record, 1),
                                   PyTuple_GET_ITEM(record, 2),
                                   append_ts != NULL ? append_ts : PyTuple_GET_ITEM(record, 3),
                                   offset_obj};
            message = PyObject_Vectorcall(make, fields, 5, NULL);
            Py_DECREF(offset_obj);
        }
        Py_DECREF(record);
        if (message == NULL) {
            Py_DECREF(callback);
            Py_XDECREF(append_ts);
            return NULL;
        }
        PyObject *call_args[2] = {Py_None, message};
        PyObject *result = PyObject_Vectorcall(callback, call_args, 2, NULL);
        Py_DECREF(callback);
        if (result == NULL) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyErr_NormalizeException(&type, &value, &traceback);
            if (traceback != NULL && value != NULL) PyException_SetTraceback(value, traceback);
            Py_XDECREF(type);
            Py_XDECREF(traceback);
            Py_XDECREF(append_ts);
            PyObject *failed = Py_BuildValue("(nNN)", i, value ? value : Py_NewRef(Py_None), message);
            return failed;
        }
        Py_DECREF(result);
        Py_DECREF(message);
    }
    Py_XDECREF(append_ts);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------- */
/* RecordBuffer: an open batch's records, written as RecordBatch v2 bodies as they come. */
/*                                                                                      */
/* The compiled RecordBatchBuilder's store (its ``_buffer``): each append checks and     */
/* sizes the record (record_size_of), refuses it when the batch would pass max_bytes      */
/* (the first record always fits), writes its varint-framed body into one growing block   */
/* and keeps the batch's counts and timestamps in C: no Python object per record. The      */
/* records are decoded back only when asked for (delivery callbacks, a handle's           */
/* metadata), once per length.                                                            */

struct RecordBufferObject {
    PyObject_HEAD
    uint8_t *data;
    Py_ssize_t len, cap;        /* bytes written, allocated */
    Py_ssize_t count;           /* records */
    Py_ssize_t header_size;     /* counted in size: the batch header */
    int64_t max_bytes;
    int64_t base_timestamp, max_timestamp; /* valid once count > 0 */
    PyObject *decoded;          /* records() of the first decoded_count records, or NULL */
    Py_ssize_t decoded_count;
};

static int buffer_reserve(RecordBufferObject *b, Py_ssize_t more) {
    if (more <= b->cap - b->len) return 0;
    if (more > PY_SSIZE_T_MAX / 2 - b->len) {
        PyErr_NoMemory();
        return -1;
    }
    /* The first block holds a full batch (up to 1 MiB): no copy as the batch grows. */
    Py_ssize_t cap = b->cap, need = b->len + more;
    if (cap == 0) {
        int64_t full = b->max_bytes - b->header_size;
        cap = full < 4096 ? 4096 : full > (1 << 20) ? (1 << 20) : (Py_ssize_t)full;
    }
    while (cap < need) cap *= 2;
    uint8_t *p = PyMem_Realloc(b->data, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

/* The batch's bytes so far, header included (what RecordBatchBuilder.estimated_size is). */
static inline int64_t buffer_size(const RecordBufferObject *b) {
    return (int64_t)b->header_size + b->len;
}

/* Append one record: the bytes it adds, 0 when it does not fit, -1 (no exception) when it
 * is not one the compiled code writes (the pure code decides, and raises), -2 on an
 * error. Nothing changes unless it is appended. */
static Py_ssize_t buffer_append(RecordBufferObject *b, PyObject *key, PyObject *value,
                                PyObject *headers, int64_t timestamp) {
    int first = b->count == 0;
    int64_t delta = 0;
    if (!first && __builtin_sub_overflow(timestamp, b->base_timestamp, &delta)) return -1;
    Py_ssize_t size = record_size_of(b->count, delta, key, value, headers);
    if (size < 0) return PyErr_Occurred() ? -2 : -1;
    if (!first && buffer_size(b) + size > b->max_bytes) return 0;
    if (buffer_reserve(b, size) < 0) return -2;
    uint8_t *start = b->data + b->len;
    if (write_record_at(start, size, delta, b->count, key, value, headers) - start != size) {
        PyErr_SetString(PyExc_SystemError, "RecordBuffer: record size mismatch");
        return -2;
    }
    b->len += size;
    b->count++;
    if (first) b->base_timestamp = b->max_timestamp = timestamp;
    else if (timestamp > b->max_timestamp) b->max_timestamp = timestamp;
    return size;
}

static PyObject *buffer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    long long max_bytes;
    Py_ssize_t header_size;
    static char *kwlist[] = {"max_bytes", "header_size", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Ln:RecordBuffer", kwlist, &max_bytes,
                                     &header_size))
        return NULL;
    if (header_size < 0) {
        PyErr_SetString(PyExc_ValueError, "header_size must not be negative");
        return NULL;
    }
    RecordBufferObject *b = (RecordBufferObject *)type->tp_alloc(type, 0);
    if (b == NULL) return NULL;
    b->max_bytes = max_bytes;
    b->header_size = header_size;
    return (PyObject *)b;
}

static void buffer_dealloc(RecordBufferObject *b) {
    PyMem_Free(b->data);
    Py_XDECREF(b->decoded);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

/* append(key, value, headers, timestamp) -> the bytes added, 0 when it does not fit, or
 * None when the record is not one the compiled code writes (nothing appended). */
static PyObject *buffer_append_method(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "append(key, value, headers, timestamp)");
        return NULL;
    }
    int64_t ts;
    if (as_int64(args[3], &ts) < 0) Py_RETURN_NONE;
    Py_ssize_t size = buffer_append((RecordBufferObject *)op, args[0], args[1], args[2], ts);
    if (size == -2) return NULL;
    if (size == -1) Py_RETURN_NONE;
    return PyLong_FromSsize_t(size);
}

/* append_encoded(record, timestamp): a record the pure code checked, sized and wrote
 * (write_record's bytes, at offset delta ``count``, its timestamp delta from the base). */
static PyObject *buffer_append_encoded(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    RecordBufferObject *b = (RecordBufferObject *)op;
    int64_t ts;
    if (nargs != 2 || !PyBytes_Check(args[0]) || as_int64(args[1], &ts) < 0) {
        PyErr_SetString(PyExc_TypeError, "append_encoded(record: bytes, timestamp: int64)");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    if (buffer_reserve(b, n) < 0) return NULL;
    memcpy(b->data + b->len, PyBytes_AS_STRING(args[0]), (size_t)n);
    b->len += n;
    if (b->count++ == 0) b->base_timestamp = b->max_timestamp = ts;
    else if (ts > b->max_timestamp) b->max_timestamp = ts;
    Py_RETURN_NONE;
}

/* records() -> [(key, value, headers, timestamp)], in order; decoded once per length. */
static PyObject *buffer_records(PyObject *op, PyObject *unused) {
    RecordBufferObject *b = (RecordBufferObject *)op;
    if (b->decoded != NULL && b->decoded_count == b->count) {
        Py_INCREF(b->decoded);
        return b->decoded;
    }
    PyObject *out = PyList_New(b->count);
    if (out == NULL) return NULL;
    Py_ssize_t pos = 0;
    PyObject *last_ts = NULL; /* records of one millisecond share their int */
    int64_t last = 0;
    for (Py_ssize_t i = 0; i < b->count; i++) {
        Decoded d;
        int r = decode_one(b->data, pos, b->len, &d);
        if (r < 0) goto error;
        int64_t ts;
        if (r == 0 || __builtin_add_overflow(b->base_timestamp, d.timestamp_delta, &ts)) {
            if (r > 0) {
                Py_DECREF(d.key);
                Py_DECREF(d.value);
                Py_DECREF(d.headers);
            }
            PyErr_SetString(PyExc_SystemError, "RecordBuffer: a record it wrote does not decode");
            goto error;
        }
        if (last_ts == NULL || ts != last) {
            Py_XSETREF(last_ts, PyLong_FromLongLong(ts));
            last = ts;
        }
        PyObject *record = last_ts == NULL ? NULL : PyTuple_New(4);
        if (record == NULL) {
            Py_DECREF(d.key);
            Py_DECREF(d.value);
            Py_DECREF(d.headers);
            goto error;
        }
        Py_INCREF(last_ts);
        PyTuple_SET_ITEM(record, 0, d.key);
        PyTuple_SET_ITEM(record, 1, d.value);
        PyTuple_SET_ITEM(record, 2, d.headers);
        PyTuple_SET_ITEM(record, 3, last_ts);
        PyList_SET_ITEM(out, i, record);
        pos = d.end;
    }
    Py_XDECREF(last_ts);
    Py_XSETREF(b->decoded, out);
    b->decoded_count = b->count;
    Py_INCREF(out);
    return out;
error:
    Py_XDECREF(last_ts);
    Py_DECREF(out); /* its unset items are NULL, which a list's deallocation skips */
    return NULL;
}

/* batch() -> bytearray: header_size zero bytes (the header, to be filled) and the records. */
static PyObject *buffer_batch(PyObject *op, PyObject *unused) {
    RecordBufferObject *b = (RecordBufferObject *)op;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, b->header_size + b->len);
    if (out == NULL) return NULL;
    char *p = PyByteArray_AS_STRING(out);
    memset(p, 0, (size_t)b->header_size);
    if (b->len) memcpy(p + b->header_size, b->data, (size_t)b->len);
    return out;
}

static PyObject *buffer_get_count(RecordBufferObject *b, void *unused) {
    return PyLong_FromSsize_t(b->count);
}
static PyObject *buffer_get_size(RecordBufferObject *b, void *unused) {
    return PyLong_FromLongLong(buffer_size(b));
}
static PyObject *buffer_get_base_timestamp(RecordBufferObject *b, void *unused) {
    if (b->count == 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(b->base_timestamp);
}
static PyObject *buffer_get_max_timestamp(RecordBufferObject *b, void *unused) {
    return PyLong_FromLongLong(b->count == 0 ? -1 : b->max_timestamp);
}
static PyObject *buffer_get_max_bytes(RecordBufferObject *b, void *unused) {
    return PyLong_FromLongLong(b->max_bytes);
}

static PyMethodDef buffer_methods[] = {
    {"append", (PyCFunction)(void (*)(void))buffer_append_method, METH_FASTCALL,
     "append(key, value, headers, timestamp) -> bytes added, 0: does not fit, None: the pure "
     "code's to take"},
    {"append_encoded", (PyCFunction)(void (*)(void))buffer_append_encoded, METH_FASTCALL,
     "append_encoded(record, timestamp): a record written by the pure code"},
    {"records", buffer_records, METH_NOARGS, "records() -> [(key, value, headers, timestamp)]"},
    {"batch", buffer_batch, METH_NOARGS, "batch() -> bytearray of the header's room and records"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef buffer_getset[] = {
    {"count", (getter)buffer_get_count, NULL, "records appended", NULL},
    {"size", (getter)buffer_get_size, NULL, "header_size plus the records' bytes", NULL},
    {"base_timestamp", (getter)buffer_get_base_timestamp, NULL, "the first record's, or None",
     NULL},
    {"max_timestamp", (getter)buffer_get_max_timestamp, NULL, "the largest, -1 when empty",
     NULL},
    {"max_bytes", (getter)buffer_get_max_bytes, NULL, "the limit of size", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RecordBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "highwater.records._codec.RecordBuffer",
    .tp_basicsize = sizeof(RecordBufferObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RecordBuffer(max_bytes, header_size): an open batch's records as bytes",
    .tp_new = buffer_new,
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_methods = buffer_methods,
    .tp_getset = buffer_getset,
};

/* ---------------------------------------------------------------------------------- */
/* ProduceLane: AsyncProducer.produce()'s common case in one call.                      */
/*                                                                                      */
/* A record of bytes (or None) without headers, for a topic with metadata, whose          */
/* partition (the named one, the sticky one, or murmur2 of its key) has an open batch:    */
/* the checks, the partition's choice, the record's bytes written into the open batch's    */
/* RecordBuffer, the batch's close at batch.size, the producer's count of undelivered      */
/* records (held here: its _pending is a property over it), the sticky partitioner's byte  */
/* count and the record's DeliveryHandle, all here, on the producer's own attributes (its  */
/* __dict__) and the dataclasses' slots. Anything else returns None, and the Python path   */
/* runs, which raises the typed errors: nothing has changed then.                         */

enum { PB_BUILDER, PB_CALLBACKS, PB_HAS_CALLBACKS, PB_CLOSED, PB_SLOTS };
static const char *pbatch_slot_names[PB_SLOTS] = {"builder", "callbacks", "has_callbacks",
                                                  "closed"};
enum { PQ_BATCHES, PQ_SLOTS };
static const char *pqueue_slot_names[PQ_SLOTS] = {"batches"};
enum { SC_INFO, SC_PARTITION, SC_QUEUE, SC_THRESHOLD, SC_UNREPORTED, SC_SLOTS };
static const char *choice_slot_names[SC_SLOTS] = {"info", "partition", "queue", "threshold",
                                                  "unreported"};
enum { DH_BATCH, DH_ERROR, DH_FUTURE, DH_INDEX, DH_SLOTS };
static const char *handle_slot_names[DH_SLOTS] = {"_batch", "_error", "_future", "_index"};

enum {
    PA_TRACING, PA_FATAL, PA_CLOSED, PA_WAITING, PA_STICKY_CHOICES, PA_TOPICS, PA_QUEUES,
    PA_IGNORE_KEYS, PA_BATCH_SIZE, PA_WAKEUP, PA_STICKY, PA_COUNT
};
static const char *producer_attr_names[PA_COUNT] = {
    "_tracing", "_fatal", "_closed", "_waiting", "_sticky_choices", "_topics", "_queues",
    "_ignore_keys", "_batch_size", "_wakeup", "_sticky"};
static PyObject *producer_attrs[PA_COUNT]; /* interned names */
static PyObject *s_num_partitions, *s_set, *s_on_produced;

/* A dict lookup remembered while the dict does not change: the dict's version tag
 * (CPython 3.11's ma_version_tag, a global counter every change of any dict moves on)
 * says so, as the interpreter's own caches of globals do. The value is borrowed: the
 * unchanged dict still holds it. The key is held, as its identity is what is compared.
 * Later Pythons deprecate the tag: there every call looks the key up. */
#if PY_VERSION_HEX < 0x030C0000
#define HW_DICT_VERSIONS 1
static inline uint64_t dict_version(PyObject *d) { return ((PyDictObject *)d)->ma_version_tag; }
#endif

typedef struct {
    PyObject *dict; /* compared only, never dereferenced */
    PyObject *key;  /* held */
    PyObject *value;
    uint64_t version;
} DictMemo;

/* dict[key], borrowed; NULL when missing (or on an error, which is set). */
static PyObject *memo_get(DictMemo *m, PyObject *dict, PyObject *key) {
#ifdef HW_DICT_VERSIONS
    if (m->value != NULL && m->dict == dict && m->key == key && dict_version(dict) == m->version)
        return m->value;
#endif
    PyObject *value = PyDict_GetItemWithError(dict, key);
    m->value = NULL;
    if (value == NULL) return NULL;
#ifdef HW_DICT_VERSIONS
    Py_INCREF(key);
    Py_XSETREF(m->key, key);
    m->dict = dict;
    m->version = dict_version(dict);
    m->value = value;
#endif
    return value;
}

typedef struct {
    PyObject_HEAD
    PyObject *attrs;    /* the producer's __dict__ */
    PyObject *fallback; /* the Python produce(), bound: every call the lane does not take */
    PyTypeObject *types[4]; /* ProducerBatch, PartitionQueue, StickyChoice, DeliveryHandle */
    Py_ssize_t batch_off[PB_SLOTS], queue_off[PQ_SLOTS], choice_off[SC_SLOTS],
        handle_off[DH_SLOTS];
    vectorcallfunc vectorcall;
    /* The last named or keyed partition's queue: the producer's ``_queues`` dict, the
     * topic (the str object itself) and partition it was found for. A queue, once made,
     * stays in that dict for the producer's life, so the entry holds while the dict is the
     * same object; another topic object or partition, or another dict, looks it up again. */
    PyObject *cached_queues, *cached_topic, *cached_queue;
    int64_t cached_partition;
    /* The producer's attributes as last read (borrowed from its __dict__) and the dict's
     * version then; the topic's metadata and sticky choice likewise (DictMemo). */
    PyObject *attr_values[PA_COUNT];
    uint64_t attrs_version;
    int attrs_read;
    DictMemo topic_info, topic_choice;
    /* The producer's records not delivered yet (its ``_pending``, a property over this). */
    int64_t pending;
    /* 0, 1, 2...: the handles' indexes, shared (a batch holds about a thousand records). */
    PyObject *indexes;
} ProduceLaneObject;

static PyTypeObject ProduceLaneType;

static inline PyObject *at(PyObject *obj, Py_ssize_t offset) { /* borrowed, may be NULL */
    return *(PyObject **)((char *)obj + offset);
}

static int resolve_slots(PyTypeObject *cls, const char **names, int n, Py_ssize_t *offsets) {
    for (int i = 0; i < n; i++) {
        PyObject *name = PyUnicode_FromString(names[i]);
        if (name == NULL) return -1;
        int failed = slot_offset(cls, name, &offsets[i]);
        Py_DECREF(name);
        if (failed) return -1;
    }
    return 0;
}

static PyObject *lane_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames);
static PyObject *produce_arg_names[7]; /* interned: topic, value, ... on_delivery */

static PyObject *lane_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *attrs, *fallback;
    PyTypeObject *bt, *qt, *ct, *ht;
    static char *kwlist[] = {"attrs",       "batch_type", "queue_type", "choice_type",
                             "handle_type", "fallback",   NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!O!O!O:ProduceLane", kwlist, &PyDict_Type,
                                     &attrs, &PyType_Type, &bt, &PyType_Type, &qt, &PyType_Type,
                                     &ct, &PyType_Type, &ht, &fallback))
        return NULL;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "fallback must be callable");
        return NULL;
    }
    if (builder_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ProduceLane needs bind(builder_type=...) first");
        return NULL;
    }
    ProduceLaneObject *self = (ProduceLaneObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    if (resolve_slots(bt, pbatch_slot_names, PB_SLOTS, self->batch_off) < 0 ||
        resolve_slots(qt, pqueue_slot_names, PQ_SLOTS, self->queue_off) < 0 ||
        resolve_slots(ct, choice_slot_names, SC_SLOTS, self->choice_off) < 0 ||
        resolve_slots(ht, handle_slot_names, DH_SLOTS, self->handle_off) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    Py_INCREF(attrs);
    self->attrs = attrs;
    Py_INCREF(fallback);
    self->fallback = fallback;
    PyTypeObject *types[4] = {bt, qt, ct, ht};
    for (int i = 0; i < 4; i++) {
        Py_INCREF(types[i]);
        self->types[i] = types[i];
    }
    self->vectorcall = lane_call;
    return (PyObject *)self;
}

static int lane_traverse(ProduceLaneObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->attrs);
    Py_VISIT(self->fallback);
    for (int i = 0; i < 4; i++) Py_VISIT(self->types[i]);
    Py_VISIT(self->cached_queues);
    Py_VISIT(self->cached_topic);
    Py_VISIT(self->cached_queue);
    return 0;
}

static int lane_clear(ProduceLaneObject *self) {
    Py_CLEAR(self->attrs);
    Py_CLEAR(self->fallback);
    for (int i = 0; i < 4; i++) Py_CLEAR(self->types[i]);
    Py_CLEAR(self->cached_queues);
    Py_CLEAR(self->cached_topic);
    Py_CLEAR(self->cached_queue);
    Py_CLEAR(self->indexes);
    self->attrs_read = 0;
    self->topic_info.value = self->topic_choice.value = NULL;
    Py_CLEAR(self->topic_info.key);
    Py_CLEAR(self->topic_choice.key);
    return 0;
}

/* The queue of ``topic``-``partition`` in ``queues`` (borrowed), from the cache or looked
 * up and cached; NULL when there is none (or on an error, which is set). */
static PyObject *lane_queue(ProduceLaneObject *self, PyObject *queues, PyObject *topic,
                            int64_t partition) {
    if (queues == self->cached_queues && topic == self->cached_topic &&
        partition == self->cached_partition && self->cached_queue != NULL)
        return self->cached_queue;
    PyObject *partition_obj = PyLong_FromLongLong(partition);
    if (partition_obj == NULL) return NULL;
    PyObject *queue_key = PyTuple_Pack(2, topic, partition_obj);
    Py_DECREF(partition_obj);
    if (queue_key == NULL) return NULL;
    PyObject *q = PyDict_GetItemWithError(queues, queue_key);
    Py_DECREF(queue_key);
    if (q == NULL) return NULL;
    Py_INCREF(queues);
    Py_XSETREF(self->cached_queues, queues);
    Py_INCREF(topic);
    Py_XSETREF(self->cached_topic, topic);
    Py_INCREF(q);
    Py_XSETREF(self->cached_queue, q);
    self->cached_partition = partition;
    return q;
}

static void lane_dealloc(ProduceLaneObject *self) {
    PyObject_GC_UnTrack(self);
    lane_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The producer's attribute ``i`` (borrowed), NULL when absent or on an error. */
static inline PyObject *producer_attr(ProduceLaneObject *self, int i) {
    return PyDict_GetItemWithError(self->attrs, producer_attrs[i]);
}

/* Read the producer's attributes into attr_values unless its __dict__ is unchanged since
 * they were read: -1 on an error (set), else 0 (an absent one is NULL). */
static int lane_read_attrs(ProduceLaneObject *self) {
#ifdef HW_DICT_VERSIONS
    if (self->attrs_read && dict_version(self->attrs) == self->attrs_version) return 0;
#endif
    for (int i = 0; i < PA_COUNT; i++) {
        self->attr_values[i] = producer_attr(self, i);
        if (self->attr_values[i] == NULL && PyErr_Occurred()) {
            self->attrs_read = 0;
            return -1;
        }
    }
#ifdef HW_DICT_VERSIONS
    self->attrs_version = dict_version(self->attrs);
#endif
    self->attrs_read = 1;
    return 0;
}

/* The int ``i`` (a new reference), from the lane's shared ones below 4096. */
static PyObject *lane_index(ProduceLaneObject *self, Py_ssize_t i) {
    if (i >= 4096) return PyLong_FromSsize_t(i);
    if (self->indexes == NULL && (self->indexes = PyList_New(0)) == NULL) return NULL;
    while (PyList_GET_SIZE(self->indexes) <= i) {
        PyObject *n = PyLong_FromSsize_t(PyList_GET_SIZE(self->indexes));
        if (n == NULL) return NULL;
        int failed = PyList_Append(self->indexes, n);
        Py_DECREF(n);
        if (failed) return NULL;
    }
    PyObject *n = PyList_GET_ITEM(self->indexes, i);
    Py_INCREF(n);
    return n;
}

#define GENERAL_PATH()                                                                     \
    do {                                                                                   \
        if (PyErr_Occurred()) goto fail;                                                   \
        result = Py_None;                                                                  \
        Py_INCREF(result);                                                                 \
        goto done;                                                                         \
    } while (0)

/* The record of produce()'s seven arguments placed: its DeliveryHandle (True when none is
 * wanted), or None when the Python path must take it (nothing changed then). */
static PyObject *lane_place(ProduceLaneObject *self, PyObject *const *args, int want_handle) {
    PyObject *topic = args[0], *value = args[1], *key = args[2], *partition = args[3];
    PyObject *headers = args[4], *timestamp = args[5], *on_delivery = args[6];
    PyObject *result = NULL, *batch = NULL, *handle = NULL, *index_obj = NULL;
    PyObject *choice = NULL, *q = NULL, *o;

    if (headers != Py_None || !PyUnicode_CheckExact(topic) || PyUnicode_GET_LENGTH(topic) == 0 ||
        (value != Py_None && !PyBytes_CheckExact(value)) ||
        (key != Py_None && !PyBytes_CheckExact(key)))
        GENERAL_PATH();
    if (lane_read_attrs(self) < 0) goto fail;
    PyObject **attr = self->attr_values;
    if (attr[PA_TRACING] != Py_None || attr[PA_FATAL] != Py_None || attr[PA_CLOSED] != Py_False)
        GENERAL_PATH();
    PyObject *waiting = attr[PA_WAITING], *topics = attr[PA_TOPICS], *queues = attr[PA_QUEUES];
    if (waiting == NULL || topics == NULL || queues == NULL || !PyDict_CheckExact(waiting) ||
        !PyDict_CheckExact(topics) || !PyDict_CheckExact(queues))
        GENERAL_PATH();
    if (PyDict_GET_SIZE(waiting) != 0) { /* mostly empty: no lookup then */
        int contained = PyDict_Contains(waiting, topic);
        if (contained != 0) GENERAL_PATH();
    }
    PyObject *info = memo_get(&self->topic_info, topics, topic);
    if (info == NULL) GENERAL_PATH();

    int64_t requested = -1;
    if (partition != Py_None) {
        if (!PyLong_CheckExact(partition) || as_int64(partition, &requested) < 0) GENERAL_PATH();
    }
    if (requested < 0) {
        int ignore_keys = 0; /* read only for a keyed record */
        if (key != Py_None) {
            o = attr[PA_IGNORE_KEYS];
            if (o == NULL) GENERAL_PATH();
            ignore_keys = PyObject_IsTrue(o);
            if (ignore_keys < 0) goto fail;
        }
        if (key == Py_None || ignore_keys) {
            PyObject *choices = attr[PA_STICKY_CHOICES];
            if (choices == NULL || !PyDict_CheckExact(choices)) GENERAL_PATH();
            PyObject *found = memo_get(&self->topic_choice, choices, topic);
            if (found == NULL || !Py_IS_TYPE(found, self->types[2]) ||
                at(found, self->choice_off[SC_INFO]) != info)
                GENERAL_PATH();
            choice = found; /* held: the partitioner's report below may drop the dict's */
            Py_INCREF(choice);
            q = at(choice, self->choice_off[SC_QUEUE]);
        } else { /* Kafka's partitionForKey: murmur2 of the key over all partitions */
            o = PyObject_GetAttr(info, s_num_partitions);
            if (o == NULL) goto fail;
            int64_t n;
            int bad = as_int64(o, &n);
            Py_DECREF(o);
            if (bad < 0 || n < 1) GENERAL_PATH();
            uint32_t h = murmur2_of((const uint8_t *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
            q = lane_queue(self, queues, topic, (int64_t)((h & 0x7fffffffu) % (uint64_t)n));
        }
    } else {
        q = lane_queue(self, queues, topic, requested);
    }
    if (q == NULL || !Py_IS_TYPE(q, self->types[1])) GENERAL_PATH();
    PyObject *batches = at(q, self->queue_off[PQ_BATCHES]);
    if (batches == NULL) GENERAL_PATH();
    Py_ssize_t nbatches = PyObject_Length(batches);
    if (nbatches <= 0) GENERAL_PATH();
    batch = PySequence_GetItem(batches, nbatches - 1);
    if (batch == NULL) goto fail;
    if (!Py_IS_TYPE(batch, self->types[0]) || at(batch, self->batch_off[PB_CLOSED]) != Py_False)
        GENERAL_PATH();
    PyObject *builder = at(batch, self->batch_off[PB_BUILDER]);
    PyObject *callbacks = at(batch, self->batch_off[PB_CALLBACKS]);
    if (builder == NULL || callbacks == NULL || !PyList_CheckExact(callbacks) ||
        builder_type == NULL || !Py_IS_TYPE(builder, builder_type) ||
        slot_get(builder, B_BUILT) != Py_None || slot_get(builder, B_ENCODED) != Py_None)
        GENERAL_PATH();
    PyObject *buffer_obj = slot_get(builder, B_BUFFER);
    if (buffer_obj == NULL || !Py_IS_TYPE(buffer_obj, &RecordBufferType)) GENERAL_PATH();
    RecordBufferObject *buffer = (RecordBufferObject *)buffer_obj;
    PyObject *batch_size_obj = attr[PA_BATCH_SIZE];
    int64_t batch_size;
    if (batch_size_obj == NULL || as_int64(batch_size_obj, &batch_size) < 0) GENERAL_PATH();

    /* timestamp (0 or None: now, time.time_ns() // 1_000_000; negative: the general path
       refuses it, as Kafka's ProducerRecord does) */
    int64_t ts = 0;
    if (timestamp != Py_None) {
        if (!PyLong_CheckExact(timestamp) || as_int64(timestamp, &ts) < 0 || ts < 0)
            GENERAL_PATH();
    }
    if (ts == 0) {
        struct timespec now;
        if (clock_gettime(CLOCK_REALTIME, &now) != 0) GENERAL_PATH();
        ts = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    }
    /* What may fail is made before the append, so a record is appended with its handle. */
    if (want_handle) {
        index_obj = lane_index(self, PyList_GET_SIZE(callbacks));
        if (index_obj == NULL) goto fail;
        PyTypeObject *ht = self->types[3];
        handle = ht->tp_alloc(ht, 0);
        if (handle == NULL) goto fail;
        set_slot(handle, self->handle_off[DH_BATCH], batch);
        set_slot(handle, self->handle_off[DH_INDEX], index_obj);
        set_slot(handle, self->handle_off[DH_FUTURE], Py_None);
        set_slot(handle, self->handle_off[DH_ERROR], Py_None);
    }
    if (PyList_Append(callbacks, on_delivery) < 0) goto fail;
    /* The record's bytes go straight into the batch: nothing is kept of it per record. */
    Py_ssize_t size = buffer_append(buffer, key, value, empty_tuple, ts);
    if (size <= 0) { /* does not fit, or not one the compiled append takes */
        Py_ssize_t n = PyList_GET_SIZE(callbacks);
        if (PyList_SetSlice(callbacks, n - 1, n, NULL) < 0 || size == -2) goto fail;
        GENERAL_PATH();
    }
    self->pending++;
    if (on_delivery != Py_None) set_slot(batch, self->batch_off[PB_HAS_CALLBACKS], Py_True);
    if (buffer_size(buffer) >= batch_size) {
        set_slot(batch, self->batch_off[PB_CLOSED], Py_True);
        PyObject *wakeup = producer_attr(self, PA_WAKEUP);
        if (wakeup == NULL) goto fail_after;
        o = PyObject_CallMethodNoArgs(wakeup, s_set);
        if (o == NULL) goto fail_after;
        Py_DECREF(o);
    }
    if (choice != NULL) {
        int64_t unreported, threshold;
        if (as_int64(at(choice, self->choice_off[SC_UNREPORTED]), &unreported) < 0 ||
            as_int64(at(choice, self->choice_off[SC_THRESHOLD]), &threshold) < 0) {
            PyErr_SetString(PyExc_TypeError, "a StickyChoice's counts must be ints");
            goto fail_after;
        }
        unreported += size;
        o = PyLong_FromLongLong(unreported);
        if (o == NULL) goto fail_after;
        set_slot(choice, self->choice_off[SC_UNREPORTED], o);
        if (unreported >= threshold) {
            PyObject *sticky = producer_attr(self, PA_STICKY);
            PyObject *choices = producer_attr(self, PA_STICKY_CHOICES);
            if (sticky == NULL || choices == NULL) {
                Py_DECREF(o);
                goto fail_after;
            }
            PyObject *report = PyObject_CallMethodObjArgs(
                sticky, s_on_produced, topic, at(choice, self->choice_off[SC_PARTITION]), o, NULL);
            Py_DECREF(o);
            if (report == NULL) goto fail_after;
            Py_DECREF(report);
            if (PyDict_DelItem(choices, topic) < 0) goto fail_after;
        } else {
            Py_DECREF(o);
        }
    }
    if (handle != NULL) {
        result = handle;
        handle = NULL;
    } else {
        result = Py_True;
        Py_INCREF(result);
    }
    goto done;
fail_after: /* the record is queued: an error now is the caller's, as in the Python path */
fail:
    result = NULL;
done:
    Py_XDECREF(batch);
    Py_XDECREF(index_obj);
    Py_XDECREF(handle);
    Py_XDECREF(choice);
    return result;
}
#undef GENERAL_PATH

/* produce()'s arguments as given (positional and keywords) into its seven, None where not
 * given: 1, or 0 when the call is not one the lane takes (too many or too few positional
 * arguments, an unknown keyword or one given twice: the fallback says what is wrong). */
static int lane_arguments(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                          PyObject **given) {
    for (int i = 0; i < 7; i++) given[i] = Py_None;
    if (nargs < 1 || nargs > 7) return 0;
    for (Py_ssize_t i = 0; i < nargs; i++) given[i] = args[i];
    if (kwnames == NULL) return 1;
    Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int found = -1;
        for (int j = 0; j < 7; j++) {
            if (name == produce_arg_names[j]) {
                found = j;
                break;
            }
        }
        if (found < nargs) return 0; /* unknown, or given twice */
        given[found] = args[nargs + k];
    }
    return 1;
}

/* lane(topic, value=None, key=None, partition=None, headers=None, timestamp=None,
 * on_delivery=None): produce() itself; the calls it does not take go to the fallback with
 * their arguments as given (which raises the typed errors). */
static PyObject *lane_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    ProduceLaneObject *self = (ProduceLaneObject *)op;
    PyObject *given[7];
    if (lane_arguments(args, PyVectorcall_NARGS(nargsf), kwnames, given)) {
        PyObject *result = lane_place(self, given, 1);
        if (result != Py_None) return result;
        Py_DECREF(result);
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* lane.produce_without_handle(...): produce()'s arguments, no handle made; None. The calls
 * the lane does not take go to the fallback (produce(), whose handle is dropped: one per
 * batch, where the lane opens none). */
static PyObject *lane_produce_without_handle(PyObject *op, PyObject *const *args,
                                             Py_ssize_t nargs, PyObject *kwnames) {
    ProduceLaneObject *self = (ProduceLaneObject *)op;
    PyObject *given[7];
    PyObject *result = NULL;
    if (lane_arguments(args, nargs, kwnames, given)) {
        result = lane_place(self, given, 0);
        if (result == NULL) return NULL;
        if (result == Py_None) {
            Py_DECREF(result);
            result = NULL;
        }
    }
    if (result == NULL) result = PyObject_Vectorcall(self->fallback, args, nargs, kwnames);
    if (result == NULL) return NULL;
    Py_DECREF(result);
    Py_RETURN_NONE;
}

/* lane.place(topic, value, key, partition, headers, timestamp, on_delivery): the blocking
 * producer's way in, without a handle: True when placed, None for the Python path. */
static PyObject *lane_place_method(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "place(topic, value, key, partition, headers, "
                                         "timestamp, on_delivery)");
        return NULL;
    }
    return lane_place((ProduceLaneObject *)op, args, 0);
}

static PyObject *lane_get_pending(ProduceLaneObject *self, void *unused) {
    return PyLong_FromLongLong(self->pending);
}

static int lane_set_pending(ProduceLaneObject *self, PyObject *value, void *unused) {
    int64_t n;
    if (value == NULL || as_int64(value, &n) < 0) {
        PyErr_SetString(PyExc_TypeError, "pending must be an int64");
        return -1;
    }
    self->pending = n;
    return 0;
}

static PyGetSetDef lane_getset[] = {
    {"pending", (getter)lane_get_pending, (setter)lane_set_pending,
     "the producer's records not delivered yet", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef lane_methods[] = {
    {"place", (PyCFunction)(void (*)(void))lane_place_method, METH_FASTCALL,
     "place(topic, value, key, partition, headers, timestamp, on_delivery) -> True, or None "
     "for the Python path (no handle is made)"},
    {"produce_without_handle", (PyCFunction)(void (*)(void))lane_produce_without_handle,
     METH_FASTCALL | METH_KEYWORDS,
     "produce_without_handle(topic, value=None, key=None, partition=None, headers=None, "
     "timestamp=None, on_delivery=None) -> None: produce() without its DeliveryHandle"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProduceLaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "highwater.records._codec.ProduceLane",
    .tp_basicsize = sizeof(ProduceLaneObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "ProduceLane(attrs, batch_type, queue_type, choice_type, handle_type, fallback): "
              "AsyncProducer.produce() with its common case in C",
    .tp_new = lane_new,
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_traverse = (traverseproc)lane_traverse,
    .tp_clear = (inquiry)lane_clear,
    .tp_vectorcall_offset = offsetof(ProduceLaneObject, vectorcall),
    .tp_methods = lane_methods,
    .tp_getset = lane_getset,
    .tp_call = PyVectorcall_Call,
};

/* ---------------------------------------------------------------------------------- */

/* bind(record_size=..., check_batch=..., header_type=..., append_info_type=...): the
 * reference functions the compiled ones hand over to, the BatchHeader type check_batch
 * returns, and the AppendInfo type stamp_batches returns (storage.log binds its own). */
static PyObject *codec_bind(PyObject *self, PyObject *args, PyObject *kwds) {
    PyObject *rs = NULL, *cb = NULL, *ht = NULL, *bt = NULL, *af = NULL, *ai = NULL;
    static char *kwlist[] = {"record_size", "check_batch", "header_type", "builder_type",
                             "append_fields", "append_info_type", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$OOO!O!OO!:bind", kwlist, &rs, &cb,
                                     &PyType_Type, &ht, &PyType_Type, &bt, &af, &PyType_Type,
                                     &ai))
        return NULL;
    if (ai != NULL) {
        /* stamp_batches fills its nine fields by position. */
        PyObject *fields = PyObject_GetAttrString(ai, "_fields");
        Py_ssize_t count = fields != NULL && PyTuple_Check(fields) ? PyTuple_GET_SIZE(fields) : -1;
        Py_XDECREF(fields);
        PyErr_Clear();
        if (!PyType_IsSubtype((PyTypeObject *)ai, &PyTuple_Type) || count != 9) {
            PyErr_SetString(PyExc_TypeError, "append_info_type must be a named tuple of 9 fields");
            return NULL;
        }
        Py_INCREF(ai);
        Py_XSETREF(append_info_type, (PyTypeObject *)ai);
    }
    if (bt != NULL) {
        Py_ssize_t offsets[B_SLOTS];
        for (int i = 0; i < B_SLOTS; i++) {
            PyObject *name = PyUnicode_FromString(builder_slot_names[i]);
            if (name == NULL) return NULL;
            int failed = slot_offset((PyTypeObject *)bt, name, &offsets[i]);
            Py_DECREF(name);
            if (failed) return NULL;
        }
        memcpy(builder_offsets, offsets, sizeof offsets);
        Py_INCREF(bt);
        Py_XSETREF(builder_type, (PyTypeObject *)bt);
    }
    if (af != NULL) {
        Py_INCREF(af);
        Py_XSETREF(fallback_append_fields, af);
    }
    if (ht != NULL && !PyType_IsSubtype((PyTypeObject *)ht, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "header_type must be a tuple type");
        return NULL;
    }
    if (rs != NULL) {
        Py_INCREF(rs);
        Py_XSETREF(fallback_record_size, rs);
    }
    if (cb != NULL) {
        Py_INCREF(cb);
        Py_XSETREF(fallback_check_batch, cb);
    }
    if (ht != NULL) {
        Py_INCREF(ht);
        Py_XSETREF(batch_header_type, (PyTypeObject *)ht);
    }
    Py_RETURN_NONE;
}

static int unbound(PyObject *f) {
    if (f == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "highwater.records._codec is used before bind()");
        return 1;
    }
    return 0;
}

static PyMethodDef codec_methods[] = {
    {"bind", (PyCFunction)(void (*)(void))codec_bind, METH_VARARGS | METH_KEYWORDS, "Bind the reference functions the compiled ones defer to."},
    {"record_size", (PyCFunction)(void (*)(void))codec_record_size, METH_FASTCALL,
     "record_size(offset_delta, timestamp_delta, key, value, headers=()) -> int"},
    {"append_fields", (PyCFunction)(void (*)(void))codec_append_fields, METH_FASTCALL,
     "append_fields(builder, fields) -> int: RecordBatchBuilder.append_fields"},
    {"encode_records", (PyCFunction)(void (*)(void))codec_encode_records, METH_FASTCALL,
     "encode_records(records, base_timestamp) -> bytes, or None to defer to the pure code"},
    {"read_records", (PyCFunction)(void (*)(void))codec_read_records, METH_FASTCALL,
     "read_records(...) -> (pos, decoded, previous_delta)"},
    {"plain_records", (PyCFunction)(void (*)(void))codec_plain_records, METH_FASTCALL,
     "plain_records(...) -> (wire, pos, decoded, previous_delta, added)"},
    {"scan_keys", (PyCFunction)(void (*)(void))codec_scan_keys, METH_FASTCALL,
     "scan_keys(...) -> (keys, pos, decoded, previous_delta)"},
    {"check_batch", (PyCFunction)(void (*)(void))codec_check_batch,
     METH_FASTCALL | METH_KEYWORDS, "check_batch(buf, pos=0, *, verify_crc=True) -> BatchHeader"},
    {"scan_batches", (PyCFunction)(void (*)(void))codec_scan_batches, METH_FASTCALL,
     "scan_batches(...) -> the walk of header.scan_batches, or None to defer to it"},
    {"map_keys", (PyCFunction)(void (*)(void))codec_map_keys, METH_FASTCALL,
     "map_keys(...) -> (decoded, pos): the cleaner's offset map step for one batch"},
    {"filter_records", (PyCFunction)(void (*)(void))codec_filter_records, METH_FASTCALL,
     "filter_records(...) -> the cleaner's pass over one batch's records, or None to defer"},
    {"check_records", (PyCFunction)(void (*)(void))codec_check_records, METH_FASTCALL,
     "check_records(buf, pos, end, count, last_offset_delta, base_timestamp) -> (low, high), "
     "or None to defer to the pure code"},
    {"stamp_batches", (PyCFunction)(void (*)(void))codec_stamp_batches, METH_FASTCALL,
     "stamp_batches(...) -> a leader append's checks and stamping, or None to defer"},
    {"write_stamped", (PyCFunction)(void (*)(void))codec_write_stamped, METH_FASTCALL,
     "write_stamped(fd, stamped, data) -> None: stamp_batches' result written, one writev"},
    {"crc32c", codec_crc32c, METH_O, "crc32c(data) -> int"},
    {"crc32c_by_path", codec_crc32c_by_path, METH_O, "crc32c_by_path(data) -> dict"},
    {"murmur2", codec_murmur2, METH_O, "murmur2(data) -> int (signed int32)"},
    {"encode_rows", (PyCFunction)(void (*)(void))codec_encode_rows, METH_FASTCALL,
     "encode_rows(keys, values, rows, start, max_bytes) -> (records, next)"},
    {"deliver_records", (PyCFunction)(void (*)(void))codec_deliver_records, METH_FASTCALL,
     "deliver_records(records, callbacks, make_message, offset, step, append_time, start) -> "
     "None, or (index, exception, message) of the first callback that raised"},
    {"binary_column", (PyCFunction)(void (*)(void))codec_binary_column, METH_FASTCALL,
     "binary_column(validity, offsets, data, length) -> the rows as bytes (None: null)"},
    {"partition_rows", (PyCFunction)(void (*)(void))codec_partition_rows, METH_FASTCALL,
     "partition_rows(keys, num_partitions) -> the rows of each partition, null keys last"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef codec_module = {
    PyModuleDef_HEAD_INIT, "_codec", "The compiled twin of the RecordBatch v2 hot paths.", -1,
    codec_methods,
};

PyMODINIT_FUNC PyInit__codec(void) {
    crc_init_tables();
#ifdef HW_CRC_X86
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2");
    if (crc_hw) {
        crc_shift_tables(crc_shift_long, CRC_LONG);
        crc_shift_tables(crc_shift_short, CRC_SHORT);
    }
    crc_fold_init();
#endif
    empty_tuple = PyTuple_New(0);
    if (empty_tuple == NULL) return NULL;
    if (PyType_Ready(&SlotFactoryType) < 0) return NULL;
    if (PyType_Ready(&RecordColumnsType) < 0) return NULL;
    if (PyType_Ready(&ProduceLaneType) < 0) return NULL;
    if (PyType_Ready(&RecordBufferType) < 0) return NULL;
    for (int i = 0; i < PA_COUNT; i++)
        if ((producer_attrs[i] = PyUnicode_InternFromString(producer_attr_names[i])) == NULL)
            return NULL;
    static const char *produce_arg_strings[7] = {"topic",   "value",     "key",        "partition",
                                                 "headers", "timestamp", "on_delivery"};
    for (int i = 0; i < 7; i++)
        if ((produce_arg_names[i] = PyUnicode_InternFromString(produce_arg_strings[i])) == NULL)
            return NULL;
    if ((s_num_partitions = PyUnicode_InternFromString("num_partitions")) == NULL ||
        (s_set = PyUnicode_InternFromString("set")) == NULL ||
        (s_on_produced = PyUnicode_InternFromString("on_produced")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&codec_module);
    if (m == NULL) return NULL;
    Py_INCREF(&SlotFactoryType);
    if (PyModule_AddObject(m, "SlotFactory", (PyObject *)&SlotFactoryType) < 0) {
        Py_DECREF(&SlotFactoryType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&RecordColumnsType);
    if (PyModule_AddObject(m, "RecordColumns", (PyObject *)&RecordColumnsType) < 0) {
        Py_DECREF(&RecordColumnsType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ProduceLaneType);
    if (PyModule_AddObject(m, "ProduceLane", (PyObject *)&ProduceLaneType) < 0) {
        Py_DECREF(&ProduceLaneType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&RecordBufferType);
    if (PyModule_AddObject(m, "RecordBuffer", (PyObject *)&RecordBufferType) < 0) {
        Py_DECREF(&RecordBufferType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
