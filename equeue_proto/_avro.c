/* C interpreter of the Avro decode programs of equeue_spark/client/avro_columns.py (whose
 * docstring and "the program" section specify the words; decode_reference there is the
 * Python reference, held equal to this by tests/client/test_avro_columns.py).
 *
 * decode(program, data, offsets, offset_width, start, count, validity) walks each value of
 * an Arrow binary array (offsets[start..start+count], validity bitmap or None) within its
 * own bytes, appending to Arrow-layout builders per output slot. A value that does not
 * decode is rolled back (every builder truncated to its size at the row's start) and
 * appended as a null row; it is reported as (row, error code, byte position, value
 * length, pool offset, pool length). The GIL is released while decoding. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OP_NULL = 1, OP_BOOL, OP_INT, OP_LONG, OP_FLOAT, OP_DOUBLE, OP_BYTES, OP_FIXED,
       OP_DEC_BYTES, OP_DEC_FIXED, OP_ENUM, OP_RECORD, OP_ARRAY, OP_MAP, OP_WUNION,
       OP_RUNION, OP_DEFAULT, OP_BAD };
enum { TO_I32, TO_I64, TO_F32, TO_F64, TO_DATE, TO_TS_MILLIS, TO_TS_MICROS };
enum { SLOT_BOOL, SLOT_FIXED, SLOT_VAR, SLOT_STRUCT, SLOT_LIST, SLOT_MAP };
/* Error codes (avro_arrow.py words them). */
enum { E_EOF = 1, E_VARINT, E_INT_RANGE, E_NEG_LEN, E_UTF8, E_BOOL, E_UNION, E_ENUM,
       E_LEFT_OVER, E_RANGE, E_DECIMAL, E_BAD, E_BLOCK, E_TOO_BIG, E_NOMEM, E_SYMBOL, E_DEFAULT };

#define TS_MIN (-62135596800000000LL) /* 0001-01-01T00:00:00 in microseconds */
#define TS_MAX 253402300799999999LL   /* 9999-12-31T23:59:59.999999 */
#define DATE_MIN (-719162)
#define DATE_MAX 2932896

typedef struct {
    int kind, width, nchild;
    const int32_t *child;
    uint8_t *valid, *data;
    int32_t *offs;
    size_t vcap, dcap, ocap, dlen;
    int64_t len, nulls;
} Slot;

typedef struct {
    int64_t len, nulls;
    size_t dlen;
} Mark;

typedef struct {
    const int32_t *code;
    const uint8_t *pool;
    Slot *slots;
    int nslots;
    const uint8_t *p, *base, *end;
    int err;
    int64_t errpos;
    int32_t detail_off, detail_len;
} Dec;

static unsigned __int128 POW10[39];

/* ---- builders ------------------------------------------------------------ */

static int grow(void **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*buf, n);
    if (!q) return -1;
    *buf = q;
    *cap = n;
    return 0;
}

/* Room for one more item; sets its validity bit. */
static int item(Dec *d, Slot *s, int valid) {
    size_t nbytes = (size_t)(s->len / 8 + 1);
    if (grow((void **)&s->valid, &s->vcap, nbytes)) return d->err = E_NOMEM, -1;
    uint8_t bit = (uint8_t)(1u << (s->len & 7));
    if (valid) s->valid[s->len >> 3] |= bit;
    else { s->valid[s->len >> 3] &= (uint8_t)~bit; s->nulls++; }
    if (s->kind == SLOT_FIXED) {
        if (grow((void **)&s->data, &s->dcap, (size_t)(s->len + 1) * (size_t)s->width))
            return d->err = E_NOMEM, -1;
    } else if (s->kind == SLOT_BOOL) {
        if (grow((void **)&s->data, &s->dcap, nbytes)) return d->err = E_NOMEM, -1;
    } else if (s->kind == SLOT_VAR || s->kind == SLOT_LIST || s->kind == SLOT_MAP) {
        if (grow((void **)&s->offs, &s->ocap, (size_t)(s->len + 2) * 4)) return d->err = E_NOMEM, -1;
    }
    return 0;
}

