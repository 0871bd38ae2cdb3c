/*
 * C accelerator for the equeue record format: the broker's record encoder and
 * transaction patch (equeue_broker/storage/log/record.py), its pull planner (index_runs) and
 * wire helpers (split_blob, varints), and the client's pull-reply decoders
 * (decode_frames for equeue_spark/client/records.py, decode_columns for
 * equeue_spark/client/columns.py).
 *
 * The record format is specified in equeue_proto/record.py (and the index entry
 * in the storage's queue_index.py); this file implements exactly the same
 * encoding, exports its layout constants (LAYOUT, asserted at import by
 * equeue_proto/accel.py), and tests/test_formats.py checks byte-for-byte
 * equality against the pure-Python encoder on generated batches. Why C: a
 * per-message Python loop costs about 1.5 us per message, four times a raw
 * page-cache write of a 1 KiB message. It lives in the contract package because
 * the client decodes the same frames the broker writes.
 *
 * CRC32C uses the SSE4.2 crc32 instruction when the CPU has it (checked at
 * import), else a slicing-by-8 table.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"

/* ---- little-endian stores ------------------------------------------------ */

static inline void put8(uint8_t *p, uint8_t v) { p[0] = v; }
static inline void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Layout constants. They mirror equeue_proto/record.py's HEADER / TRAILER and
 * the storage's queue_index.py ENTRY; the module exports them (LAYOUT) and the
 * Python side asserts them at import (equeue_proto/accel.py), so a change on one
 * side only fails loudly. */
#define HEADER_SIZE 56 /* length prefix + fixed body fields */
#define TRAILER_SIZE 8 /* crc u32 | length suffix u32 */
#define RECORD_VERSION 1
#define FLAG_HAS_KEY 1
#define FLAG_BATCH_END 2
#define FLAG_TXN 4     /* staged by a transaction: queue_offset holds its serial in the log */
#define FLAG_CONTROL 8 /* a transaction's commit or abort record (broker/storage/txn/txn_records.py) */
#define FLAG_DELAYED 16 /* with FLAG_TXN: a delayed record, queue_offset holds its due time (ms) */
/* Byte offsets of the fields in a frame, from its first byte. */
#define AT_BODY 4 /* the checksummed body starts after the length prefix */
#define AT_VERSION 4
#define AT_FLAGS 5
#define AT_QUEUE_ID 6
#define AT_QUEUE_OFFSET 8
#define AT_POSITION 16
#define AT_PRODUCER_MS 24
#define AT_STORE_MS 32
#define AT_TOPIC_LEN 40
#define AT_TAG_LEN 42
#define AT_RESERVED 43
#define AT_KEY_LEN 44
#define AT_HEADERS_LEN 48
#define AT_VALUE_LEN 52
/* The queue index entry (storage format, written beside each encoded record). */
#define ENTRY_SIZE 32
#define ENTRY_AT_SIZE 8
#define ENTRY_AT_TAG_HASH 12
#define ENTRY_AT_STORE_MS 16
#define ENTRY_AT_CRC 24    /* CRC-32C of the entry's first 24 bytes ... */
#define ENTRY_AT_FORMAT 28 /* ... when this u32 is ENTRY_FORMAT_CHECKED; both 0 in older entries */
#define ENTRY_FORMAT_CHECKED 1

/* The checksum trailer of a queue-index entry (queue_index.py): written last. */
static inline void seal_entry(uint8_t *e) {
    put32(e + ENTRY_AT_CRC, crc32c(e, ENTRY_AT_CRC));
    put32(e + ENTRY_AT_FORMAT, ENTRY_FORMAT_CHECKED);
}

/* A borrowed view of a bytes-like item: bytes directly, else the buffer protocol. */
typedef struct {
    const uint8_t *ptr;
    Py_ssize_t len;
    Py_buffer view;
    int has_view;
} item_t;

static int item_get(PyObject *obj, item_t *it, const char *what, Py_ssize_t i) {
    it->has_view = 0;
    if (PyBytes_CheckExact(obj)) {
        it->ptr = (const uint8_t *)PyBytes_AS_STRING(obj);
        it->len = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, &it->view, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "%s %zd must be bytes-like, got %s", what, i,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    it->has_view = 1;
    it->ptr = (const uint8_t *)it->view.buf;
    it->len = it->view.len;
    return 0;
}

static void item_release(item_t *it) {
    if (it->has_view) PyBuffer_Release(&it->view);
    it->has_view = 0;
}

/* Optional column: NULL (absent) or a fast sequence; returns -1 on error. */
static int column(PyObject *obj, PyObject **fast, Py_ssize_t need, const char *name) {
    *fast = NULL;
    if (obj == Py_None) return 0;
    *fast = PySequence_Fast(obj, name);
    if (*fast == NULL) return -1;
    if (PySequence_Fast_GET_SIZE(*fast) < need) {
        PyErr_Format(PyExc_ValueError, "column %s is shorter than values", name);
        return -1;
    }
    return 0;
}

static PyObject *encode_records(PyObject *self, PyObject *args) {
    Py_buffer out, index_out;
    long long position, first_offset, store_ms;
    const char *topic;
    Py_ssize_t topic_len, start, stop;
    int queue_id;
    PyObject *values_obj, *keys_obj, *tags_obj, *headers_obj, *stamps_obj;
    int extra_flags = 0, offset_step = 1; /* a transaction's staged records: FLAG_TXN, step 0 */
    PyObject *offsets_obj = Py_None; /* delayed records: each one's queue offset (its due time) */
    if (!PyArg_ParseTuple(args, "w*Ly#iLLOOOOOnnw*|iiO", &out, &position, &topic, &topic_len,
                          &queue_id, &first_offset, &store_ms, &values_obj, &keys_obj,
                          &tags_obj, &headers_obj, &stamps_obj, &start, &stop, &index_out,
                          &extra_flags, &offset_step, &offsets_obj))
        return NULL;

    PyObject *values = NULL, *keys = NULL, *tags = NULL, *headers = NULL, *stamps = NULL;
    PyObject *offsets = NULL;
    PyObject *result = NULL;
    values = PySequence_Fast(values_obj, "values must be a sequence");
    if (values == NULL) goto done;
    if (start < 0 || stop < start || stop > PySequence_Fast_GET_SIZE(values)) {
        PyErr_SetString(PyExc_ValueError, "bad start/stop");
        goto done;
    }
    if (column(keys_obj, &keys, stop, "keys") < 0 || column(tags_obj, &tags, stop, "tags") < 0 ||
        column(headers_obj, &headers, stop, "headers") < 0 ||
        column(stamps_obj, &stamps, stop, "timestamps_ms") < 0 ||
        column(offsets_obj, &offsets, stop, "offsets") < 0)
        goto done;
    if (index_out.len < (stop - start) * ENTRY_SIZE) {
        PyErr_SetString(PyExc_ValueError, "index buffer too small");
        goto done;
    }

    uint8_t *base = (uint8_t *)out.buf;
    uint8_t *entry = (uint8_t *)index_out.buf;
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = start; i < stop; i++) {
        item_t value, key, tag, hdrs;
        int have_key = 0;
        if (item_get(PySequence_Fast_GET_ITEM(values, i), &value, "value", i) < 0) goto done;
        key.len = 0; key.has_view = 0;
        tag.len = 0; tag.has_view = 0;
        hdrs.len = 0; hdrs.has_view = 0;
        if (keys != NULL && PySequence_Fast_GET_ITEM(keys, i) != Py_None) {
            if (item_get(PySequence_Fast_GET_ITEM(keys, i), &key, "key", i) < 0) goto fail_item;
            have_key = 1;
        }
        if (tags != NULL && item_get(PySequence_Fast_GET_ITEM(tags, i), &tag, "tag", i) < 0)
            goto fail_item;
        if (headers != NULL &&
            item_get(PySequence_Fast_GET_ITEM(headers, i), &hdrs, "headers", i) < 0)
            goto fail_item;
        long long producer_ms = store_ms;
        if (stamps != NULL) {
            producer_ms = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(stamps, i));
            if (producer_ms == -1 && PyErr_Occurred()) goto fail_item;
            if (producer_ms < 0) producer_ms = store_ms; /* none given (BROKER_TIME) */
        }
        if (tag.len > 255 || topic_len > 65535 || key.len > 0xFFFFFFFFLL ||
            value.len > 0xFFFFFFFFLL || hdrs.len > 0xFFFFFFFFLL) {
            PyErr_Format(PyExc_ValueError, "field too large in message %zd", i);
            goto fail_item;
        }
        Py_ssize_t body = HEADER_SIZE - 4 + topic_len + tag.len + key.len + hdrs.len + value.len;
        Py_ssize_t frame = body + 12;
        if (pos + frame > out.len) {
            PyErr_SetString(PyExc_ValueError, "output buffer too small");
            goto fail_item;
        }
        uint8_t *r = base + pos;
        uint8_t flags = (uint8_t)((have_key ? FLAG_HAS_KEY : 0) | (i == stop - 1 ? FLAG_BATCH_END : 0) |
                                  (extra_flags & (FLAG_TXN | FLAG_CONTROL | FLAG_DELAYED)));
        put32(r, (uint32_t)body);
        put8(r + AT_VERSION, RECORD_VERSION);
        put8(r + AT_FLAGS, flags);
        put16(r + AT_QUEUE_ID, (uint16_t)queue_id);
        long long queue_offset = first_offset + (i - start) * offset_step;
        if (offsets != NULL) {
            queue_offset = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(offsets, i));
            if (queue_offset == -1 && PyErr_Occurred()) goto fail_item;
        }
        put64(r + AT_QUEUE_OFFSET, (uint64_t)queue_offset);
        put64(r + AT_POSITION, (uint64_t)(position + pos));
        put64(r + AT_PRODUCER_MS, (uint64_t)producer_ms);
        put64(r + AT_STORE_MS, (uint64_t)store_ms);
        put16(r + AT_TOPIC_LEN, (uint16_t)topic_len);
        put8(r + AT_TAG_LEN, (uint8_t)tag.len);
        put8(r + AT_RESERVED, 0);
        put32(r + AT_KEY_LEN, (uint32_t)key.len);
        put32(r + AT_HEADERS_LEN, (uint32_t)hdrs.len);
        put32(r + AT_VALUE_LEN, (uint32_t)value.len);
        uint8_t *p = r + HEADER_SIZE;
        memcpy(p, topic, topic_len); p += topic_len;
        if (tag.len) { memcpy(p, tag.ptr, tag.len); p += tag.len; }
        if (key.len) { memcpy(p, key.ptr, key.len); p += key.len; }
        if (hdrs.len) { memcpy(p, hdrs.ptr, hdrs.len); p += hdrs.len; }
        memcpy(p, value.ptr, value.len); p += value.len;
        put32(p, crc32c(r + AT_BODY, (size_t)body));
        put32(p + 4, (uint32_t)body);

        uint8_t *e = entry + (i - start) * ENTRY_SIZE;
        put64(e, (uint64_t)(position + pos + 1));
        put32(e + ENTRY_AT_SIZE, (uint32_t)frame);
        put32(e + ENTRY_AT_TAG_HASH, tag.len ? crc32c(tag.ptr, (size_t)tag.len) : 0);
        put64(e + ENTRY_AT_STORE_MS, (uint64_t)store_ms);
        seal_entry(e);
        pos += frame;
        item_release(&value); item_release(&key); item_release(&tag); item_release(&hdrs);
        continue;
    fail_item:
        item_release(&value); item_release(&key); item_release(&tag); item_release(&hdrs);
        goto done;
    }
    result = PyLong_FromSsize_t(pos);
