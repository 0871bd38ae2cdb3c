/* C accelerator of the broker's key index (broker/equeue_broker/storage/keys/key_index.py,
 * whose module docstring specifies the entry format and the hash; keyhash.py holds the
 * Python reference, which a test holds equal to this).
 *
 * key_entries walks the frames of one write (the record format of equeue_proto/record.py),
 * finds each record's keys (its key, when HAS_KEY, then the keys of its "keys" header,
 * split at spaces, empty parts skipped, at most max_extra, a repeated key once), computes
 * hash64(topic, key) = crc32c(topic 0x00 key) << 32 | murmur2(topic 0x00 key), links each
 * entry into the window's slot array in place and returns the 32-byte entries to pwrite.
 * CONTROL records are skipped. No Python object is made per record. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "crc32c.h"

/* CRC32C: crc32c.h (crc_init, crc_raw, crc32c). */

/* ---- murmur2 (32-bit, seed 0x9747b28c, as Kafka's partitioner) ------------ */

static inline uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
static inline void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline void put64(uint8_t *p, uint64_t v) {
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t murmur2(const uint8_t *data, size_t length) {
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    size_t n4 = length / 4;
    for (size_t i = 0; i < n4; i++) {
        uint32_t k = get32(data + 4 * i);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    const uint8_t *tail = data + 4 * n4;
    switch (length & 3) {
    case 3: h ^= (uint32_t)tail[2] << 16; /* fall through */
    case 2: h ^= (uint32_t)tail[1] << 8; /* fall through */
    case 1: h ^= tail[0]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

/* ---- the record format (equeue_proto/record.py) -------------------------- */

#define HEADER_SIZE 56
#define TRAILER_SIZE 8
#define AT_FLAGS 5
#define AT_STORE_MS 32
#define AT_TOPIC_LEN 40
#define AT_TAG_LEN 42
#define AT_KEY_LEN 44
#define AT_HEADERS_LEN 48
#define FLAG_HAS_KEY 1
#define FLAG_CONTROL 8
#define ENTRY_SIZE 32
#define MAX_KEYS 1025

typedef struct {
    const uint8_t *ptr;
    size_t len;
} Key;

/* The extra keys of a headers section: appended to keys[*n...]. */
static void header_keys(const uint8_t *h, size_t len, Key *keys, int *n, int max_extra) {
    if (len < 2) return;
    uint16_t count = get16(h);
    size_t pos = 2;
    for (uint16_t i = 0; i < count; i++) {
        if (pos + 2 > len) return;
        size_t name_len = get16(h + pos);
        pos += 2;
        if (pos + name_len + 4 > len) return;
        const uint8_t *name = h + pos;
        pos += name_len;
        size_t value_len = get32(h + pos);
        pos += 4;
        if (pos + value_len > len) return;
        if (name_len == 4 && memcmp(name, "keys", 4) == 0) {
            const uint8_t *v = h + pos, *end = h + pos + value_len;
            int extra = 0;
            while (v < end && extra < max_extra) {
                const uint8_t *space = memchr(v, ' ', (size_t)(end - v));
                const uint8_t *stop = space ? space : end;
                if (stop > v) {
                    keys[(*n)++] = (Key){v, (size_t)(stop - v)};
                    extra++;
                }
                v = stop + 1;
            }
            return;
        }
        pos += value_len;
    }
}

/* keys[0..n) without repeats (first occurrence kept); returns the new count. */
static int unique_keys(Key *keys, int n) {
    int out = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < out; j++)
            if (keys[j].len == keys[i].len && memcmp(keys[j].ptr, keys[i].ptr, keys[i].len) == 0) {
                seen = 1;
                break;
            }
        if (!seen) keys[out++] = keys[i];
    }
    return out;
}

/* The keys of the (whole, non-CONTROL) record at r, ``frame`` bytes: its key (HAS_KEY),
 * then its "keys" header's, without repeats; -1 if its lengths do not fit the frame. */
static int record_keys(const uint8_t *r, size_t frame, Key *keys, int max_extra) {
    uint8_t flags = r[AT_FLAGS];
    size_t topic_len = get16(r + AT_TOPIC_LEN), tag_len = r[AT_TAG_LEN];
    size_t key_len = get32(r + AT_KEY_LEN), headers_len = get32(r + AT_HEADERS_LEN);
    if (HEADER_SIZE + topic_len + tag_len + key_len + headers_len > frame) return -1;
    const uint8_t *key = r + HEADER_SIZE + topic_len + tag_len;
    int nk = 0;
    if (flags & FLAG_HAS_KEY) keys[nk++] = (Key){key, key_len};
    if (headers_len) header_keys(key + key_len, headers_len, keys, &nk, max_extra);
    return nk > 1 ? unique_keys(keys, nk) : nk;
}

typedef struct {
    unsigned long long count, capacity;
    long long begin_ms, window_ms;
} Fit;

/* Whether a record of nk keys stored at store_ms fits the window; if so, count it. */
static int fits(Fit *w, int nk, long long store_ms) {
    unsigned long long need = (unsigned long long)nk < w->capacity ? (unsigned long long)nk : w->capacity;
    if (w->count + need > w->capacity || (w->count && store_ms - w->begin_ms >= w->window_ms)) return 0;
    if (w->count == 0) w->begin_ms = store_ms;
    w->count += need;
    return 1;
}

/* key_entries(data, first_position, slots, dirty, count, capacity, begin_ms, window_ms, max_extra)
 * -> (entries, consumed, count, begin_ms, first_position, end_position, end_ms)
 * Stops before a record that does not fit the window (its keys would pass
 * ``capacity``, or it is ``window_ms`` or more after ``begin_ms`` while the window
 * holds entries): ``consumed`` < len(data), the caller starts the next window.
 * first_position: of the first record indexed (-1: none); end_position: the last
 * one's + 1 (0: none); end_ms: the latest store time indexed (0: none). dirty: one byte
 * per 1024 slots (a 4 KiB page of the slot array), set to 1 when a slot in it changes.
 * Three passes: the first counts the entries (so the one allocation is the result, 32 B
 * a key), the second makes them, the third links them into the slots. */
static PyObject *py_key_entries(PyObject *self, PyObject *args) {
    Py_buffer data, slots, dirty;
    long long first_position, begin_ms, window_ms;
    unsigned long long count, capacity;
    int max_extra;
    if (!PyArg_ParseTuple(args, "y*Lw*w*KKLLi", &data, &first_position, &slots, &dirty, &count,
                          &capacity, &begin_ms, &window_ms, &max_extra))
        return NULL;
    PyObject *result = NULL, *entries = NULL;
    uint8_t *scratch = NULL;
    size_t scratch_cap = 0;
    Key keys[MAX_KEYS];
    if (max_extra < 0) max_extra = 0;
    if (max_extra > MAX_KEYS - 1) max_extra = MAX_KEYS - 1;
    size_t slot_count = (size_t)slots.len / 4;
    if (slot_count == 0 || (size_t)dirty.len < (slot_count + 1023) / 1024) {
        PyErr_SetString(PyExc_ValueError, "no slots, or a dirty map shorter than slots / 1024");
        goto done;
    }
    const uint8_t *b = data.buf;
    size_t n = (size_t)data.len, end = n;
    /* Pass 1: how far this window goes, and how many entries that is. */
    Fit fit = {count, capacity, begin_ms, window_ms};
    int full = 0;
    size_t pos = 0;
    while (pos + HEADER_SIZE + TRAILER_SIZE <= n) {
        size_t body = get32(b + pos), frame = body + 12;
        if (body == 0 || frame > n - pos) break;
        const uint8_t *r = b + pos;
        if (!(r[AT_FLAGS] & FLAG_CONTROL)) {
            int nk = record_keys(r, frame, keys, max_extra);
            if (nk < 0) break;
            if (nk && !fits(&fit, nk, (long long)get64(r + AT_STORE_MS))) {
                full = 1;
                break;
            }
        }
        pos += frame;
    }
    end = pos;
    entries = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((fit.count - count) * ENTRY_SIZE));
    if (!entries) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(entries), *made = out;
    uint8_t *slot_bytes = slots.buf, *dirty_pages = dirty.buf;
    long long first = -1, end_position = 0, end_ms = 0;
    unsigned long long filled = count;
    size_t prefix_len = 0; /* "topic 0x00" in scratch: 0 = none yet */
    uint32_t prefix_crc = 0, topic_id = 0;
    /* Pass 2: each entry's hash, position, delta and topic id, its slot prefetched (random
     * slots of a 16 MiB array miss the caches: the misses overlap here instead of each
     * stalling the link below). */
    for (pos = 0; pos < end;) {
        const uint8_t *r = b + pos;
        size_t frame = get32(r) + 12;
        int nk = r[AT_FLAGS] & FLAG_CONTROL ? 0 : record_keys(r, frame, keys, max_extra);
        if (nk <= 0) {
            pos += frame;
            continue;
        }
        long long store_ms = (long long)get64(r + AT_STORE_MS);
        long long position = first_position + (long long)pos;
        if (filled == 0) begin_ms = store_ms;
        if (first < 0) first = position;
        end_position = position + 1;
        if (store_ms > end_ms) end_ms = store_ms;
        long long delta = store_ms - begin_ms;
        if (delta < 0) delta = 0;
        if (delta > 0xFFFFFFFFLL) delta = 0xFFFFFFFFLL;
        size_t topic_len = get16(r + AT_TOPIC_LEN);
        const uint8_t *topic = r + HEADER_SIZE;
        /* The records of one write are mostly one topic's: its id, its "topic 0x00"
         * in the scratch buffer and the CRC register after it are kept from the last. */
        if (topic_len + 1 != prefix_len || memcmp(scratch, topic, topic_len) != 0) {
            if (topic_len + 1 > scratch_cap) {
                uint8_t *s = PyMem_Realloc(scratch, topic_len + 1);
                if (!s) {
                    PyErr_NoMemory();
                    goto done;
                }
                scratch = s;
                scratch_cap = topic_len + 1;
            }
            memcpy(scratch, topic, topic_len);
            scratch[topic_len] = 0;
            prefix_len = topic_len + 1;
            prefix_crc = crc_raw(0xFFFFFFFFu, scratch, prefix_len);
            topic_id = crc32c(topic, topic_len);
        }
        for (int i = 0; i < nk && filled < capacity; i++) {
            size_t joined = prefix_len + keys[i].len;
            if (joined > scratch_cap) {
                uint8_t *s = PyMem_Realloc(scratch, joined);
                if (!s) {
                    PyErr_NoMemory();
                    goto done;
                }
                scratch = s;
                scratch_cap = joined;
            }
            memcpy(scratch + prefix_len, keys[i].ptr, keys[i].len);
            uint32_t crc = ~crc_raw(prefix_crc, keys[i].ptr, keys[i].len);
            uint64_t hash = (uint64_t)crc << 32 | murmur2(scratch, joined);
            __builtin_prefetch(slot_bytes + 4 * (size_t)(hash % slot_count), 1);
            put64(out, hash);
            put64(out + 8, (uint64_t)position);
            put32(out + 16, (uint32_t)delta);
            put32(out + 24, topic_id);
            out += ENTRY_SIZE;
            filled++;
        }
        pos += frame;
    }
    /* Pass 3: link each entry into its slot, in order, and seal it with its crc. */
    for (uint8_t *e = made; e < out; e += ENTRY_SIZE) {
        size_t slot = (size_t)(get64(e) % slot_count);
        put32(e + 20, get32(slot_bytes + 4 * slot));
        put32(e + 28, crc32c(e, 28));
        count++;
        put32(slot_bytes + 4 * slot, (uint32_t)count);
        dirty_pages[slot >> 10] = 1;
    }
    result = Py_BuildValue("OnKLLLL", entries, (Py_ssize_t)(full ? end : n), count, begin_ms, first,
                           end_position, end_ms);
done:
    Py_XDECREF(entries);
    PyMem_Free(scratch);
    PyBuffer_Release(&data);
    PyBuffer_Release(&slots);
    PyBuffer_Release(&dirty);
    return result;
}

/* key_relink(entries, first_number, slots, dirty): make each entry the head of its
 * slot, in order (entry i is number first_number + i): the heads a window's slot
 * array has after these entries, given its heads before them. */
static PyObject *py_key_relink(PyObject *self, PyObject *args) {
    Py_buffer entries, slots, dirty;
    unsigned long long first;
    if (!PyArg_ParseTuple(args, "y*Kw*w*", &entries, &first, &slots, &dirty)) return NULL;
    size_t slot_count = (size_t)slots.len / 4;
    PyObject *result = NULL;
    if (slot_count == 0 || (size_t)dirty.len < (slot_count + 1023) / 1024) {
        PyErr_SetString(PyExc_ValueError, "no slots, or a dirty map shorter than slots / 1024");
    } else {
        const uint8_t *e = entries.buf;
        uint8_t *slot_bytes = slots.buf, *dirty_pages = dirty.buf;
        size_t n = (size_t)entries.len / ENTRY_SIZE;
        for (size_t i = 0; i < n; i++) {
            size_t slot = (size_t)(get64(e + i * ENTRY_SIZE) % slot_count);
            put32(slot_bytes + 4 * slot, (uint32_t)(first + i + 1));
            dirty_pages[slot >> 10] = 1;
        }
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&entries);
    PyBuffer_Release(&slots);
    PyBuffer_Release(&dirty);
    return result;
}

static PyObject *py_hash64(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    uint64_t h = (uint64_t)crc32c(data.buf, (size_t)data.len) << 32 | murmur2(data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef methods[] = {
    {"key_entries", py_key_entries, METH_VARARGS,
     "key_entries(data, first_position, slots, dirty, count, capacity, begin_ms, window_ms, "
     "max_extra)"},
    {"key_relink", py_key_relink, METH_VARARGS, "key_relink(entries, first_number, slots, dirty)"},
    {"hash64", py_hash64, METH_VARARGS, "hash64(topic + b'\\0' + key) -> int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_keyhash", "C accelerator of the broker's key index", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__keyhash(void) {
    crc_init();
    return PyModule_Create(&module);
}