static int put_fixed(Dec *d, int slot, const void *v) {
    if (slot < 0) return 0;
    Slot *s = &d->slots[slot];
    if (item(d, s, 1)) return -1;
    memcpy(s->data + (size_t)s->len * (size_t)s->width, v, (size_t)s->width);
    s->len++;
    return 0;
}

static int put_bool(Dec *d, int slot, int v) {
    if (slot < 0) return 0;
    Slot *s = &d->slots[slot];
    if (item(d, s, 1)) return -1;
    uint8_t bit = (uint8_t)(1u << (s->len & 7));
    if (v) s->data[s->len >> 3] |= bit;
    else s->data[s->len >> 3] &= (uint8_t)~bit;
    s->len++;
    return 0;
}

static int put_var(Dec *d, int slot, const uint8_t *v, size_t n) {
    if (slot < 0) return 0;
    Slot *s = &d->slots[slot];
    if (item(d, s, 1)) return -1;
    if (s->dlen + n > INT32_MAX) return d->err = E_TOO_BIG, -1;
    if (grow((void **)&s->data, &s->dcap, s->dlen + n + 1)) return d->err = E_NOMEM, -1;
    memcpy(s->data + s->dlen, v, n);
    s->dlen += n;
    s->offs[s->len + 1] = (int32_t)s->dlen;
    s->len++;
    return 0;
}

/* A null item; a struct's children get a null item each (Arrow's layout). */
static int put_null(Dec *d, int slot) {
    if (slot < 0) return 0;
    Slot *s = &d->slots[slot];
    if (item(d, s, 0)) return -1;
    if (s->kind == SLOT_FIXED) memset(s->data + (size_t)s->len * (size_t)s->width, 0, (size_t)s->width);
    else if (s->kind == SLOT_BOOL) s->data[s->len >> 3] &= (uint8_t)~(1u << (s->len & 7));
    else if (s->kind == SLOT_STRUCT) {
        for (int i = 0; i < s->nchild; i++)
            if (put_null(d, s->child[i])) return -1;
    } else s->offs[s->len + 1] = s->offs[s->len];
    s->len++;
    return 0;
}

/* ---- reading --------------------------------------------------------------- */

static inline int fail(Dec *d, int code, const uint8_t *at) {
    d->err = code;
    d->errpos = at - d->base;
    return -1;
}

static inline int rd_long(Dec *d, int64_t *out) {
    const uint8_t *p = d->p, *start = p;
    uint64_t v = 0;
    int shift = 0;
    while (p < d->end) {
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            d->p = p;
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return 0;
        }
        shift += 7;
        if (shift > 63) return fail(d, E_VARINT, start);
    }
    return fail(d, E_EOF, start);
}

/* A length-prefixed run of bytes. */
static inline int rd_bytes(Dec *d, const uint8_t **out, size_t *n) {
    const uint8_t *start = d->p;
    int64_t len;
    if (rd_long(d, &len)) return -1;
    if (len < 0) return fail(d, E_NEG_LEN, start);
    if (d->end - d->p < len) return fail(d, E_EOF, start);
    *out = d->p;
    *n = (size_t)len;
    d->p += len;
    return 0;
}

/* Strict UTF-8 as Python decodes it (no surrogates, no overlong forms, <= U+10FFFF). */
static int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) { i += 8; continue; }
        }
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        int need;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) need = 1;
        else if (c >= 0xe0 && c <= 0xef) {
            need = 2;
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
        } else return 0;
        if (i + (size_t)need >= n) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int k = 2; k <= need; k++)
            if ((s[i + k] & 0xc0) != 0x80) return 0;
        i += (size_t)need + 1;
    }
    return 1;
}