done:
    Py_XDECREF(values); Py_XDECREF(keys); Py_XDECREF(tags); Py_XDECREF(headers); Py_XDECREF(stamps);
    Py_XDECREF(offsets);
    PyBuffer_Release(&out);
    PyBuffer_Release(&index_out);
    return result;
}

static inline uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t get64(const uint8_t *p) {
    return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32);
}

/* 1 if the entry fails its checksum or has an unknown trailer; an entry whose
 * trailer is all zeros (written before checksums, or empty) is accepted. */
static inline int entry_damaged(const uint8_t *e) {
    uint32_t crc = get32(e + ENTRY_AT_CRC), format = get32(e + ENTRY_AT_FORMAT);
    if (format == ENTRY_FORMAT_CHECKED) return crc != crc32c(e, ENTRY_AT_CRC);
    return format != 0 || crc != 0;
}

/* patch_committed(src, entries, first_offset) -> bytearray | None
 * The records of ``src`` (frames back to back, as a read copies them out of
 * the log) as a pull reply carries them: each FLAG_TXN record gets its queue
 * offset (``first_offset`` + its index in ``src``) and the store time of its
 * index entry (``entries``, one per frame), and its checksum is adjusted by the
 * change (CRC-32C is affine), never recomputed: a record damaged in the log
 * still fails the client's check. None when ``src`` holds no FLAG_TXN record
 * (nothing to copy). The reference is broker/storage/log/record.py's
 * ``patch_committed_py``. */
static const uint8_t zeros[4096];

static PyObject *patch_committed(PyObject *self, PyObject *args) {
    Py_buffer src, entries;
    long long first_offset;
    if (!PyArg_ParseTuple(args, "y*y*L", &src, &entries, &first_offset)) return NULL;
    PyObject *result = NULL;
    const uint8_t *in = (const uint8_t *)src.buf;
    Py_ssize_t pos = 0, count = 0;
    int any = 0;
    while (pos < src.len) {
        if (pos + HEADER_SIZE + TRAILER_SIZE > src.len) goto bad;
        Py_ssize_t frame = (Py_ssize_t)get32(in + pos) + 12;
        if (frame < HEADER_SIZE + TRAILER_SIZE || pos + frame > src.len) goto bad;
        any |= in[pos + AT_FLAGS] & FLAG_TXN;
        pos += frame;
        count++;
    }
    if (!any) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    if (entries.len < count * ENTRY_SIZE) {
        PyErr_SetString(PyExc_ValueError, "fewer index entries than records");
        goto done;
    }
    result = PyByteArray_FromStringAndSize((const char *)in, src.len);
    if (result == NULL) goto done;
    uint8_t *out = (uint8_t *)PyByteArray_AS_STRING(result);
    pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint8_t *r = out + pos;
        uint32_t body = get32(r);
        pos += (Py_ssize_t)body + 12;
        if (!(r[AT_FLAGS] & FLAG_TXN)) continue;
        const uint8_t *e = (const uint8_t *)entries.buf + i * ENTRY_SIZE;
        uint8_t delta[AT_STORE_MS + 8 - AT_QUEUE_OFFSET];
        memset(delta, 0, sizeof delta);
        put64(delta, get64(r + AT_QUEUE_OFFSET) ^ (uint64_t)(first_offset + i));
        put64(delta + (AT_STORE_MS - AT_QUEUE_OFFSET),
              get64(r + AT_STORE_MS) ^ get64(e + ENTRY_AT_STORE_MS));
        uint32_t c = crc_raw(0, delta, sizeof delta);
        size_t after = (size_t)(AT_BODY + body) - (AT_STORE_MS + 8); /* body bytes after the delta */
        while (after) {
            size_t n = after < sizeof zeros ? after : sizeof zeros;
            c = crc_raw(c, zeros, n);
            after -= n;
        }
        put64(r + AT_QUEUE_OFFSET, (uint64_t)(first_offset + i));
        put64(r + AT_STORE_MS, get64(e + ENTRY_AT_STORE_MS));
        put32(r + AT_BODY + body, get32(r + AT_BODY + body) ^ c);
    }
    goto done;
bad:
    PyErr_Format(PyExc_ValueError, "record at byte %zd overruns the buffer", pos);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&entries);
    return result;
}

/* restamp_entries(entries, store_ms) -> None
 * Set the store time of every index entry in ``entries`` and re-seal each
 * (a commit stamps its staged records' entries with the commit's time). */
static PyObject *restamp_entries(PyObject *self, PyObject *args) {
    Py_buffer entries;
    long long store_ms;
    if (!PyArg_ParseTuple(args, "w*L", &entries, &store_ms)) return NULL;
    for (Py_ssize_t at = 0; at + ENTRY_SIZE <= entries.len; at += ENTRY_SIZE) {
        uint8_t *e = (uint8_t *)entries.buf + at;
        put64(e + ENTRY_AT_STORE_MS, (uint64_t)store_ms);
        seal_entry(e);
    }
    PyBuffer_Release(&entries);
    Py_RETURN_NONE;
}

/* measure_batch(values, keys, tags, headers, fixed) -> (total, max_frame, max_key, max_value)
 * Frame sizes of a batch in one C pass, raising TypeError for items that are
 * not bytes-like (None is allowed for keys). ``fixed`` is the per-record
 * overhead (framing + topic). */
static PyObject *measure_batch(PyObject *self, PyObject *args) {
    PyObject *values_obj, *keys_obj, *tags_obj, *headers_obj;
    Py_ssize_t fixed;
    if (!PyArg_ParseTuple(args, "OOOOn", &values_obj, &keys_obj, &tags_obj, &headers_obj, &fixed))
        return NULL;
    PyObject *values = NULL, *keys = NULL, *tags = NULL, *headers = NULL, *result = NULL;
    values = PySequence_Fast(values_obj, "values must be a sequence");
    if (values == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(values);
    if (column(keys_obj, &keys, n, "keys") < 0 || column(tags_obj, &tags, n, "tags") < 0 ||
        column(headers_obj, &headers, n, "headers") < 0)
        goto done;
    long long total = 0, max_frame = 0, max_key = 0, max_value = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        item_t it;
        long long frame = fixed;
        if (item_get(PySequence_Fast_GET_ITEM(values, i), &it, "value", i) < 0) goto done;
        frame += it.len;
        if (it.len > max_value) max_value = it.len;
        item_release(&it);
        if (keys != NULL && PySequence_Fast_GET_ITEM(keys, i) != Py_None) {
            if (item_get(PySequence_Fast_GET_ITEM(keys, i), &it, "key", i) < 0) goto done;
            frame += it.len;
            if (it.len > max_key) max_key = it.len;
            item_release(&it);
        }
        if (tags != NULL) {
            if (item_get(PySequence_Fast_GET_ITEM(tags, i), &it, "tag", i) < 0) goto done;
            frame += it.len;
            item_release(&it);
        }
        if (headers != NULL) {
            if (item_get(PySequence_Fast_GET_ITEM(headers, i), &it, "headers", i) < 0) goto done;
            frame += it.len;
            item_release(&it);
        }
        total += frame;
        if (frame > max_frame) max_frame = frame;
    }
    result = Py_BuildValue("LLLL", total, max_frame, max_key, max_value);
done:
    Py_XDECREF(values); Py_XDECREF(keys); Py_XDECREF(tags); Py_XDECREF(headers);
    return result;
}

/* Headers section (record.py): u16 count, then u16 key length, key (UTF-8),
 * u32 value length, value. Returns a tuple of (str, bytes) pairs. */
static PyObject *decode_headers_c(const uint8_t *p, Py_ssize_t len) {
    if (len == 0) return PyTuple_New(0);
    if (len < 2) goto bad;
    uint16_t count = get16(p);
    Py_ssize_t at = 2;
    PyObject *out = PyTuple_New(count);
    if (out == NULL) return NULL;
    for (uint16_t i = 0; i < count; i++) {
        if (at + 2 > len) { Py_DECREF(out); goto bad; }
        uint16_t klen = get16(p + at);
        at += 2;
        if (at + klen + 4 > len) { Py_DECREF(out); goto bad; }
        PyObject *key = PyUnicode_DecodeUTF8((const char *)p + at, klen, "strict");
        at += klen;
        uint32_t vlen = get32(p + at);
        at += 4;
        if (key == NULL || at + (Py_ssize_t)vlen > len) { Py_XDECREF(key); Py_DECREF(out); goto bad; }
        PyObject *pair = Py_BuildValue("(Ny#)", key, (const char *)p + at, (Py_ssize_t)vlen);
        at += vlen;
        if (pair == NULL) { Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, i, pair);
    }
    return out;
bad:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "malformed headers section");
    return NULL;
}

#define MESSAGE_FIELDS 11

/* decode_frames(records, cls, broker_id) -> list of cls instances
 * cls is a tuple subclass with 11 fields: (topic, queue_id, offset, key, value, tag,
 * headers, producer_ms, store_ms, position, broker_id) -- the client's Message.
 * Every frame's lengths and CRC32C are verified; a bad frame raises ValueError
 * naming its byte offset. Building the instances here, not in Python, is what
 * makes a decoded pull cheap. */
static PyObject *decode_frames(PyObject *self, PyObject *args) {
    Py_buffer in;
    PyTypeObject *cls;
    PyObject *broker_id;
    if (!PyArg_ParseTuple(args, "y*O!U", &in, &PyType_Type, &cls, &broker_id)) return NULL;
    if (!PyType_IsSubtype(cls, &PyTuple_Type)) {
        PyBuffer_Release(&in);
        PyErr_SetString(PyExc_TypeError, "cls must be a tuple subclass");
        return NULL;
    }
    const uint8_t *base = (const uint8_t *)in.buf;
    Py_ssize_t end = in.len, pos = 0;
    PyObject *out = PyList_New(0);
    PyObject *last_topic = NULL; /* frames of one pull share a topic: reuse the str */
    const uint8_t *last_topic_ptr = NULL;
    Py_ssize_t last_topic_len = -1;
    if (out == NULL) goto fail;
    while (pos < end) {
        if (pos + HEADER_SIZE + TRAILER_SIZE > end) {
            PyErr_Format(PyExc_ValueError, "truncated record at byte %zd", pos);
            goto fail;
        }
        const uint8_t *r = base + pos;
        uint32_t body = get32(r);
        if (body < HEADER_SIZE - 4 || pos + (Py_ssize_t)body + 12 > end) {
            PyErr_Format(PyExc_ValueError, "bad record length %u at byte %zd", body, pos);
            goto fail;
        }
        uint32_t crc = get32(r + AT_BODY + body), suffix = get32(r + AT_BODY + 4 + body);
        if (suffix != body || crc != crc32c(r + AT_BODY, body)) {
            PyErr_Format(PyExc_ValueError, "record at byte %zd fails its checksum", pos);
            goto fail;
        }
        uint8_t flags = r[5];
        uint16_t topic_len = get16(r + AT_TOPIC_LEN);
        uint8_t tag_len = r[42];
        uint32_t key_len = get32(r + AT_KEY_LEN), hdr_len = get32(r + AT_HEADERS_LEN), value_len = get32(r + AT_VALUE_LEN);
        if ((uint64_t)HEADER_SIZE - 4 + topic_len + tag_len + key_len + hdr_len + value_len != body) {
            PyErr_Format(PyExc_ValueError, "record at byte %zd has inconsistent lengths", pos);
            goto fail;
        }
        const uint8_t *p = r + HEADER_SIZE;
        if (last_topic == NULL || last_topic_len != topic_len ||
            memcmp(last_topic_ptr, p, topic_len) != 0) {
            Py_XDECREF(last_topic);
            last_topic = PyUnicode_DecodeUTF8((const char *)p, topic_len, "strict");
            if (last_topic == NULL) goto fail;
            last_topic_ptr = p;
            last_topic_len = topic_len;
        }
        p += topic_len;
        PyObject *item = cls->tp_alloc(cls, MESSAGE_FIELDS);
        if (item == NULL) goto fail;
        PyObject *fields[MESSAGE_FIELDS];
        fields[0] = last_topic;
        Py_INCREF(last_topic);
        fields[1] = PyLong_FromUnsignedLong(get16(r + AT_QUEUE_ID));
        fields[2] = PyLong_FromUnsignedLongLong(get64(r + AT_QUEUE_OFFSET));
        fields[5] = PyUnicode_DecodeUTF8((const char *)p, tag_len, "strict");
        p += tag_len;
        if (flags & FLAG_HAS_KEY) {
            fields[3] = PyBytes_FromStringAndSize((const char *)p, key_len);
        } else {
            fields[3] = Py_None;
            Py_INCREF(Py_None);
        }
        p += key_len;
        fields[6] = decode_headers_c(p, hdr_len);
        p += hdr_len;
        fields[4] = PyBytes_FromStringAndSize((const char *)p, value_len);
        fields[7] = PyLong_FromLongLong((long long)get64(r + AT_PRODUCER_MS));
        fields[8] = PyLong_FromLongLong((long long)get64(r + AT_STORE_MS));
        fields[9] = PyLong_FromUnsignedLongLong(get64(r + AT_POSITION));
        fields[10] = broker_id;
        Py_INCREF(broker_id);
        int ok = 1;
        for (int f = 0; f < MESSAGE_FIELDS; f++) {
            if (fields[f] == NULL) ok = 0;
            PyTuple_SET_ITEM(item, f, fields[f]); /* NULLs are fine: dealloc skips them */
        }
        if (!ok) {
            Py_DECREF(item);
            goto fail;
        }
        /* A message holds only str, int, bytes, None and its headers' (str, bytes)
         * pairs, and cls (a NamedTuple) has no __dict__: it can be in no cycle, so
         * the collector need never visit it. Tracked, a pull of 1,000 messages set
         * off collections that cost as much as the decode itself (issue 31). */
        PyObject_GC_UnTrack(item);
        int failed = PyList_Append(out, item);
        Py_DECREF(item);
        if (failed) goto fail;
        pos += (Py_ssize_t)body + 12;
    }
    Py_XDECREF(last_topic);
    PyBuffer_Release(&in);
    return out;
fail:
    Py_XDECREF(last_topic);
    Py_XDECREF(out);
    PyBuffer_Release(&in);
    return NULL;
}

