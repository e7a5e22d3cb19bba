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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HW_CRC_X86 1
#endif

/* ---------------------------------------------------------------------------------- */
/* Module state: the reference functions and types the compiled ones hand over to.     */

static PyObject *fallback_record_size;  /* record.record_size (pure) */
static PyObject *fallback_check_batch;  /* header.check_batch (pure) */
static PyTypeObject *batch_header_type; /* header.BatchHeader */
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

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const uint8_t *p,
                                                             size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    /* Three independent streams hide the instruction's latency; they are combined by
     * running the first two over zeros... which costs as much as it saves for the
     * batch sizes here, so one stream of 8-byte words it is. */
    while (n >= 32) {
        uint64_t a, b, d, e;
        memcpy(&a, p, 8);
        memcpy(&b, p + 8, 8);
        memcpy(&d, p + 16, 8);
        memcpy(&e, p + 24, 8);
        c = _mm_crc32_u64(c, a);
        c = _mm_crc32_u64(c, b);
        c = _mm_crc32_u64(c, d);
        c = _mm_crc32_u64(c, e);
        p += 32;
        n -= 32;
    }
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
#endif

static uint32_t crc32c_of(const uint8_t *p, size_t n) {
#ifdef HW_CRC_X86
    if (crc_hw) return ~crc32c_hw(0xFFFFFFFFu, p, n);
#endif
    return ~crc32c_soft(0xFFFFFFFFu, p, n);
}

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