static int put_number(Dec *d, int slot, int to, int64_t v, const uint8_t *at) {
    if (slot < 0) return 0; /* skipped: no conversion, so no range to check */
    switch (to) {
    case TO_I32: { int32_t x = (int32_t)v; return put_fixed(d, slot, &x); }
    case TO_DATE: {
        if (v < DATE_MIN || v > DATE_MAX) return fail(d, E_RANGE, at);
        int32_t x = (int32_t)v;
        return put_fixed(d, slot, &x);
    }
    case TO_F32: { float x = (float)(double)v; return put_fixed(d, slot, &x); }
    case TO_F64: { double x = (double)v; return put_fixed(d, slot, &x); }
    case TO_TS_MILLIS:
        if (v < TS_MIN / 1000 || v > TS_MAX / 1000) return fail(d, E_RANGE, at);
        v *= 1000;
        return put_fixed(d, slot, &v);
    case TO_TS_MICROS:
        if (v < TS_MIN || v > TS_MAX) return fail(d, E_RANGE, at);
        return put_fixed(d, slot, &v);
    default: return put_fixed(d, slot, &v);
    }
}

/* A big-endian two's complement decimal into a 16-byte little-endian Arrow decimal128. */
static int put_decimal(Dec *d, int slot, const uint8_t *b, size_t n, int precision, const uint8_t *at) {
    __int128 v = 0;
    if (slot < 0) return 0;
    if (n > 0) {
        uint8_t fill = (b[0] & 0x80) ? 0xff : 0x00;
        if (n > 16) {
            for (size_t i = 0; i < n - 16; i++)
                if (b[i] != fill) return fail(d, E_DECIMAL, at);
            if ((b[n - 16] & 0x80) != (fill & 0x80)) return fail(d, E_DECIMAL, at);
            b += n - 16;
            n = 16;
        }
        unsigned __int128 u = fill ? ~(unsigned __int128)0 : 0;
        for (size_t i = 0; i < n; i++) u = (u << 8) | b[i];
        v = (__int128)u;
    }
    unsigned __int128 mag = v < 0 ? (unsigned __int128)0 - (unsigned __int128)v : (unsigned __int128)v;
    if (precision < 1 || precision > 38 || mag >= POW10[precision]) return fail(d, E_DECIMAL, at);
    return put_fixed(d, slot, &v);
}

static int64_t run(Dec *d, int64_t pc);

static int64_t run_blocks(Dec *d, int64_t pc, int is_map) {
    const int32_t *c = d->code + pc;
    int slot = c[1];
    int64_t item_pc = pc + 3, end = c[2];
    int key_slot = slot >= 0 && is_map ? d->slots[slot].child[0] : -1;
    for (;;) {
        const uint8_t *at = d->p;
        int64_t count;
        if (rd_long(d, &count)) return -1;
        if (count == 0) break;
        if (count < 0) {
            if (count == INT64_MIN) return fail(d, E_BLOCK, at);
            count = -count;
            int64_t size;
            if (rd_long(d, &size)) return -1;
        }
        for (int64_t i = 0; i < count; i++) {
            if (is_map) {
                const uint8_t *kat = d->p, *k;
                size_t kn;
                if (rd_bytes(d, &k, &kn)) return -1;
                if (!utf8_ok(k, kn)) return fail(d, E_UTF8, kat);
                if (put_var(d, key_slot, k, kn)) return -1;
            }
            if (run(d, item_pc) < 0) return -1;
        }
    }
    if (slot >= 0) {
        Slot *s = &d->slots[slot];
        if (item(d, s, 1)) return -1;
        s->offs[s->len + 1] = (int32_t)d->slots[s->child[is_map ? 1 : 0]].len;
        s->len++;
    }
    return end;
}