/* ---- columnar decode ------------------------------------------------------ */

/* Strict UTF-8 check, the same acceptance as Python's "strict" decoder
 * (Unicode Table 3-7: no overlongs, no surrogates, nothing above U+10FFFF). */
static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) { /* ASCII fast path */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
        } else if (c < 0xC2) {
            return 0;
        } else if (c < 0xE0) {
            if (n - i < 2 || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c < 0xF0) {
            if (n - i < 3) return 0;
            uint8_t c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F)) return 0;
            i += 3;
        } else if (c < 0xF5) {
            if (n - i < 4) return 0;
            uint8_t c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* Output stores: the column buffers are little-endian whatever the host. */
static inline void out32(uint8_t *p, int32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, &v, 4);
#else
    put32(p, (uint32_t)v);
#endif
}
static inline void out64(uint8_t *p, int64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, &v, 8);
#else
    put64(p, (uint64_t)v);
#endif
}

#define MAX_BLOB 0x7FFFFFFFLL  /* Arrow (non-large) offsets are int32 */
#define US_PER_MS 1000LL

/* Totals of one pull reply, from the validating first pass. */
typedef struct {
    Py_ssize_t n, key_nulls;
    long long topics, keys, values, tags, headers, header_keys, header_values;
} col_sizes_t;

/* Walk a headers section (layout in record.py), adding to the totals. The
 * section must parse exactly; returns NULL or why it does not. */
static const char *scan_headers(const uint8_t *p, uint32_t len, col_sizes_t *sz) {
    if (len == 0) return NULL;
    if (len < 2) return "malformed headers section";
    uint16_t count = get16(p);
    uint64_t at = 2;
    for (uint16_t i = 0; i < count; i++) {
        if (at + 2 > len) return "malformed headers section";
        uint16_t klen = get16(p + at);
        at += 2;
        if (at + klen + 4 > len) return "malformed headers section";
        if (!utf8_valid(p + at, klen)) return "header key is not valid UTF-8";
        at += klen;
        uint32_t vlen = get32(p + at);
        at += 4;
        if (at + vlen > len) return "malformed headers section";
        at += vlen;
        sz->header_keys += klen;
        sz->header_values += vlen;
    }
    if (at != len) return "malformed headers section";
    sz->headers += count;
    return NULL;
}

/* First pass: validate every frame exactly as record.check_frame does, plus
 * the version, the field lengths, UTF-8 of topic / tag / header keys, the
 * headers layout and the timestamp range; sum the column sizes. Raises
 * ValueError (damaged data) or OverflowError (a value the columns cannot
 * hold), naming the record's byte position. */
static int scan_columns(const uint8_t *base, Py_ssize_t end, Py_ssize_t at, col_sizes_t *sz) {
    const uint8_t *good_topic = NULL; /* a pull shares one topic: check it once */
    uint16_t good_topic_len = 0;
    Py_ssize_t pos = 0;
    while (pos < end) {
        const uint8_t *r = base + pos;
        if (end - pos < HEADER_SIZE) {
            PyErr_Format(PyExc_ValueError,
                         "record at byte %zd: frame header runs past the end of the data", at + pos);
            return -1;
        }
        uint32_t body = get32(r);
        if (body == 0) {
            PyErr_Format(PyExc_ValueError,
                         "record at byte %zd: zero length (end of written data)", at + pos);
            return -1;
        }
        if (body < HEADER_SIZE - 4 || (long long)body + 12 > (long long)(end - pos)) {
            PyErr_Format(PyExc_ValueError, "record at byte %zd: bad length %u", at + pos, body);
            return -1;
        }
        uint32_t crc = get32(r + AT_BODY + body), suffix = get32(r + AT_BODY + 4 + body);
        if (suffix != body) {
            PyErr_Format(PyExc_ValueError,
                         "record at byte %zd: length suffix %u does not match prefix %u", at + pos,
                         suffix, body);
            return -1;
        }
        if (crc != crc32c(r + AT_BODY, body)) {
            PyErr_Format(PyExc_ValueError, "record at byte %zd: checksum mismatch", at + pos);
            return -1;
        }
        if (r[4] != RECORD_VERSION) {
            PyErr_Format(PyExc_ValueError, "record at byte %zd: unsupported record version %u",
                         at + pos, (unsigned)r[4]);
            return -1;
        }
        uint16_t topic_len = get16(r + AT_TOPIC_LEN);
        uint8_t tag_len = r[42];
        uint32_t key_len = get32(r + AT_KEY_LEN), hdr_len = get32(r + AT_HEADERS_LEN), value_len = get32(r + AT_VALUE_LEN);
        if ((uint64_t)HEADER_SIZE - 4 + topic_len + tag_len + key_len + hdr_len + value_len !=
            body) {
            PyErr_Format(PyExc_ValueError,
                         "record at byte %zd: field lengths do not add up to the body length",
                         at + pos);
            return -1;
        }
        int64_t producer_ms = (int64_t)get64(r + AT_PRODUCER_MS);
        if (producer_ms > INT64_MAX / US_PER_MS || producer_ms < INT64_MIN / US_PER_MS) {
            PyErr_Format(PyExc_OverflowError,
                         "record at byte %zd: producer timestamp %lld ms is out of range "
                         "for microseconds",
                         at + pos, (long long)producer_ms);
            return -1;
        }
        int64_t store_ms = (int64_t)get64(r + AT_STORE_MS);
        if (store_ms > INT64_MAX / US_PER_MS || store_ms < INT64_MIN / US_PER_MS) {
            PyErr_Format(PyExc_OverflowError,
                         "record at byte %zd: store timestamp %lld ms is out of range "
                         "for microseconds",
                         at + pos, (long long)store_ms);
            return -1;
        }
        const uint8_t *p = r + HEADER_SIZE;
        if (good_topic == NULL || topic_len != good_topic_len ||
            memcmp(good_topic, p, topic_len) != 0) {
            if (!utf8_valid(p, topic_len)) {
                PyErr_Format(PyExc_ValueError, "record at byte %zd: topic is not valid UTF-8",
                             at + pos);
                return -1;
            }
            good_topic = p;
            good_topic_len = topic_len;
        }
        p += topic_len;
        if (!utf8_valid(p, tag_len)) {
            PyErr_Format(PyExc_ValueError, "record at byte %zd: tag is not valid UTF-8", at + pos);
            return -1;
        }
        p += tag_len + key_len;
        const char *why = scan_headers(p, hdr_len, sz);
        if (why != NULL) {
            PyErr_Format(PyExc_ValueError, "record at byte %zd: %s", at + pos, why);
            return -1;
        }
        sz->topics += topic_len;
        sz->tags += tag_len;
        sz->values += value_len;
        if (r[5] & FLAG_HAS_KEY)
            sz->keys += key_len;
        else
            sz->key_nulls++;
        sz->n++;
        pos += (Py_ssize_t)body + 12;
    }
    return 0;
}

static int check_blob(const char *name, long long size) {
    if (size <= MAX_BLOB) return 0;
    PyErr_Format(PyExc_OverflowError,
                 "records too large for 32-bit offsets: %s total %lld bytes", name, size);
    return -1;
}

enum {
    C_COUNT, C_TOPIC_OFFSETS, C_TOPICS, C_QUEUE_IDS, C_OFFSETS, C_TIMESTAMPS_US,
    C_KEY_OFFSETS, C_KEYS, C_KEY_VALIDITY, C_KEY_NULLS, C_VALUE_OFFSETS, C_VALUES,
    C_TAG_OFFSETS, C_TAGS, C_ID_OFFSETS, C_IDS, C_HEADER_LIST_OFFSETS,
    C_HEADER_KEY_OFFSETS, C_HEADER_KEYS, C_HEADER_VALUE_OFFSETS, C_HEADER_VALUES,
    C_STORE_TIMESTAMPS_US,
    C_FIELDS
};

static const char hex_digits[] = "0123456789abcdef";

/* decode_columns(records, broker_id, want_headers) -> tuple of C_FIELDS items
 * (records: a buffer, or a list of buffers read as their concatenation):
 * the columns of client/columns.py's RecordColumns (Arrow buffer layout, all
 * little-endian). Two passes: scan_columns validates and sizes, then every
 * buffer is allocated once at its final size and filled; no Python object is
 * created per record. */