/* ``o`` as an int64; 0 if it is an int in range, -1 (no exception) otherwise. */
static int as_int64(PyObject *o, int64_t *out) {
    if (!PyLong_CheckExact(o) && !PyLong_Check(o)) return -1;
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

enum { B_BUILT, B_RECORDS, B_SIZES, B_SIZE, B_BASE_TS, B_MAX_TS, B_MAX_BYTES, B_SLOTS };
static const char *builder_slot_names[B_SLOTS] = {
    "_built", "_records", "_sizes", "_size", "_base_timestamp", "_max_timestamp", "_max_bytes"};
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

/* The builder's append when every value is one handled here: the size added (0: it does
 * not fit), -1 to hand over to the pure method (nothing changed), -2 on an error. */
static Py_ssize_t builder_append(PyObject *builder, PyObject *fields) {
    if (builder_type == NULL || !PyObject_TypeCheck(builder, builder_type)) return -1;
    if (!PyTuple_CheckExact(fields) || PyTuple_GET_SIZE(fields) != 4) return -1;
    PyObject *built = slot_get(builder, B_BUILT), *records = slot_get(builder, B_RECORDS);
    PyObject *sizes = slot_get(builder, B_SIZES), *size_obj = slot_get(builder, B_SIZE);
    PyObject *base_obj = slot_get(builder, B_BASE_TS), *max_obj = slot_get(builder, B_MAX_TS);
    PyObject *max_bytes_obj = slot_get(builder, B_MAX_BYTES);
    if (built != Py_None || records == NULL || !PyList_CheckExact(records) || sizes == NULL ||
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
    if (first || timestamp > max_ts) ts_value = PyLong_FromLongLong(timestamp);
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
        int64_t ts, delta;
        as_int64(PyTuple_GET_ITEM(r, 3), &ts);
        delta = ts - base_timestamp;
        /* The length is what record_size_of gave less its own varint. */
        Py_ssize_t size = record_size_of(i, delta, key, value, headers);
        Py_ssize_t body = size - 1;
        while (size_of_varint64(body) + body > size) body--;
        uint8_t *start = out;
        out = put_varint64(out, body);
        *out++ = 0; /* attributes */
        out = put_varint64(out, delta);
        out = put_varint64(out, i);
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

/* A new instance with the five fields (borrowed references) and the constants. */
static PyObject *factory_make(SlotFactoryObject *f, PyObject *const *fields) {
    PyObject *obj = f->cls->tp_alloc(f->cls, 0);
    if (obj == NULL) return NULL;
    for (int i = 0; i < FACTORY_FIELDS; i++) set_slot(obj, f->field_offsets[i], fields[i]);
    for (Py_ssize_t i = 0; i < f->nconstants; i++)
        set_slot(obj, f->constant_offsets[i], f->constant_values[i]);
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
    while (PyDict_Next(constants, &pos, &k, &v)) {
        Py_ssize_t i = f->nconstants;
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
    while (done < count && pos >= 0 && pos < end) {
        Py_ssize_t p = pos;
        int32_t length, delta, kn, vn;
        int64_t td, offset;
        if (get_varint(buf, &p, end, &length) < 0 || length < 6 || length > end - p) break;
        Py_ssize_t record_end = p + length;
        p += 1;
        if (get_varlong(buf, &p, record_end, &td) < 0) break;
        if (get_varint(buf, &p, record_end, &delta) < 0) break;
        if (delta <= previous || delta > last_delta ||
            __builtin_add_overflow(base_offset, (int64_t)delta, &offset))
            break;
        if (get_varint(buf, &p, record_end, &kn) < 0 || kn < -1 || kn > record_end - p) break;
        const uint8_t *key = buf + p;
        if (kn > 0) p += kn;
        if (get_varint(buf, &p, record_end, &vn) < 0 || vn < -1) break;
        /* The value, then at least one byte of header count, must fit. */
        if (p + (vn > 0 ? vn : 0) >= record_end) break;
        PyObject *k;
        if (kn == -1) {
            k = Py_None;
            Py_INCREF(k);
        } else if ((k = PyBytes_FromStringAndSize((const char *)key, kn)) == NULL) {
            goto finally;
        }
        PyObject *item = Py_BuildValue("(LNO)", (long long)offset, k,
                                       vn == -1 ? Py_True : Py_False);
        if (item == NULL) goto finally;
        int failed = PyList_Append(keys, item);
        Py_DECREF(item);
        if (failed) goto finally;
        previous = delta;
        pos = record_end;
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

/* scan_batches(buf, pos, end, next_offset, max_offset, max_batch_size, index_interval,
 *              since_index_entry, max_timestamp, offset_of_max_timestamp)
 *   -> (end, next_offset, max_timestamp, offset_of_max, since, index_entries, notable)
 * or None when an argument is out of the range handled here. The walk of
 * header.scan_batches, with a Python object only per index entry and notable batch. */
static PyObject *codec_scan_batches(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "scan_batches takes 10 arguments");
        return NULL;
    }
    int64_t v[9];
    for (int i = 0; i < 9; i++) {
        if (as_int64(args[i + 1], &v[i]) < 0) Py_RETURN_NONE;
    }
    int64_t pos = v[0], end = v[1], next_offset = v[2], max_offset = v[3];
    int64_t max_batch_size = v[4], interval = v[5], since = v[6], max_ts = v[7], offset_of_max = v[8];
    if (pos < 0 || batch_header_type == NULL) Py_RETURN_NONE;
    Bytes b;
    if (bytes_get(args[0], &b) < 0) Py_RETURN_NONE;
    if (end > b.n) end = b.n;
    PyObject *entries = PyList_New(0), *notable = PyList_New(0), *result = NULL;
    if (entries == NULL || notable == NULL) goto finally;
    int64_t valid = pos, epoch = -1;
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
            PyObject *entry = Py_BuildValue("(LLLL)", (long long)last_offset, (long long)valid,
                                            (long long)max_ts, (long long)offset_of_max);
            if (entry == NULL) goto finally;
            int failed = PyList_Append(entries, entry);
            Py_DECREF(entry);
            if (failed) goto finally;
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
    result = Py_BuildValue("(LLLLLOO)", (long long)valid, (long long)next_offset, (long long)max_ts,
                           (long long)offset_of_max, (long long)since, entries, notable);
finally:
    Py_XDECREF(entries);
    Py_XDECREF(notable);
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

/* ---------------------------------------------------------------------------------- */
/* murmur2: Kafka's Utils.murmur2 (MurmurHash2, seed 0x9747b28c) as a signed int32.     */

static PyObject *codec_murmur2(PyObject *self, PyObject *data) {
    Bytes b;
    if (bytes_get(data, &b) < 0) {
        PyErr_Format(PyExc_TypeError, "murmur2 needs bytes, not %.100s", Py_TYPE(data)->tp_name);
        return NULL;
    }
    const uint32_t m = 0x5BD1E995u;
    const uint8_t *p = b.p;
    Py_ssize_t length = b.n;
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
    bytes_release(&b);
    return PyLong_FromLong((int32_t)h);
}

/* ---------------------------------------------------------------------------------- */

/* bind(record_size=..., check_batch=..., header_type=...): the reference functions the
 * compiled ones hand over to, and the BatchHeader type check_batch returns. */
static PyObject *codec_bind(PyObject *self, PyObject *args, PyObject *kwds) {
    PyObject *rs = NULL, *cb = NULL, *ht = NULL, *bt = NULL, *af = NULL;
    static char *kwlist[] = {"record_size", "check_batch", "header_type", "builder_type",
                             "append_fields", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$OOO!O!O:bind", kwlist, &rs, &cb, &PyType_Type,
                                     &ht, &PyType_Type, &bt, &af))
        return NULL;
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
    {"crc32c", codec_crc32c, METH_O, "crc32c(data) -> int"},
    {"murmur2", codec_murmur2, METH_O, "murmur2(data) -> int (signed int32)"},
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
#endif
    empty_tuple = PyTuple_New(0);
    if (empty_tuple == NULL) return NULL;
    if (PyType_Ready(&SlotFactoryType) < 0) return NULL;
    PyObject *m = PyModule_Create(&codec_module);
    if (m == NULL) return NULL;
    Py_INCREF(&SlotFactoryType);
    if (PyModule_AddObject(m, "SlotFactory", (PyObject *)&SlotFactoryType) < 0) {
        Py_DECREF(&SlotFactoryType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