/* Runs the op at pc (one value); returns the next pc, or -1 with d->err set. */
static int64_t run(Dec *d, int64_t pc) {
    const int32_t *c = d->code + pc;
    const uint8_t *at = d->p;
    int64_t v;
    switch (c[0]) {
    case OP_NULL:
        return put_null(d, c[1]) ? -1 : pc + 2;
    case OP_BOOL:
        if (d->p >= d->end) return fail(d, E_EOF, at);
        if (*d->p > 1) return fail(d, E_BOOL, at);
        if (put_bool(d, c[1], *d->p++)) return -1;
        return pc + 2;
    case OP_INT:
    case OP_LONG:
        if (rd_long(d, &v)) return -1;
        if (c[0] == OP_INT && (v < INT32_MIN || v > INT32_MAX)) return fail(d, E_INT_RANGE, at);
        return put_number(d, c[1], c[2], v, at) ? -1 : pc + 3;
    case OP_FLOAT: {
        float f;
        if (d->end - d->p < 4) return fail(d, E_EOF, at);
        memcpy(&f, d->p, 4);
        d->p += 4;
        if (c[2] == TO_F64) {
            double x = (double)f;
            return put_fixed(d, c[1], &x) ? -1 : pc + 3;
        }
        return put_fixed(d, c[1], &f) ? -1 : pc + 3;
    }
    case OP_DOUBLE:
        if (d->end - d->p < 8) return fail(d, E_EOF, at);
        if (put_fixed(d, c[1], d->p)) return -1;
        d->p += 8;
        return pc + 2;
    case OP_BYTES: {
        const uint8_t *b;
        size_t n;
        if (rd_bytes(d, &b, &n)) return -1;
        if (c[2] && !utf8_ok(b, n)) return fail(d, E_UTF8, at);
        return put_var(d, c[1], b, n) ? -1 : pc + 3;
    }
    case OP_FIXED:
        if (d->end - d->p < c[2]) return fail(d, E_EOF, at);
        if (put_var(d, c[1], d->p, (size_t)c[2])) return -1;
        d->p += c[2];
        return pc + 3;
    case OP_DEC_BYTES: {
        const uint8_t *b;
        size_t n;
        if (rd_bytes(d, &b, &n)) return -1;
        return put_decimal(d, c[1], b, n, c[2], at) ? -1 : pc + 3;
    }
    case OP_DEC_FIXED:
        if (d->end - d->p < c[2]) return fail(d, E_EOF, at);
        d->p += c[2];
        return put_decimal(d, c[1], at, (size_t)c[2], c[3], at) ? -1 : pc + 4;
    case OP_ENUM: {
        if (rd_long(d, &v)) return -1;
        if (v < 0 || v >= c[2]) return fail(d, E_ENUM, at);
        const int32_t *sym = c + 3 + 2 * v;
        if (sym[1] < 0) return fail(d, E_SYMBOL, at);
        return put_var(d, c[1], d->pool + sym[0], (size_t)sym[1]) ? -1 : pc + 3 + 2 * c[2];
    }
    case OP_RECORD: {
        if (c[1] >= 0 && item(d, &d->slots[c[1]], 1)) return -1;
        if (c[1] >= 0) d->slots[c[1]].len++;
        int64_t q = pc + 4;
        for (int i = 0; i < c[2]; i++)
            if ((q = run(d, q)) < 0) return -1;
        return c[3];
    }
    case OP_ARRAY:
        return run_blocks(d, pc, 0);
    case OP_MAP:
        return run_blocks(d, pc, 1);
    case OP_WUNION:
        if (rd_long(d, &v)) return -1;
        if (v < 0 || v >= c[1]) return fail(d, E_UNION, at);
        return run(d, c[3 + v]) < 0 ? -1 : c[2];
    case OP_RUNION: {
        int slot = c[1];
        if (slot >= 0) {
            Slot *s = &d->slots[slot];
            if (item(d, s, 1)) return -1;
            s->len++;
            for (int i = 0; i < s->nchild; i++)
                if (i != c[2] && put_null(d, s->child[i])) return -1;
        }
        return run(d, pc + 4) < 0 ? -1 : c[3];
    }
    case OP_DEFAULT: {
        const uint8_t *save_p = d->p, *save_base = d->base, *save_end = d->end;
        d->p = d->base = d->pool + c[1];
        d->end = d->p + c[2];
        int64_t r = run(d, pc + 4);
        int left = d->p != d->end;
        d->p = save_p;
        d->base = save_base;
        d->end = save_end;
        if (r < 0 || left) return fail(d, E_DEFAULT, d->p);
        return c[3];
    }
    case OP_BAD:
        fail(d, E_BAD, at);
        d->detail_off = c[1];
        d->detail_len = c[2];
        return -1;
    default:
        return fail(d, E_BAD, at);
    }
}

/* ---- the batch ------------------------------------------------------------- */

typedef struct {
    int64_t row, pos, len;
    int32_t code, off, n;
} Bad;