static PyObject *decode_columns(PyObject *self, PyObject *args) {
    PyObject *records_obj, *broker_obj;
    int want_headers;
    if (!PyArg_ParseTuple(args, "OUp", &records_obj, &broker_obj, &want_headers)) return NULL;
    PyObject *items[C_FIELDS] = {NULL};
    PyObject *result = NULL;
    /* records: one buffer, or a list of buffers decoded as if concatenated
     * (a task's gathered replies, without joining them first). */
    PyObject *seq = NULL;
    Py_buffer *pieces = NULL;
    Py_ssize_t n_pieces = 0, held = 0;
    if (PyList_Check(records_obj)) {
        seq = records_obj;
        Py_INCREF(seq);
        n_pieces = PyList_GET_SIZE(seq);
    } else {
        n_pieces = 1;
    }
    pieces = PyMem_Calloc((size_t)(n_pieces > 0 ? n_pieces : 1), sizeof(Py_buffer));
    if (pieces == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < n_pieces; held++) {
        PyObject *item = seq != NULL ? PyList_GET_ITEM(seq, held) : records_obj;
        if (PyObject_GetBuffer(item, &pieces[held], PyBUF_SIMPLE) < 0) goto done;
    }
    Py_ssize_t broker_len;
    const char *broker = PyUnicode_AsUTF8AndSize(broker_obj, &broker_len);
    if (broker == NULL) goto done;
    col_sizes_t sz;
    memset(&sz, 0, sizeof sz);
    Py_ssize_t at = 0;
    for (Py_ssize_t k = 0; k < n_pieces; k++) {
        if (scan_columns((const uint8_t *)pieces[k].buf, pieces[k].len, at, &sz) < 0) goto done;
        at += pieces[k].len;
    }
    Py_ssize_t n = sz.n;
    long long id_len = (long long)broker_len + 1 + 16;
    if (check_blob("topics", sz.topics) < 0 || check_blob("keys", sz.keys) < 0 ||
        check_blob("values", sz.values) < 0 || check_blob("tags", sz.tags) < 0 ||
        check_blob("ids", id_len * n) < 0)
        goto done;
    if (want_headers &&
        (check_blob("header keys", sz.header_keys) < 0 ||
         check_blob("header values", sz.header_values) < 0))
        goto done;
    if (want_headers && sz.headers > MAX_BLOB) { /* list offsets count headers */
        PyErr_Format(PyExc_OverflowError, "records too large for 32-bit offsets: %lld headers",
                     sz.headers);
        goto done;
    }

#define ALLOC(slot, size)                                                          \
    do {                                                                           \
        items[slot] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(size));         \
        if (items[slot] == NULL) goto done;                                        \
    } while (0)
#define BUF(slot) ((uint8_t *)PyBytes_AS_STRING(items[slot]))
    Py_ssize_t offsets_size = 4 * (n + 1);
    ALLOC(C_TOPIC_OFFSETS, offsets_size);
    ALLOC(C_TOPICS, sz.topics);
    ALLOC(C_QUEUE_IDS, 4 * n);
    ALLOC(C_OFFSETS, 8 * n);
    ALLOC(C_TIMESTAMPS_US, 8 * n);
    ALLOC(C_STORE_TIMESTAMPS_US, 8 * n);
    ALLOC(C_KEY_OFFSETS, offsets_size);
    ALLOC(C_KEYS, sz.keys);
    ALLOC(C_VALUE_OFFSETS, offsets_size);
    ALLOC(C_VALUES, sz.values);
    ALLOC(C_TAG_OFFSETS, offsets_size);
    ALLOC(C_TAGS, sz.tags);
    ALLOC(C_ID_OFFSETS, offsets_size);
    ALLOC(C_IDS, id_len * n);
    if (want_headers) {
        ALLOC(C_HEADER_LIST_OFFSETS, offsets_size);
        ALLOC(C_HEADER_KEY_OFFSETS, 4 * (sz.headers + 1));
        ALLOC(C_HEADER_KEYS, sz.header_keys);
        ALLOC(C_HEADER_VALUE_OFFSETS, 4 * (sz.headers + 1));
        ALLOC(C_HEADER_VALUES, sz.header_values);
    } else {
        ALLOC(C_HEADER_LIST_OFFSETS, 0);
        ALLOC(C_HEADER_KEY_OFFSETS, 0);
        ALLOC(C_HEADER_KEYS, 0);
        ALLOC(C_HEADER_VALUE_OFFSETS, 0);
        ALLOC(C_HEADER_VALUES, 0);
    }
    uint8_t *validity = NULL;
    if (sz.key_nulls > 0) {
        ALLOC(C_KEY_VALIDITY, (n + 7) / 8);
        validity = BUF(C_KEY_VALIDITY);
        memset(validity, 0, (size_t)(n + 7) / 8);
    } else {
        items[C_KEY_VALIDITY] = Py_None;
        Py_INCREF(Py_None);
    }
    items[C_COUNT] = PyLong_FromSsize_t(n);
    items[C_KEY_NULLS] = PyLong_FromSsize_t(sz.key_nulls);
    if (items[C_COUNT] == NULL || items[C_KEY_NULLS] == NULL) goto done;

    uint8_t *topic_off = BUF(C_TOPIC_OFFSETS), *topics = BUF(C_TOPICS);
    uint8_t *queue_ids = BUF(C_QUEUE_IDS), *offsets = BUF(C_OFFSETS);
    uint8_t *stamps = BUF(C_TIMESTAMPS_US), *store_stamps = BUF(C_STORE_TIMESTAMPS_US);
    uint8_t *key_off = BUF(C_KEY_OFFSETS), *keys = BUF(C_KEYS);
    uint8_t *value_off = BUF(C_VALUE_OFFSETS), *values = BUF(C_VALUES);
    uint8_t *tag_off = BUF(C_TAG_OFFSETS), *tags = BUF(C_TAGS);
    uint8_t *id_off = BUF(C_ID_OFFSETS), *ids = BUF(C_IDS);
    uint8_t *hl_off = BUF(C_HEADER_LIST_OFFSETS);
    uint8_t *hk_off = BUF(C_HEADER_KEY_OFFSETS), *hkeys = BUF(C_HEADER_KEYS);
    uint8_t *hv_off = BUF(C_HEADER_VALUE_OFFSETS), *hvalues = BUF(C_HEADER_VALUES);
#undef BUF
#undef ALLOC
    /* Running ends of each blob; all fit in int32 (checked above). */
    int32_t topic_at = 0, key_at = 0, value_at = 0, tag_at = 0, id_at = 0;
    int32_t header_at = 0, hkey_at = 0, hvalue_at = 0;
    out32(topic_off, 0);
    out32(key_off, 0);
    out32(value_off, 0);
    out32(tag_off, 0);
    out32(id_off, 0);
    if (want_headers) {
        out32(hl_off, 0);
        out32(hk_off, 0);
        out32(hv_off, 0);
    }
    Py_ssize_t i = 0;
    for (Py_ssize_t k = 0; k < n_pieces; k++) {
      const uint8_t *base = (const uint8_t *)pieces[k].buf;
      for (Py_ssize_t pos = 0; pos < pieces[k].len; i++) { /* sizes validated by the scan */
        const uint8_t *r = base + pos;
        uint32_t body = get32(r);
        uint16_t topic_len = get16(r + AT_TOPIC_LEN);
        uint8_t tag_len = r[42];
        uint32_t key_len = get32(r + AT_KEY_LEN), hdr_len = get32(r + AT_HEADERS_LEN), value_len = get32(r + AT_VALUE_LEN);
        const uint8_t *p = r + HEADER_SIZE;

        out32(queue_ids + 4 * i, (int32_t)get16(r + AT_QUEUE_ID));
        out64(offsets + 8 * i, (int64_t)get64(r + AT_QUEUE_OFFSET));
        out64(stamps + 8 * i, (int64_t)get64(r + AT_PRODUCER_MS) * US_PER_MS); /* range checked */
        out64(store_stamps + 8 * i, (int64_t)get64(r + AT_STORE_MS) * US_PER_MS); /* ditto */

        memcpy(topics + topic_at, p, topic_len);
        topic_at += topic_len;
        out32(topic_off + 4 * (i + 1), topic_at);
        p += topic_len;

        memcpy(tags + tag_at, p, tag_len);
        tag_at += tag_len;
        out32(tag_off + 4 * (i + 1), tag_at);
        p += tag_len;

        if (r[5] & FLAG_HAS_KEY) {
            memcpy(keys + key_at, p, key_len);
            key_at += (int32_t)key_len;
            if (validity != NULL) validity[i >> 3] |= (uint8_t)(1u << (i & 7));
        }
        out32(key_off + 4 * (i + 1), key_at);
        p += key_len;

        if (want_headers) {
            if (hdr_len != 0) { /* layout validated by scan_headers */
                uint16_t count = get16(p);
                const uint8_t *h = p + 2;
                for (uint16_t k = 0; k < count; k++) {
                    uint16_t klen = get16(h);
                    memcpy(hkeys + hkey_at, h + 2, klen);
                    hkey_at += klen;
                    h += 2 + klen;
                    uint32_t vlen = get32(h);
                    memcpy(hvalues + hvalue_at, h + 4, vlen);
                    hvalue_at += (int32_t)vlen;
                    h += 4 + vlen;
                    header_at++;
                    out32(hk_off + 4 * header_at, hkey_at);
                    out32(hv_off + 4 * header_at, hvalue_at);
                }
            }
            out32(hl_off + 4 * (i + 1), header_at);
        }
        p += hdr_len;

        memcpy(values + value_at, p, value_len);
        value_at += (int32_t)value_len;
        out32(value_off + 4 * (i + 1), value_at);

        /* format_message_id: "<broker_id>-<position as 16 lowercase hex digits>" */
        uint8_t *id = ids + id_at;
        memcpy(id, broker, (size_t)broker_len);
        id += broker_len;
        *id++ = '-';
        uint64_t position = get64(r + AT_POSITION);
        for (int d = 15; d >= 0; d--) {
            id[d] = (uint8_t)hex_digits[position & 0xF];
            position >>= 4;
        }
        id_at += (int32_t)id_len;
        out32(id_off + 4 * (i + 1), id_at);

        pos += (Py_ssize_t)body + 12;
      }
    }

    result = PyTuple_New(C_FIELDS);
    if (result == NULL) goto done;
    for (int f = 0; f < C_FIELDS; f++) {
        PyTuple_SET_ITEM(result, f, items[f]); /* steals */
        items[f] = NULL;
    }
done:
    for (int f = 0; f < C_FIELDS; f++) Py_XDECREF(items[f]);
    for (Py_ssize_t k = 0; k < held; k++) PyBuffer_Release(&pieces[k]);
    PyMem_Free(pieces);
    Py_XDECREF(seq);
    return result;
}

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    uint32_t c = crc32c((const uint8_t *)data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(c);
}

/* murmur2(data) -> int: Kafka's Utils.murmur2 (seed 0x9747b28c), as a signed
 * 32-bit int like Java's. Key routing (equeue_proto.protocol.key_queue) hashes
 * every keyed message with it; protocol.murmur2_py is the reference. */
static PyObject *py_murmur2(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    const uint8_t *p = (const uint8_t *)data.buf;
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)data.len;
    Py_ssize_t tail = data.len & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < tail; i += 4) {
        uint32_t k = get32(p + i) * m;
        k ^= k >> 24;
        k *= m;
        h = (h * m) ^ k;
    }
    switch (data.len & 3) {
    case 3: h ^= (uint32_t)p[tail + 2] << 16; /* fall through */
    case 2: h ^= (uint32_t)p[tail + 1] << 8;  /* fall through */
    case 1: h ^= p[tail]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    PyBuffer_Release(&data);
    return PyLong_FromLong((long)(int32_t)h);
}

static int append_run(PyObject *runs, long long start, long long end, Py_ssize_t first) {
    PyObject *run = Py_BuildValue("(LLn)", start, end, first);
    if (run == NULL) return -1;
    int rc = PyList_Append(runs, run);
    Py_DECREF(run);
    return rc;
}

/* check_frames(buffer, start, end, position=-1) -> int
 *
 * -1 if the frames of buffer[start:end] are valid (lengths, suffixes and
 * checksums) and tile it exactly, else the offset of the first invalid one.
 * With ``position`` >= 0 (the log position of buffer[start]) a frame must also
 * name its own position (a replica places a master's bytes: replicated.py).
 * The broker verifies sealed log data with it on the way out (reads.py);
 * mirrors equeue_proto.record.check_frames_py. The GIL is released: the
 * caller keeps the buffer alive (the store lock keeps the log mapped). */