static PyObject *slot_result(Slot *s) {
    PyObject *valid = s->nulls ? PyBytes_FromStringAndSize((char *)s->valid, (Py_ssize_t)((s->len + 7) / 8))
                               : (Py_INCREF(Py_None), Py_None);
    PyObject *offs, *data;
    if (s->kind == SLOT_VAR || s->kind == SLOT_LIST || s->kind == SLOT_MAP)
        offs = PyBytes_FromStringAndSize((char *)s->offs, (Py_ssize_t)((s->len + 1) * 4));
    else offs = (Py_INCREF(Py_None), Py_None);
    size_t dn = s->kind == SLOT_FIXED ? (size_t)s->len * (size_t)s->width
              : s->kind == SLOT_BOOL ? (size_t)((s->len + 7) / 8)
              : s->kind == SLOT_VAR ? s->dlen : 0;
    if (s->kind == SLOT_FIXED || s->kind == SLOT_BOOL || s->kind == SLOT_VAR)
        data = PyBytes_FromStringAndSize(dn ? (char *)s->data : "", (Py_ssize_t)dn);
    else data = (Py_INCREF(Py_None), Py_None);
    if (!valid || !offs || !data) {
        Py_XDECREF(valid); Py_XDECREF(offs); Py_XDECREF(data);
        return NULL;
    }
    return Py_BuildValue("(LLNNN)", (long long)s->len, (long long)s->nulls, valid, offs, data);
}

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer prog, data, offsets, validity = {0};
    int width;
    Py_ssize_t start, count;
    PyObject *validity_obj;
    if (!PyArg_ParseTuple(args, "y*y*y*innO", &prog, &data, &offsets, &width, &start, &count, &validity_obj))
        return NULL;
    PyObject *result = NULL, *slots_out = NULL, *bad_out = NULL;
    Slot *slots = NULL;
    Bad *bad = NULL;
    Mark *marks = NULL;
    size_t nbad = 0, badcap = 0;
    int have_validity = validity_obj != Py_None;
    if (have_validity && PyObject_GetBuffer(validity_obj, &validity, PyBUF_SIMPLE)) goto done;
    const int32_t *w = prog.buf;
    Py_ssize_t nwords = prog.len / 4;
    if (nwords < 4 || (width != 4 && width != 8) || start < 0 || count < 0 ||
        offsets.len < (start + count + 1) * width || (have_validity && validity.len * 8 < start + count)) {
        PyErr_SetString(PyExc_ValueError, "bad program or buffers");
        goto done;
    }
    int nslots = w[0], nkids = w[1], ncode = w[2], npool = w[3];
    if (nslots < 1 || nkids < 0 || ncode < 1 || npool < 0 ||
        (int64_t)4 + 4 * (int64_t)nslots + nkids + ncode > nwords ||
        ((int64_t)4 + 4 * (int64_t)nslots + nkids + ncode) * 4 + npool > prog.len) {
        PyErr_SetString(PyExc_ValueError, "bad program header");
        goto done;
    }
    const int32_t *table = w + 4, *kids = table + 4 * nslots, *code = kids + nkids;
    slots = calloc((size_t)nslots, sizeof(Slot));
    marks = calloc((size_t)nslots, sizeof(Mark));
    if (!slots || !marks) { PyErr_NoMemory(); goto done; }
    for (int i = 0; i < nslots; i++) {
        slots[i].kind = table[4 * i];
        slots[i].width = table[4 * i + 1];
        slots[i].nchild = table[4 * i + 2];
        slots[i].child = kids + table[4 * i + 3];
        if (table[4 * i + 3] < 0 || table[4 * i + 3] + slots[i].nchild > nkids) {
            PyErr_SetString(PyExc_ValueError, "bad slot table");
            goto done;
        }
        int has_offsets = slots[i].kind == SLOT_VAR || slots[i].kind == SLOT_LIST || slots[i].kind == SLOT_MAP;
        if (has_offsets && grow((void **)&slots[i].offs, &slots[i].ocap, 4 * ((size_t)count + 2))) {
            PyErr_NoMemory();
            goto done;
        }
        if (slots[i].offs) slots[i].offs[0] = 0;
    }
    Dec d = {.code = code, .pool = (const uint8_t *)(code + ncode), .slots = slots, .nslots = nslots};
    const uint8_t *vbits = have_validity ? validity.buf : NULL;
    const uint8_t *base = data.buf;
    int fatal = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < count && !fatal; r++) {
        Py_ssize_t i = start + r;
        if (vbits && !(vbits[i >> 3] & (1u << (i & 7)))) {
            if (put_null(&d, 0)) fatal = 1;
            continue;
        }
        int64_t lo, hi;
        if (width == 4) {
            int32_t a, b;
            memcpy(&a, (const char *)offsets.buf + 4 * i, 4);
            memcpy(&b, (const char *)offsets.buf + 4 * (i + 1), 4);
            lo = a; hi = b;
        } else {
            memcpy(&lo, (const char *)offsets.buf + 8 * i, 8);
            memcpy(&hi, (const char *)offsets.buf + 8 * (i + 1), 8);
        }
        if (lo < 0 || hi < lo || hi > data.len) { fatal = 2; break; }
        for (int k = 0; k < nslots; k++) {
            marks[k].len = slots[k].len; marks[k].nulls = slots[k].nulls; marks[k].dlen = slots[k].dlen;
        }
        d.p = d.base = base + lo;
        d.end = base + hi;
        d.err = 0;
        int64_t q = run(&d, 0);
        if (q >= 0 && d.p != d.end) { fail(&d, E_LEFT_OVER, d.p); q = -1; }
        if (q >= 0) continue;
        if (d.err == E_NOMEM || d.err == E_TOO_BIG) { fatal = d.err == E_NOMEM ? 1 : 3; break; }
        for (int k = 0; k < nslots; k++) {
            slots[k].len = marks[k].len; slots[k].nulls = marks[k].nulls; slots[k].dlen = marks[k].dlen;
        }
        if (put_null(&d, 0) || grow((void **)&bad, &badcap, (nbad + 1) * sizeof(Bad))) { fatal = 1; break; }
        bad[nbad++] = (Bad){r, d.errpos, hi - lo, d.err, d.err == E_BAD ? d.detail_off : 0,
                            d.err == E_BAD ? d.detail_len : 0};
        d.detail_off = d.detail_len = 0;
    }
    Py_END_ALLOW_THREADS
    if (fatal) {
        if (fatal == 1) PyErr_NoMemory();
        else if (fatal == 2) PyErr_SetString(PyExc_ValueError, "value offsets out of the data buffer");
        else PyErr_SetString(PyExc_ValueError, "a decoded column exceeds 2 GiB: decode smaller batches");
        goto done;
    }
    slots_out = PyList_New(nslots);
    bad_out = PyList_New((Py_ssize_t)nbad);
    if (!slots_out || !bad_out) goto done;
    for (int i = 0; i < nslots; i++) {
        PyObject *t = slot_result(&slots[i]);
        if (!t) goto done;
        PyList_SET_ITEM(slots_out, i, t);
    }
    for (size_t i = 0; i < nbad; i++) {
        PyObject *t = Py_BuildValue("(LiLLii)", (long long)bad[i].row, bad[i].code, (long long)bad[i].pos,
                                    (long long)bad[i].len, bad[i].off, bad[i].n);
        if (!t) goto done;
        PyList_SET_ITEM(bad_out, (Py_ssize_t)i, t);
    }
    result = PyTuple_Pack(2, slots_out, bad_out);
done:
    Py_XDECREF(slots_out);
    Py_XDECREF(bad_out);
    if (slots)
        for (int i = 0; i < nslots; i++) { free(slots[i].valid); free(slots[i].data); free(slots[i].offs); }
    free(slots);
    free(marks);
    free(bad);
    if (have_validity && validity.obj) PyBuffer_Release(&validity);
    PyBuffer_Release(&prog);
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    return result;
}

static PyMethodDef METHODS[] = {
    {"decode", decode, METH_VARARGS,
     "decode(program, data, offsets, offset_width, start, count, validity) -> (slots, bad)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_avro", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__avro(void) {
    POW10[0] = 1;
    for (int i = 1; i < 39; i++) POW10[i] = POW10[i - 1] * 10;
    return PyModule_Create(&MODULE);
}