static PyObject *check_frames(PyObject *self, PyObject *args) {
    Py_buffer in;
    Py_ssize_t start, end;
    long long position = -1;
    if (!PyArg_ParseTuple(args, "y*nn|L", &in, &start, &end, &position)) return NULL;
    if (start < 0 || end > in.len || start > end) {
        PyBuffer_Release(&in);
        PyErr_Format(PyExc_ValueError, "range [%zd, %zd) outside the buffer", start, end);
        return NULL;
    }
    const uint8_t *b = (const uint8_t *)in.buf;
    Py_ssize_t pos = start, bad = -1;
    Py_BEGIN_ALLOW_THREADS
    while (pos < end) {
        if (end - pos < HEADER_SIZE) {
            bad = pos;
            break;
        }
        uint32_t body = get32(b + pos);
        if (body < HEADER_SIZE - AT_BODY || (Py_ssize_t)body + 12 > end - pos) {
            bad = pos;
            break;
        }
        const uint8_t *t = b + pos + AT_BODY + body;
        if (get32(t + 4) != body || get32(t) != crc32c(b + pos + AT_BODY, body) ||
            (position >= 0 && get64(b + pos + AT_POSITION) != (uint64_t)(position + (pos - start)))) {
            bad = pos;
            break;
        }
        pos += (Py_ssize_t)body + 12;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    return PyLong_FromSsize_t(bad);
}

/* index_segments(buffer, start, end, position) -> [(at, count, topic, queue_id, first_offset, entries)]
 *
 * The index entries of the records of buffer[start:end] (whole frames that
 * already passed check_frames; buffer[start] lies at log ``position``), as
 * recovery derives them one record at a time (index_repair.entry_for): one
 * tuple per run of plain records of one queue with consecutive offsets, its
 * ``count`` entries packed and sealed in ``entries``. A transaction's staged or
 * control record gets (at, 0, b"", 0, 0, b""): the caller reads it itself.
 * A replica derives a whole reply's entries with one call (replicated.py).
 * Mirrors queue_index.index_segments_py, the Python reference. */
static int segment_flush(PyObject *out, Py_ssize_t at, Py_ssize_t count, const uint8_t *topic,
                         Py_ssize_t topic_len, long queue_id, uint64_t first, const uint8_t *entries) {
    PyObject *item = Py_BuildValue("(nny#lKy#)", at, count, (const char *)topic, topic_len, queue_id,
                                   (unsigned long long)first, (const char *)entries,
                                   count * ENTRY_SIZE);
    if (item == NULL) return -1;
    int rc = PyList_Append(out, item);
    Py_DECREF(item);
    return rc;
}

static PyObject *index_segments(PyObject *self, PyObject *args) {
    Py_buffer in;
    Py_ssize_t start, end;
    long long position;
    if (!PyArg_ParseTuple(args, "y*nnL", &in, &start, &end, &position)) return NULL;
    PyObject *out = NULL;
    uint8_t *entries = NULL;
    if (start < 0 || end > in.len || start > end) {
        PyErr_Format(PyExc_ValueError, "range [%zd, %zd) outside the buffer", start, end);
        goto fail;
    }
    /* At most one entry per minimal frame: enough room for any run. */
    entries = PyMem_Malloc((size_t)((end - start) / (HEADER_SIZE + TRAILER_SIZE) + 1) * ENTRY_SIZE);
    out = PyList_New(0);
    if (entries == NULL || out == NULL) {
        if (entries == NULL) PyErr_NoMemory();
        goto fail;
    }
    const uint8_t *b = (const uint8_t *)in.buf;
    Py_ssize_t pos = start, run_at = 0, count = 0, topic_len = 0;
    const uint8_t *topic = NULL;
    long queue_id = 0;
    uint64_t first = 0;
    while (pos < end) {
        const uint8_t *r = b + pos;
        if (end - pos < HEADER_SIZE + TRAILER_SIZE) goto overrun;
        Py_ssize_t frame = (Py_ssize_t)get32(r) + 12;
        Py_ssize_t t_len = get16(r + AT_TOPIC_LEN), g_len = r[AT_TAG_LEN];
        if (frame < HEADER_SIZE + TRAILER_SIZE || frame > end - pos ||
            HEADER_SIZE + t_len + g_len > frame - TRAILER_SIZE)
            goto overrun;
        uint64_t offset = get64(r + AT_QUEUE_OFFSET);
        long qid = get16(r + AT_QUEUE_ID);
        int special = r[AT_FLAGS] & (FLAG_TXN | FLAG_CONTROL);
        int same = count && !special && qid == queue_id && t_len == topic_len &&
                   offset == first + (uint64_t)count && memcmp(r + HEADER_SIZE, topic, (size_t)t_len) == 0;
        if (count && !same) {
            if (segment_flush(out, run_at, count, topic, topic_len, queue_id, first, entries) < 0)
                goto fail;
            count = 0;
        }
        if (special) {
            if (segment_flush(out, pos, 0, (const uint8_t *)"", 0, 0, 0, entries) < 0) goto fail;
            pos += frame;
            continue;
        }
        if (!count) {
            run_at = pos, topic = r + HEADER_SIZE, topic_len = t_len, queue_id = qid, first = offset;
        }
        uint8_t *e = entries + count * ENTRY_SIZE;
        memset(e, 0, ENTRY_SIZE);
        put64(e, (uint64_t)(position + (pos - start)) + 1);
        put32(e + ENTRY_AT_SIZE, (uint32_t)frame);
        put32(e + ENTRY_AT_TAG_HASH, g_len ? crc32c(r + HEADER_SIZE + t_len, (size_t)g_len) : 0);
        memcpy(e + ENTRY_AT_STORE_MS, r + AT_STORE_MS, 8);
        seal_entry(e);
        count++;
        pos += frame;
    }
    if (count && segment_flush(out, run_at, count, topic, topic_len, queue_id, first, entries) < 0)
        goto fail;
    PyMem_Free(entries);
    PyBuffer_Release(&in);
    return out;
overrun:
    PyErr_Format(PyExc_ValueError, "record at byte %zd overruns the buffer", pos);
fail:
    Py_XDECREF(out);
    PyMem_Free(entries);
    PyBuffer_Release(&in);
    return NULL;
}

/* index_runs(entries, capacity, max_messages, max_bytes, count, total)
 *     -> (runs, taken, count, total, stop)
 *
 * The planning half of an unfiltered pull, over raw queue-index entries (the
 * 32-byte format of queue_index.py: u64 position + 1, u32 record size, ...).
 * Entries are taken in order until `count` reaches max_messages or the next
 * record would push `total` past max_bytes (the first record of a read is
 * always taken). Records that lie back to back in one log chunk form a run:
 * runs is a list of (start, end, first entry), and a pull copies each run
 * with one slice. stop is 0 when every entry was taken, 1 at a limit, 2 at
 * an empty entry (position 0: a hole the caller reports as corruption) and 3
 * at an entry that fails its checksum (the caller rebuilds it from the log).
 * Mirrors queue_index.index_runs, the Python reference. */
static PyObject *index_runs(PyObject *self, PyObject *args) {
    Py_buffer in;
    long long capacity, max_messages, max_bytes, count, total;
    if (!PyArg_ParseTuple(args, "y*LLLLL", &in, &capacity, &max_messages, &max_bytes, &count,
                          &total))
        return NULL;
    if (capacity <= 0) {
        PyBuffer_Release(&in);
        PyErr_Format(PyExc_ValueError, "capacity must be positive, not %lld", capacity);
        return NULL;
    }
    const uint8_t *base = (const uint8_t *)in.buf;
    Py_ssize_t n = in.len / 32, i = 0;
    long long run_start = -1, run_end = -1;
    Py_ssize_t run_first = 0;
    int stop = 0;
    PyObject *runs = PyList_New(0);
    if (runs == NULL) goto fail;
    for (; i < n; i++) {
        if (count >= max_messages) {
            stop = 1;
            break;
        }
        const uint8_t *e = base + i * ENTRY_SIZE;
        if (entry_damaged(e)) {
            stop = 3;
            break;
        }
        uint64_t position_plus_one = get64(e);
        long long size = (long long)get32(e + ENTRY_AT_SIZE);
        if (position_plus_one == 0) {
            stop = 2;
            break;
        }
        if (count > 0 && total + size > max_bytes) {
            stop = 1;
            break;
        }
        long long position = (long long)(position_plus_one - 1);
        if (position != run_end || position % capacity == 0) {
            if (run_end > run_start && append_run(runs, run_start, run_end, run_first) < 0)
                goto fail;
            run_start = run_end = position;
            run_first = i;
        }
        run_end += size;
        count++;
        total += size;
    }
    if (run_end > run_start && append_run(runs, run_start, run_end, run_first) < 0) goto fail;
    PyBuffer_Release(&in);
    return Py_BuildValue("(NnLLi)", runs, i, count, total, stop);
fail:
    Py_XDECREF(runs);
    PyBuffer_Release(&in);
    return NULL;
}


/* split_blob(blob, lengths) -> [bytes]: the pieces of a produce request's
 * column blob (values or keys) as bytes objects, one per length. bytes, not
 * memoryview slices: a slice is a GC-tracked object holding the blob, a small
 * copy is cheaper than both at message sizes. ValueError (with the numbers)
 * if a length is negative or the lengths do not add up to the blob's size;
 * nothing is built then. */
static PyObject *split_blob(PyObject *self, PyObject *args) {
    Py_buffer blob;
    PyObject *lengths_obj;
    if (!PyArg_ParseTuple(args, "y*O", &blob, &lengths_obj)) return NULL;
    PyObject *lengths = PySequence_Fast(lengths_obj, "lengths must be a sequence");
    PyObject *out = NULL;
    if (lengths == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(lengths);
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long len = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(lengths, i));
        if (len == -1 && PyErr_Occurred()) goto done;
        if (len < 0) {
            PyErr_Format(PyExc_ValueError, "length %zd is %lld", i, len);
            goto done;
        }
        if (len > (long long)1 << 40) { /* keeps the sum from overflowing */
            PyErr_Format(PyExc_ValueError, "length %zd is %lld", i, len);
            goto done;
        }
        total += len;
    }
    if (total != (long long)blob.len) {
        PyErr_Format(PyExc_ValueError, "lengths sum to %lld but the blob has %zd bytes", total,
                     blob.len);
        goto done;
    }
    out = PyList_New(n);
    if (out == NULL) goto done;
    const char *at = (const char *)blob.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len = (Py_ssize_t)PyLong_AsLongLong(PySequence_Fast_GET_ITEM(lengths, i));
        PyObject *piece = PyBytes_FromStringAndSize(at, len);
        if (piece == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, piece);
        at += len;
    }
done:
    Py_XDECREF(lengths);
    PyBuffer_Release(&blob);
    return out;
}

/* varints(values, count, stride, add, step) -> bytes: the payload of a packed
 * repeated int64 protobuf field whose element i is
 * values[i * stride] + add + i * step (values: int64s, native order). One
 * function covers a reply's columns: stride 0 repeats one value (the queue
 * of a single-queue batch), step 1 counts up (its offsets), stride 4 walks
 * index entries (their positions, add -1). Negative results take ten bytes,
 * as protobuf encodes them. */
static PyObject *varints(PyObject *self, PyObject *args) {
    Py_buffer in;
    Py_ssize_t count, stride;
    long long add, step;
    if (!PyArg_ParseTuple(args, "y*nnLL", &in, &count, &stride, &add, &step)) return NULL;
    PyObject *out = NULL;
    Py_ssize_t words = in.len / 8;
    if (count < 0 || stride < 0 || (count > 0 && (count - 1) * stride >= words)) {
        PyErr_Format(PyExc_ValueError, "%zd values of stride %zd do not fit in %zd int64s",
                     count, stride, words);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, count * 10);
    if (out == NULL) goto done;
    uint8_t *w = (uint8_t *)PyBytes_AS_STRING(out), *start = w;
    const uint8_t *base = (const uint8_t *)in.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t v;
        memcpy(&v, base + 8 * i * stride, 8);
        uint64_t u = (uint64_t)v + (uint64_t)add + (uint64_t)i * (uint64_t)step;
        while (u > 0x7F) {
            *w++ = (uint8_t)((u & 0x7F) | 0x80);
            u >>= 7;
        }
        *w++ = (uint8_t)u;
    }
    if (_PyBytes_Resize(&out, w - start) < 0) out = NULL;
done:
    PyBuffer_Release(&in);
    return out;
}

/* timer_entries(dues, targets, topic_id, cancel, first, count, dirty, flushing, heads, slots)
 * -> bytearray: the timer log entries (broker/equeue_broker/storage/timer/wheel.py) of
 * delayed records of one topic, each chained to its slot's head (dirty, then flushing,
 * then the wheel map ``heads``; a head at or below ``first`` is none), which it becomes
 * in ``dirty``: entry numbers count from ``count``. Wheel._entries is the reference. */
static PyObject *timer_entries(PyObject *self, PyObject *args) {
    PyObject *dues_obj, *targets_obj, *dirty, *flushing, *heads_obj;
    unsigned int topic_id;
    int cancel;
    long long first, count, slots;
    if (!PyArg_ParseTuple(args, "OOIpLLO!O!OL", &dues_obj, &targets_obj, &topic_id, &cancel,
                          &first, &count, &PyDict_Type, &dirty, &PyDict_Type, &flushing,
                          &heads_obj, &slots))
        return NULL;
    if (slots <= 0) {
        PyErr_SetString(PyExc_ValueError, "slots must be positive");
        return NULL;
    }
    PyObject *dues = NULL, *targets = NULL, *out = NULL, *result = NULL;
    Py_buffer heads;
    if (PyObject_GetBuffer(heads_obj, &heads, PyBUF_SIMPLE) < 0) return NULL;
    dues = PySequence_Fast(dues_obj, "dues must be a sequence");
    if (dues == NULL) goto done;
    targets = PySequence_Fast(targets_obj, "targets must be a sequence");
    if (targets == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(dues);
    if (PySequence_Fast_GET_SIZE(targets) != n) {
        PyErr_SetString(PyExc_ValueError, "dues and targets differ in length");
        goto done;
    }
    out = PyByteArray_FromStringAndSize(NULL, n * 32);
    if (out == NULL) goto done;
    uint8_t *o = (uint8_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++, o += 32) {
        long long due = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(dues, i));
        if (due == -1 && PyErr_Occurred()) goto done;
        long long target = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(targets, i));
        if (target == -1 && PyErr_Occurred()) goto done;
        if (due < 0 || target < 0) {
            PyErr_SetString(PyExc_ValueError, "negative due time or position");
            goto done;
        }
        long long slot = (due / 1000) % slots;
        if ((slot + 1) * 8 > (long long)heads.len) {
            PyErr_SetString(PyExc_ValueError, "heads shorter than the slots");
            goto done;
        }
        PyObject *key = PyLong_FromLongLong(slot);
        if (key == NULL) goto done;
        PyObject *known = PyDict_GetItemWithError(dirty, key);
        if (known == NULL && !PyErr_Occurred()) known = PyDict_GetItemWithError(flushing, key);
        if (known == NULL && PyErr_Occurred()) { Py_DECREF(key); goto done; }
        unsigned long long prev;
        if (known != NULL) {
            prev = PyLong_AsUnsignedLongLong(known);
            if (prev == (unsigned long long)-1 && PyErr_Occurred()) { Py_DECREF(key); goto done; }
        } else {
            prev = get64((const uint8_t *)heads.buf + slot * 8);
        }
        if ((long long)prev <= first) prev = 0;
        put64(o, (uint64_t)due);
        put64(o + 8, (uint64_t)target | (cancel ? (1ULL << 63) : 0));
        put64(o + 16, (uint64_t)prev);
        put32(o + 24, (uint32_t)topic_id);
        put32(o + 28, crc32c(o, 28));
        count++;
        PyObject *number = PyLong_FromLongLong(count);
        int failed = number == NULL || PyDict_SetItem(dirty, key, number) < 0;
        Py_XDECREF(number);
        Py_DECREF(key);
        if (failed) goto done;
    }
    result = out;
    out = NULL;
done:
    Py_XDECREF(dues); Py_XDECREF(targets); Py_XDECREF(out);
    PyBuffer_Release(&heads);
    return result;
}

/* ---- filter expressions: select_frames -------------------------------------- */

/* select_frames(program, buffer, max_frames) -> ([(start, end, first, count)], scanned)
 *
 * Runs a filter expression's compiled program (equeue_proto/selector.py,
 * "the compiled program": postfix, tri-state values) over the first
 * ``max_frames`` frames of ``buffer`` (whole frames back to back, as a read's
 * run of the log) in place: the fixed fields, tag, key and headers are read
 * where they lie, nothing is decoded into Python objects. Answers the spans of
 * consecutive frames for which the expression is TRUE and how many frames it
 * inspected. Mirrors equeue_proto.selection.select_frames_py (which evaluates
 * the expression's tree with selector.evaluate); a property test holds them
 * equal. ValueError for a malformed program or a frame that runs past the
 * buffer. The GIL is released while frames are evaluated: the caller keeps
 * the buffer alive (the store lock keeps the log mapped). */

enum { SOP_END, SOP_CONST, SOP_CMP, SOP_IN, SOP_ISNULL, SOP_NOT, SOP_AND, SOP_OR };
enum { SF_TAG = 1, SF_KEY, SF_KEYS, SF_TS, SF_STORE_TS, SF_HEADER };
enum { ST_STR = 1, ST_BYTES, ST_NUM, ST_BOOL };
enum { SC_EQ = 1, SC_NE, SC_LT, SC_LE, SC_GT, SC_GE };
enum { SV_NULL, SV_BYTES, SV_INT, SV_FLOAT, SV_BOOL };
#define S_FALSE 0
#define S_TRUE 1
#define S_UNKNOWN 2
#define S_MAX_EXTRA_KEYS 32 /* equeue_proto/message_keys.py MAX_EXTRA_KEYS */
#define S_MAX_STACK 1024

typedef struct {
    int kind; /* SV_* */
    const uint8_t *p;
    size_t n;
    int64_t i; /* SV_INT, SV_BOOL */
    double f;  /* SV_FLOAT */
    char text[24]; /* a timestamp's decimal text */
} sval_t;

typedef struct {
    const uint8_t *tag, *key, *hdr;
    uint32_t tag_len, key_len, hdr_len;
    int has_key;
    int64_t producer_ms, store_ms;
} sframe_t;

/* Skip one literal code at p (end: program end); NULL if malformed. */
static const uint8_t *slit_skip(const uint8_t *p, const uint8_t *end) {
    if (p >= end) return NULL;
    switch (*p) {
    case 0: return p + 1;
    case 1:
        if (end - p < 5) return NULL;
        if ((size_t)(end - p - 5) < get32(p + 1)) return NULL;
        return p + 5 + get32(p + 1);
    case 2: case 3: return end - p < 9 ? NULL : p + 9;
    case 4: return end - p < 2 ? NULL : p + 2;
    default: return NULL;
    }
}

static const uint8_t *soperand_skip(const uint8_t *p, const uint8_t *end) {
    if (p >= end) return NULL;
    if (*p == 0) return p + 1;
    if (*p == 1) return slit_skip(p + 1, end);
    if (*p == 2) {
        if (end - p < 4 || p[1] < SF_TAG || p[1] > SF_HEADER) return NULL;
        uint16_t n = get16(p + 2);
        return end - p - 4 < n ? NULL : p + 4 + n;
    }
    return NULL;
}

#define SIN_NEGATED 1
#define SIN_SORTED 2 /* items sorted, distinct, one kind; a u32 offset table before them */

/* The literal kind (slit code) a value converted to `type` has; 0 is NULL. A
 * literal of another kind would make scompare read a value it does not hold. */
static int slit_kind_ok(uint8_t kind, int type) {
    if (kind == 0) return 1;
    switch (type) {
    case ST_STR: case ST_BYTES: return kind == 1;
    case ST_NUM: return kind == 2 || kind == 3;
    default: return kind == 4;
    }
}

static int soperand_kind_ok(const uint8_t *p, const uint8_t *end, int type) {
    if (p >= end || *p != 1) return 1; /* NULL, a field (soperand_skip checks it) */
    return p + 1 < end && slit_kind_ok(p[1], type);
}

static int scompare(const sval_t *a, const sval_t *b);
static const uint8_t *slit_read(const uint8_t *p, sval_t *v);

/* Check an IN list's `count` items at p (after its offset table if sorted:
 * each offset must name its item, the items ascending, none NULL, all of one
 * kind); returns the list's end, NULL if bad. */
static const uint8_t *sin_items_valid(const uint8_t *p, const uint8_t *end, int type,
                                      uint16_t count, int sorted) {
    const uint8_t *offs = p;
    if (sorted) {
        if ((size_t)(end - p) < 4u * count) return NULL;
        p += 4u * count;
    }
    const uint8_t *items = p;
    sval_t prev = {0};
    for (uint16_t i = 0; i < count; i++) {
        if (p >= end || !slit_kind_ok(*p, type)) return NULL;
        const uint8_t *at = p;
        if ((p = slit_skip(p, end)) == NULL) return NULL;
        if (!sorted) continue;
        sval_t v;
        slit_read(at, &v);
        if (get32(offs + 4u * i) != (uint32_t)(at - items) || v.kind == SV_NULL) return NULL;
        if (i && (v.kind != prev.kind || scompare(&prev, &v) >= 0)) return NULL;
        prev = v;
    }
    return p;
}

/* Check a program's structure once (every read in bounds, the stack never
 * under- or overflows, one value left at END); 0 if bad. */
static int sprogram_valid(const uint8_t *p, size_t len) {
    const uint8_t *end = p + len;
    long depth = 0;
    while (p < end) {
        uint8_t op = *p++;
        switch (op) {
        case SOP_END: return depth == 1 && p == end;
        case SOP_CONST: if (p >= end) return 0; p++; depth++; break;
        case SOP_CMP: {
            if (end - p < 2 || p[0] < SC_EQ || p[0] > SC_GE || p[1] < ST_STR || p[1] > ST_BOOL)
                return 0;
            int type = p[1];
            p += 2;
            for (int side = 0; side < 2; side++) {
                if (!soperand_kind_ok(p, end, type)) return 0;
                if ((p = soperand_skip(p, end)) == NULL) return 0;
            }
            depth++;
            break;
        }
        case SOP_IN: {
            if (end - p < 2 || p[0] < ST_STR || p[0] > ST_BOOL || p[1] > (SIN_NEGATED | SIN_SORTED))
                return 0;
            int type = p[0], sorted = p[1] & SIN_SORTED;
            p += 2;
            if (!soperand_kind_ok(p, end, type)) return 0;
            if ((p = soperand_skip(p, end)) == NULL || end - p < 2) return 0;
            uint16_t count = get16(p);
            p += 2;
            if ((p = sin_items_valid(p, end, type, count, sorted)) == NULL) return 0;
            depth++;
            break;
        }
        case SOP_ISNULL:
            if (p >= end) return 0;
            if ((p = soperand_skip(p + 1, end)) == NULL) return 0;
            depth++;
            break;
        case SOP_NOT: if (depth < 1) return 0; break;
        case SOP_AND: case SOP_OR: {
            if (end - p < 2) return 0;
            uint16_t n = get16(p);
            p += 2;
            if (n < 1 || depth < n) return 0;
            depth -= n - 1;
            break;
        }
        default: return 0;
        }
        if (depth > S_MAX_STACK) return 0;
    }
    return 0;
}

/* A literal code as a value; returns the code's end. */
static const uint8_t *slit_read(const uint8_t *p, sval_t *v) {
    v->kind = SV_NULL;
    switch (*p) {
    case 1: v->kind = SV_BYTES; v->n = get32(p + 1); v->p = p + 5; return p + 5 + v->n;
    case 2: v->kind = SV_INT; v->i = (int64_t)get64(p + 1); return p + 9;
    case 3: { uint64_t bits = get64(p + 1); v->kind = SV_FLOAT; memcpy(&v->f, &bits, 8); return p + 9; }
    case 4: v->kind = SV_BOOL; v->i = p[1]; return p + 2;
    default: return p + 1;
    }
}

/* The last header called name (as Message.header reads it); 0 if absent. */
static int sheader(const sframe_t *f, const uint8_t *name, size_t name_len, const uint8_t **out,
                   size_t *out_len) {
    const uint8_t *h = f->hdr;
    uint64_t end = f->hdr_len, pos = 2;
    int found = 0;
    if (end < 2) return 0;
    uint16_t count = get16(h);
    for (uint32_t i = 0; i < count; i++) {
        if (pos + 2 > end) return found;
        uint64_t klen = get16(h + pos);
        pos += 2;
        uint64_t kend = pos + klen;
        if (kend + 4 > end) return found;
        uint64_t vlen = get32(h + kend), vat = kend + 4;
        if (vat + vlen > end) return found;
        if (klen == name_len && memcmp(h + pos, name, name_len) == 0) {
            *out = h + vat;
            *out_len = (size_t)vlen;
            found = 1;
        }
        pos = vat + vlen;
    }
    return found;
}

/* A decimal number as selector.to_number reads it: -?D+(.D+)?([eE][+-]?D+)?,
 * an int64 when written without . or e in at most 20 characters and in range,
 * else a double; anything else NULL. */
static void snumber(const uint8_t *s, size_t n, sval_t *v) {
    v->kind = SV_NULL;
    if (n == 0 || n > 400) return;
    size_t i = 0;
    int is_int = 1;
    if (s[i] == '-') i++;
    size_t digits = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    if (i == digits) return;
    if (i < n && s[i] == '.') {
        is_int = 0;
        size_t frac = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == frac) return;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        is_int = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t exp = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == exp) return;
    }
    if (i != n) return;
    if (is_int && n <= 20) {
        int neg = s[0] == '-';
        uint64_t acc = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        int over = 0;
        for (size_t k = (size_t)neg; k < n; k++) {
            uint64_t d = (uint64_t)(s[k] - '0');
            if (acc > (limit - d) / 10) { over = 1; break; }
            acc = acc * 10 + d;
        }
        if (!over) {
            v->kind = SV_INT;
            v->i = neg ? (acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc) : (int64_t)acc;
            return;
        }
    }
    char buf[401];
    memcpy(buf, s, n);
    buf[n] = 0;
    v->kind = SV_FLOAT;
    v->f = strtod(buf, NULL);
}

static int sascii_ieq(const uint8_t *s, size_t n, const char *word) {
    size_t w = strlen(word);
    if (n != w) return 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c >= 'A' && c <= 'Z') c = (uint8_t)(c + 32);
        if (c != (uint8_t)word[i]) return 0;
    }
    return 1;
}

/* Bytes (or NULL: p == NULL) converted to a comparison type (selector.convert). */
static void sconvert(const uint8_t *p, size_t n, int type, sval_t *v) {
    v->kind = SV_NULL;
    if (p == NULL) return;
    switch (type) {
    case ST_BYTES: v->kind = SV_BYTES; v->p = p; v->n = n; return;
    case ST_STR:
        if (utf8_valid(p, n)) { v->kind = SV_BYTES; v->p = p; v->n = n; }
        return;
    case ST_BOOL:
        if (sascii_ieq(p, n, "true")) { v->kind = SV_BOOL; v->i = 1; }
        else if (sascii_ieq(p, n, "false")) { v->kind = SV_BOOL; v->i = 0; }
        return;
    default: snumber(p, n, v); return;
    }
}

/* An operand's value for a comparison of `type`; returns the operand's end. */
static const uint8_t *soperand(const uint8_t *p, const sframe_t *f, int type, sval_t *v) {
    v->kind = SV_NULL;
    if (*p == 0) return p + 1;
    if (*p == 1) return slit_read(p + 1, v);
    uint8_t kind = p[1];
    uint16_t name_len = get16(p + 2);
    const uint8_t *name = p + 4;
    const uint8_t *raw = NULL;
    size_t raw_len = 0;
    switch (kind) {
    case SF_TAG: if (f->tag_len) { raw = f->tag; raw_len = f->tag_len; } break;
    case SF_KEY: if (f->has_key) { raw = f->key; raw_len = f->key_len; } break;
    case SF_TS: case SF_STORE_TS: {
        int64_t ms = kind == SF_TS ? f->producer_ms : f->store_ms;
        if (type == ST_NUM) { v->kind = SV_INT; v->i = ms; return name + name_len; }
        int w = snprintf(v->text, sizeof v->text, "%lld", (long long)ms);
        sconvert((const uint8_t *)v->text, (size_t)w, type, v);
        return name + name_len;
    }
    case SF_HEADER: sheader(f, name, name_len, &raw, &raw_len); break;
    default: break; /* SF_KEYS is handled by its callers */
    }
    sconvert(raw, raw_len, type, v);
    return name + name_len;
}

/* 0 if a == b, <0 or >0 otherwise; both non-NULL, converted to the same type. */
static int scompare(const sval_t *a, const sval_t *b) {
    if (a->kind == SV_BYTES) {
        size_t n = a->n < b->n ? a->n : b->n;
        int c = n ? memcmp(a->p, b->p, n) : 0;
        if (c) return c;
        return a->n < b->n ? -1 : a->n > b->n;
    }
    if ((a->kind == SV_INT || a->kind == SV_BOOL) && (b->kind == SV_INT || b->kind == SV_BOOL))
        return a->i < b->i ? -1 : a->i > b->i;
    double x = a->kind == SV_FLOAT ? a->f : (double)a->i;
    double y = b->kind == SV_FLOAT ? b->f : (double)b->i;
    return x < y ? -1 : x > y;
}

static int sapply(int op, int c) {
    switch (op) {
    case SC_EQ: return c == 0;
    case SC_NE: return c != 0;
    case SC_LT: return c < 0;
    case SC_LE: return c <= 0;
    case SC_GT: return c > 0;
    default: return c >= 0;
    }
}

static int sis_keys(const uint8_t *operand) { return operand[0] == 2 && operand[1] == SF_KEYS; }

/* The i-th key of a frame (its key, then the extra keys of the keys header,
 * empty parts skipped, at most S_MAX_EXTRA_KEYS: message_keys.split_keys);
 * 0 when there is none. */
typedef struct {
    const sframe_t *f;
    int key_done, extra;
    const uint8_t *h;
    size_t h_len, at;
    int has_h;
} skeys_t;

static void skeys_start(skeys_t *k, const sframe_t *f) {
    k->f = f;
    k->key_done = 0;
    k->extra = 0;
    k->at = 0;
    k->has_h = sheader(f, (const uint8_t *)"keys", 4, &k->h, &k->h_len);
}

static int skeys_next(skeys_t *k, const uint8_t **p, size_t *n) {
    if (!k->key_done) {
        k->key_done = 1;
        if (k->f->has_key) { *p = k->f->key; *n = k->f->key_len; return 1; }
    }
    if (!k->has_h) return 0;
    while (k->at < k->h_len && k->extra < S_MAX_EXTRA_KEYS) {
        size_t start = k->at;
        while (k->at < k->h_len && k->h[k->at] != ' ') k->at++;
        size_t stop = k->at;
        if (k->at < k->h_len) k->at++; /* the separator */
        if (stop > start) {
            k->extra++;
            *p = k->h + start;
            *n = stop - start;
            return 1;
        }
    }
    return 0;
}

/* An IN list: `count` literal codes at `items`; if `offs`, they are sorted
 * and offs holds each one's u32 offset from `items` (SIN_SORTED). */
typedef struct {
    const uint8_t *items, *offs;
    int count;
} slist_t;

/* 1 if x (not NULL) equals an item of the list: a binary search if sorted
 * (so a long list costs log2(count) comparisons a record), else a scan. */
static int slist_has(const slist_t *l, const sval_t *x) {
    sval_t w;
    if (l->offs != NULL) {
        int lo = 0, hi = l->count;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            slit_read(l->items + get32(l->offs + 4u * (unsigned)mid), &w);
            int c = scompare(x, &w);
            if (c == 0) return 1;
            if (c < 0) hi = mid; else lo = mid + 1;
        }
        return 0;
    }
    const uint8_t *r = l->items;
    for (int i = 0; i < l->count; i++) {
        r = slit_read(r, &w);
        if (w.kind != SV_NULL && scompare(x, &w) == 0) return 1;
    }
    return 0;
}

/* TRUE if any key of the frame equals one of the list's items (converted to
 * `type`); UNKNOWN if no key converts. */
static int skeys_match(const sframe_t *f, int type, const slist_t *list, const sval_t *single) {
    skeys_t k;
    skeys_start(&k, f);
    const uint8_t *p;
    size_t n;
    int any = 0;
    while (skeys_next(&k, &p, &n)) {
        sval_t v;
        sconvert(p, n, type, &v);
        if (v.kind == SV_NULL) continue;
        any = 1;
        if (single != NULL) {
            if (scompare(&v, single) == 0) return S_TRUE;
            continue;
        }
        if (slist_has(list, &v)) return S_TRUE;
    }
    return any ? S_FALSE : S_UNKNOWN;
}

static int snegate(int t) { return t == S_UNKNOWN ? S_UNKNOWN : 1 - t; }

/* The expression's truth value over one frame (the program is valid). */
static int seval(const uint8_t *p, const uint8_t *pend, const sframe_t *f) {
    uint8_t stack[S_MAX_STACK];
    int sp = 0;
    for (;;) {
        uint8_t op = *p++;
        switch (op) {
        case SOP_END: return stack[0];
        case SOP_CONST: stack[sp++] = *p++ ? S_TRUE : S_FALSE; break;
        case SOP_CMP: {
            int cmp = p[0], type = p[1];
            const uint8_t *a_at = p + 2;
            const uint8_t *b_at = soperand_skip(a_at, pend);
            const uint8_t *after = soperand_skip(b_at, pend);
            int result;
            if (sis_keys(a_at) || sis_keys(b_at)) {
                sval_t wanted;
                soperand(sis_keys(a_at) ? b_at : a_at, f, type, &wanted);
                if (wanted.kind == SV_NULL) {
                    result = S_UNKNOWN;
                } else {
                    int found = skeys_match(f, type, NULL, &wanted);
                    result = cmp == SC_EQ ? found : snegate(found);
                }
            } else {
                sval_t a, b;
                soperand(a_at, f, type, &a);
                soperand(b_at, f, type, &b);
                if (a.kind == SV_NULL || b.kind == SV_NULL)
                    result = S_UNKNOWN;
                else
                    result = sapply(cmp, scompare(&a, &b)) ? S_TRUE : S_FALSE;
            }
            stack[sp++] = (uint8_t)result;
            p = after;
            break;
        }
        case SOP_IN: {
            int type = p[0], negated = p[1] & SIN_NEGATED;
            const uint8_t *x_at = p + 2;
            const uint8_t *q = soperand_skip(x_at, pend);
            slist_t list = {q + 2, NULL, get16(q)};
            if (p[1] & SIN_SORTED) {
                list.offs = list.items;
                list.items += 4u * (unsigned)list.count;
            }
            const uint8_t *after = list.items;
            if (list.offs != NULL && list.count) /* O(1): past the last item */
                after = slit_skip(list.items + get32(list.offs + 4u * (unsigned)(list.count - 1)), pend);
            else
                for (int i = 0; i < list.count; i++) after = slit_skip(after, pend);
            int found;
            if (sis_keys(x_at)) {
                found = skeys_match(f, type, &list, NULL);
            } else {
                sval_t x;
                soperand(x_at, f, type, &x);
                found = x.kind == SV_NULL ? -1 : slist_has(&list, &x) ? S_TRUE : S_FALSE;
            }
            int result = found < 0 ? S_UNKNOWN : negated ? snegate(found) : found;
            stack[sp++] = (uint8_t)result;
            p = after;
            break;
        }
        case SOP_ISNULL: {
            int negated = p[0];
            const uint8_t *x_at = p + 1;
            int missing;
            if (sis_keys(x_at)) {
                skeys_t k;
                const uint8_t *kp;
                size_t kn;
                skeys_start(&k, f);
                missing = !skeys_next(&k, &kp, &kn);
            } else {
                sval_t x;
                soperand(x_at, f, ST_BYTES, &x);
                missing = x.kind == SV_NULL;
            }
            stack[sp++] = missing != negated ? S_TRUE : S_FALSE;
            p = soperand_skip(x_at, pend);
            break;
        }
        case SOP_NOT: stack[sp - 1] = (uint8_t)snegate(stack[sp - 1]); break;
        case SOP_AND: case SOP_OR: {
            int n = get16(p);
            p += 2;
            int result = op == SOP_AND ? S_TRUE : S_FALSE;
            int decisive = op == SOP_AND ? S_FALSE : S_TRUE;
            for (int i = sp - n; i < sp; i++) {
                if (stack[i] == decisive) { result = decisive; break; }
                if (stack[i] == S_UNKNOWN) result = S_UNKNOWN;
            }
            sp -= n;
            stack[sp++] = (uint8_t)result;
            break;
        }
        default: return S_UNKNOWN; /* unreachable: the program was checked */
        }
    }
}

typedef struct { Py_ssize_t start, end, first, count; } sspan_t;

static PyObject *select_frames(PyObject *self, PyObject *args) {
    Py_buffer prog, in;
    Py_ssize_t max_frames;
    if (!PyArg_ParseTuple(args, "y*y*n", &prog, &in, &max_frames)) return NULL;
    PyObject *result = NULL;
    sspan_t *spans = NULL;
    Py_ssize_t nspans = 0, cap = 0, index = 0, pos = 0, bad = -1;
    int nomem = 0;
    if (!sprogram_valid((const uint8_t *)prog.buf, (size_t)prog.len)) {
        PyErr_SetString(PyExc_ValueError, "select_frames: malformed program");
        goto done;
    }
    const uint8_t *b = (const uint8_t *)in.buf;
    const uint8_t *program = (const uint8_t *)prog.buf;
    Py_BEGIN_ALLOW_THREADS
    while (pos < in.len && index < max_frames) {
        if (in.len - pos < HEADER_SIZE + TRAILER_SIZE) { bad = pos; break; }
        const uint8_t *fr = b + pos;
        uint64_t body = get32(fr);
        uint64_t size = body + AT_BODY + TRAILER_SIZE;
        uint64_t topic_len = get16(fr + AT_TOPIC_LEN), tag_len = fr[AT_TAG_LEN];
        uint64_t key_len = get32(fr + AT_KEY_LEN), hdr_len = get32(fr + AT_HEADERS_LEN);
        uint64_t value_len = get32(fr + AT_VALUE_LEN);
        if (size > (uint64_t)(in.len - pos) || body < HEADER_SIZE - AT_BODY ||
            HEADER_SIZE + topic_len + tag_len + key_len + hdr_len + value_len > body + AT_BODY) {
            bad = pos;
            break;
        }
        sframe_t f;
        f.tag = fr + HEADER_SIZE + topic_len;
        f.tag_len = (uint32_t)tag_len;
        f.key = f.tag + tag_len;
        f.key_len = (uint32_t)key_len;
        f.has_key = (fr[AT_FLAGS] & FLAG_HAS_KEY) != 0;
        f.hdr = f.key + key_len;
        f.hdr_len = (uint32_t)hdr_len;
        f.producer_ms = (int64_t)get64(fr + AT_PRODUCER_MS);
        f.store_ms = (int64_t)get64(fr + AT_STORE_MS);
        if (seval(program, program + prog.len, &f) == S_TRUE) {
            if (nspans && spans[nspans - 1].end == pos) {
                spans[nspans - 1].end = pos + (Py_ssize_t)size;
                spans[nspans - 1].count++;
            } else {
                if (nspans == cap) {
                    Py_ssize_t grown = cap ? cap * 2 : 16;
                    sspan_t *more = PyMem_RawRealloc(spans, (size_t)grown * sizeof *spans);
                    if (more == NULL) { nomem = 1; break; }
                    spans = more;
                    cap = grown;
                }
                spans[nspans++] = (sspan_t){pos, pos + (Py_ssize_t)size, index, 1};
            }
        }
        pos += (Py_ssize_t)size;
        index++;
    }
    Py_END_ALLOW_THREADS
    if (nomem) {
        PyErr_NoMemory();
        goto done;
    }
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "select_frames: the frame at byte %zd runs past the buffer",
                     bad);
        goto done;
    }
    PyObject *list = PyList_New(nspans);
    if (list == NULL) goto done;
    for (Py_ssize_t i = 0; i < nspans; i++) {
        PyObject *t = Py_BuildValue("(nnnn)", spans[i].start, spans[i].end, spans[i].first,
                                    spans[i].count);
        if (t == NULL) {
            Py_DECREF(list);
            goto done;
        }
        PyList_SET_ITEM(list, i, t);
    }
    result = Py_BuildValue("(Nn)", list, index);
done:
    PyMem_RawFree(spans);
    PyBuffer_Release(&prog);
    PyBuffer_Release(&in);
    return result;
}

static PyMethodDef methods[] = {
    {"timer_entries", timer_entries, METH_VARARGS,
     "timer_entries(dues, targets, topic_id, cancel, first, count, dirty, flushing, heads, "
     "slots) -> bytearray of timer log entries (dirty updated)"},
    {"encode_records", encode_records, METH_VARARGS,
     "encode_records(out, position, topic, queue_id, first_offset, store_ms, values, keys, "
     "tags, headers, timestamps_ms, start, stop, index_out) -> bytes written"},
    {"patch_committed", patch_committed, METH_VARARGS,
     "patch_committed(src, entries, first_offset) -> bytearray with committed offsets, or None"},
    {"restamp_entries", restamp_entries, METH_VARARGS,
     "restamp_entries(entries, store_ms) -> None (store time set, entries re-sealed)"},
    {"measure_batch", measure_batch, METH_VARARGS,
     "measure_batch(values, keys, tags, headers, fixed) -> (total, max_frame, max_key, max_value)"},
    {"decode_frames", decode_frames, METH_VARARGS,
     "decode_frames(records, cls, broker_id) -> [cls(topic, queue_id, offset, key, value, tag, "
     "headers, producer_ms, store_ms, position, broker_id)], every checksum verified"},
    {"decode_columns", decode_columns, METH_VARARGS,
     "decode_columns(records, broker_id, want_headers) -> tuple of RecordColumns fields "
     "(Arrow buffers, little-endian), every checksum verified"},
    {"index_runs", index_runs, METH_VARARGS,
     "index_runs(entries, capacity, max_messages, max_bytes, count, total) -> (runs, taken, "
     "count, total, stop)"},
    {"index_segments", index_segments, METH_VARARGS,
     "index_segments(buffer, start, end, position) -> [(at, count, topic, queue_id, "
     "first_offset, entries)]"},
    {"check_frames", check_frames, METH_VARARGS,
     "check_frames(buffer, start, end, position=-1) -> offset of the first invalid frame (or "
     "one not naming its position), or -1"},
    {"split_blob", split_blob, METH_VARARGS, "split_blob(blob, lengths) -> [bytes]"},
    {"varints", varints, METH_VARARGS,
     "varints(values, count, stride, add, step) -> packed int64 varint payload"},
    {"select_frames", select_frames, METH_VARARGS,
     "select_frames(program, buffer, max_frames) -> ([(start, end, first, count)], scanned)"},
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data) -> int (CRC-32C, Castagnoli)"},
    {"murmur2", py_murmur2, METH_VARARGS,
     "murmur2(data) -> int (Kafka's Utils.murmur2, signed 32-bit)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_codec", "C accelerator for the equeue record format (equeue_proto.record)", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__codec(void) {
    crc_init();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    static const struct { const char *name; long value; } layout[] = {
        {"HEADER_SIZE", HEADER_SIZE},       {"TRAILER_SIZE", TRAILER_SIZE},
        {"RECORD_VERSION", RECORD_VERSION}, {"FLAG_HAS_KEY", FLAG_HAS_KEY},
        {"FLAG_BATCH_END", FLAG_BATCH_END}, {"AT_BODY", AT_BODY},
        {"FLAG_TXN", FLAG_TXN},             {"FLAG_CONTROL", FLAG_CONTROL},
        {"FLAG_DELAYED", FLAG_DELAYED},
        {"AT_VERSION", AT_VERSION},         {"AT_FLAGS", AT_FLAGS},
        {"AT_QUEUE_ID", AT_QUEUE_ID},       {"AT_QUEUE_OFFSET", AT_QUEUE_OFFSET},
        {"AT_POSITION", AT_POSITION},       {"AT_PRODUCER_MS", AT_PRODUCER_MS},
        {"AT_STORE_MS", AT_STORE_MS},       {"AT_TOPIC_LEN", AT_TOPIC_LEN},
        {"AT_TAG_LEN", AT_TAG_LEN},         {"AT_RESERVED", AT_RESERVED},
        {"AT_KEY_LEN", AT_KEY_LEN},         {"AT_HEADERS_LEN", AT_HEADERS_LEN},
        {"AT_VALUE_LEN", AT_VALUE_LEN},     {"ENTRY_SIZE", ENTRY_SIZE},
        {"ENTRY_AT_SIZE", ENTRY_AT_SIZE},   {"ENTRY_AT_TAG_HASH", ENTRY_AT_TAG_HASH},
        {"ENTRY_AT_STORE_MS", ENTRY_AT_STORE_MS}, {"ENTRY_AT_CRC", ENTRY_AT_CRC},
        {"ENTRY_AT_FORMAT", ENTRY_AT_FORMAT}, {"ENTRY_FORMAT_CHECKED", ENTRY_FORMAT_CHECKED},
    };
    PyObject *dict = PyDict_New();
    if (dict == NULL) goto fail;
    for (size_t i = 0; i < sizeof layout / sizeof layout[0]; i++) {
        PyObject *v = PyLong_FromLong(layout[i].value);
        if (v == NULL || PyDict_SetItemString(dict, layout[i].name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(dict);
            goto fail;
        }
        Py_DECREF(v);
    }
    if (PyModule_AddObject(m, "LAYOUT", dict) < 0) {
        Py_DECREF(dict);
        goto fail;
    }
    if (PyModule_AddIntConstant(m, "HARDWARE_CRC", have_hw_crc) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
