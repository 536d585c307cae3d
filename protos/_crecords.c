/* tidemq.protos._crecords: the compiled twin of tidemq.protos.record_blocks (the client's record
 * codec), through the CPython API. record_blocks.py documents the bytes; this file gives the same
 * results and raises the same errors (class and message) as the pure-Python functions there, in
 * the same order of checks, which the tests compare on random input.
 *
 * record_blocks calls configure(RecordFormatError, ipv6_text) when it imports this module; a
 * caller that imports this module first gets record_blocks imported on its first call. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAGIC_V1 0xDAA320A7u
#define MAGIC_V2 0xDAA320ABu
#define FIXED_OVERHEAD 91
#define HEADER_SIZE 88
#define TOPIC_MAX_BYTES 127
/* record_blocks.MAX_PROPERTIES_BYTES: int16 PROPERTIES LENGTH less the broker's record CRC
 * property (20) and its widest idempotence stamp (65). */
#define MAX_PROPERTIES_BYTES (32767 - 20 - 65)
#define I32_MAX 2147483647LL
#define SYSFLAG_BORNHOST_V6 0x10
#define SYSFLAG_STOREHOST_V6 0x20
#define HOST_CACHE 8
#define TOPIC_CACHE 4

static PyObject *RecordFormatError; /* record_blocks.RecordFormatError, set by configure() */
static PyObject *Ipv6Text;          /* record_blocks.ipv6_text */
static PyObject *MappingABC;        /* collections.abc.Mapping */
static PyObject *EmptyStr;

/* The field names of a decoded record, interned once: every record's dict uses them. */
enum {
    F_TOPIC, F_QUEUE_ID, F_QUEUE_OFFSET, F_BODY, F_TAG, F_KEYS, F_PROPERTIES, F_MSG_ID,
    F_BORN_TS, F_STORE_TS, F_COMMITLOG_OFFSET, F_BORN_HOST, F_STORE_HOST, F_RECONSUME, F_COUNT
};
static const char *const FIELD_NAMES[F_COUNT] = {
    "topic", "queue_id", "queue_offset", "body", "tag", "keys", "properties", "msg_id",
    "born_timestamp_ms", "store_timestamp_ms", "commitlog_offset", "born_host", "store_host",
    "reconsume_times",
};
static PyObject *FieldKeys[F_COUNT];

static const char HEX[] = "0123456789ABCDEF";

/* ------------------------------------------------------------------------- small helpers */

static inline void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

static inline void put_u64(unsigned char *p, uint64_t v) {
    put_u32(p, (uint32_t)(v >> 32));
    put_u32(p + 4, (uint32_t)v);
}

static inline uint32_t get_u32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline int32_t get_i32(const unsigned char *p) { return (int32_t)get_u32(p); }

static inline int64_t get_i64(const unsigned char *p) {
    return (int64_t)(((uint64_t)get_u32(p) << 32) | get_u32(p + 4));
}

static inline int get_i16(const unsigned char *p) { return (int16_t)((p[0] << 8) | p[1]); }

static int ensure_configured(void) {
    if (RecordFormatError != NULL) {
        return 0;
    }
    PyObject *m = PyImport_ImportModule("tidemq.protos.record_blocks");
    if (m == NULL) {
        return -1;
    }
    Py_DECREF(m);
    if (RecordFormatError == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "tidemq.protos._crecords is not configured");
        return -1;
    }
    return 0;
}

/* Raises `type` with a formatted message, prefixed "message <index>: " when index >= 0. */
static PyObject *fail(PyObject *type, Py_ssize_t index, const char *fmt, ...) {
    va_list va;
    va_start(va, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (msg == NULL) {
        return NULL;
    }
    if (index >= 0) {
        PyObject *full = PyUnicode_FromFormat("message %zd: %U", index, msg);
        Py_DECREF(msg);
        if (full == NULL) {
            return NULL;
        }
        msg = full;
    }
    PyErr_SetObject(type, msg);
    Py_DECREF(msg);
    return NULL;
}

/* A TypeError whose message is `fmt` (formatted with the arguments after `value`) followed by
 * the name of value's type, as the pure twin's f"... not {type(value).__name__}". */
static PyObject *fail_type(Py_ssize_t index, const char *fmt, PyObject *value, ...) {
    PyObject *name = PyType_GetName(Py_TYPE(value));
    if (name == NULL) {
        return NULL;
    }
    va_list va;
    va_start(va, value);
    PyObject *msg = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (msg == NULL) {
        Py_DECREF(name);
        return NULL;
    }
    PyObject *full = index >= 0 ? PyUnicode_FromFormat("message %zd: %U%U", index, msg, name)
                                : PyUnicode_FromFormat("%U%U", msg, name);
    Py_DECREF(msg);
    Py_DECREF(name);
    if (full != NULL) {
        PyErr_SetObject(PyExc_TypeError, full);
        Py_DECREF(full);
    }
    return NULL;
}

/* `value` as a tuple (the caller's list may change under Python code this function runs; a
 * tuple of its items does not), or `problem` (a TypeError naming value's type) when it is not
 * iterable. The pure twin: list(value), TypeError -> problem. */
static PyObject *as_tuple(PyObject *value, Py_ssize_t index, const char *problem) {
    if (PyTuple_Check(value)) {
        Py_INCREF(value);
        return value;
    }
    PyObject *t = PySequence_Tuple(value);
    if (t == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        return fail_type(index, problem, value);
    }
    return t;
}

/* UTF-8 of a str (cached in the str by CPython); NULL with RecordFormatError "<what> is not
 * valid UTF-8 text" for a lone surrogate. `what` is a format with one %R for `repr_of`. */
static const char *utf8_of(PyObject *s, Py_ssize_t *len, Py_ssize_t index, const char *what,
                           PyObject *repr_of) {
    const char *p = PyUnicode_AsUTF8AndSize(s, len);
    if (p == NULL && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
        PyErr_Clear();
        PyObject *head = PyUnicode_FromFormat(what, repr_of);
        if (head != NULL) {
            fail(RecordFormatError, index, "%U is not valid UTF-8 text", head);
            Py_DECREF(head);
        }
    }
    return p;
}

static inline int has_byte(const char *p, Py_ssize_t n, int c) {
    return n > 0 && memchr(p, c, (size_t)n) != NULL;
}

/* The arguments of a call into out[0..n), the first `required` of them required (a missing
 * optional one is NULL): a positional call (the SDK's) takes them as they come; keywords are
 * matched by name. */
static int unpack_some_args(const char *func, const char *const *names, int n, int required,
                            PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                            PyObject **out) {
    if (kwnames == NULL && nargs == n) {
        memcpy(out, args, (size_t)n * sizeof *out);
        return 0;
    }
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes %d arguments (%zd given)", func, n, nargs);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        out[i] = i < nargs ? args[i] : NULL;
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int i = 0;
        while (i < n && PyUnicode_CompareWithASCIIString(name, names[i]) != 0) {
            i++;
        }
        if (i == n) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", func,
                         name);
            return -1;
        }
        if (out[i] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", func,
                         names[i]);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (int i = 0; i < required; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", func, names[i]);
            return -1;
        }
    }
    return 0;
}

/* unpack_some_args with every argument required. */
static int unpack_args(const char *func, const char *const *names, int n, PyObject *const *args,
                       Py_ssize_t nargs, PyObject *kwnames, PyObject **out) {
    return unpack_some_args(func, names, n, n, args, nargs, kwnames, out);
}

/* A growable scratch buffer. `stack`, when not NULL, is caller-owned storage `data` starts in
 * (a message's properties usually fit, and then cost no allocation); it is never freed here. */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
    char *stack;
} Buf;

static int buf_put(Buf *b, const void *p, Py_ssize_t n) {
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) {
            cap *= 2;
        }
        char *data;
        if (b->data != NULL && b->data == b->stack) {
            data = PyMem_Malloc((size_t)cap);
            if (data != NULL) {
                memcpy(data, b->data, (size_t)b->len);
            }
        } else {
            data = PyMem_Realloc(b->data, (size_t)cap);
        }
        if (data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = data;
        b->cap = cap;
    }
    if (n > 0) {
        memcpy(b->data + b->len, p, (size_t)n);
    }
    b->len += n;
    return 0;
}

static void buf_free(Buf *b) {
    if (b->data != b->stack) {
        PyMem_Free(b->data);
    }
    b->data = b->stack;
    b->len = b->cap = 0;
}

/* --------------------------------------------------------------------- encoding a message */

static const char *const RESERVED[] = {"TAGS", "KEYS", "__CRC32H", "__CRC32#", "PRODUCER_SEQ"};

static int reserved_index(const char *p, Py_ssize_t n) {
    for (int i = 0; i < 5; i++) {
        if ((size_t)n == strlen(RESERVED[i]) && memcmp(p, RESERVED[i], (size_t)n) == 0) {
            return i;
        }
    }
    return -1;
}

static int put_property(Buf *out, Py_ssize_t index, PyObject *name, PyObject *value) {
    if (!PyUnicode_Check(name)) {
        fail_type(index, "property names must be str, not ", name);
        return -1;
    }
    if (!PyUnicode_Check(value)) {
        fail_type(index, "the value of property %R must be str, not ", value, name);
        return -1;
    }
    Py_ssize_t name_n, value_n;
    const char *name_p = utf8_of(name, &name_n, index, "property name %R", name);
    if (name_p == NULL) {
        return -1;
    }
    if (name_n == 0) {
        fail(RecordFormatError, index, "a property name is empty");
        return -1;
    }
    if (has_byte(name_p, name_n, 1) || has_byte(name_p, name_n, 2)) {
        fail(RecordFormatError, index, "property name %R holds \\x01 or \\x02", name);
        return -1;
    }
    int reserved = reserved_index(name_p, name_n);
    if (reserved >= 0) {
        fail(RecordFormatError, index,
             reserved < 2 ? "property %U is reserved: the tag and keys set it"
                          : "property %U is reserved for the broker",
             name);
        return -1;
    }
    const char *value_p = utf8_of(value, &value_n, index, "the value of property %R", name);
    if (value_p == NULL) {
        return -1;
    }
    if (has_byte(value_p, value_n, 1) || has_byte(value_p, value_n, 2)) {
        fail(RecordFormatError, index, "the value of property %R holds \\x01 or \\x02", name);
        return -1;
    }
    if (buf_put(out, name_p, name_n) < 0 || buf_put(out, "\x01", 1) < 0 ||
        buf_put(out, value_p, value_n) < 0 || buf_put(out, "\x02", 1) < 0) {
        return -1;
    }
    return 0;
}

/* Appends a message's encoded properties to `out` after every per-message check, in the order
 * record_blocks._properties makes them. Returns how many bytes it appended, or -1. */
static Py_ssize_t put_properties(Buf *out, Py_ssize_t index, PyObject *tag, PyObject *keys,
                                 PyObject *props) {
    Py_ssize_t start = out->len;
    const char *tag_p = NULL;
    Py_ssize_t tag_n = 0;
    if (tag != Py_None) {
        if (!PyUnicode_Check(tag)) {
            fail_type(index, "tag must be str or None, not ", tag);
            return -1;
        }
        tag_p = utf8_of(tag, &tag_n, index, "tag %R", tag);
        if (tag_p == NULL) {
            return -1;
        }
        if (has_byte(tag_p, tag_n, 1) || has_byte(tag_p, tag_n, 2)) {
            fail(RecordFormatError, index, "tag %R holds \\x01 or \\x02", tag);
            return -1;
        }
    }
    if (PyUnicode_Check(keys) || PyBytes_Check(keys)) {
        fail_type(index, "keys must be a sequence of str, not ", keys);
        return -1;
    }
    PyObject *key_tuple = as_tuple(keys, index, "keys must be a sequence of str, not ");
    if (key_tuple == NULL) {
        return -1;
    }
    Py_ssize_t nkeys = PyTuple_GET_SIZE(key_tuple);
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        PyObject *key = PyTuple_GET_ITEM(key_tuple, k);
        if (!PyUnicode_Check(key)) {
            fail_type(index, "keys must be str, not ", key);
            goto error;
        }
        Py_ssize_t n;
        const char *p = utf8_of(key, &n, index, "key %R", key);
        if (p == NULL) {
            goto error;
        }
        if (n == 0) {
            fail(RecordFormatError, index, "a key is empty");
            goto error;
        }
        if (has_byte(p, n, ' ') || has_byte(p, n, 1) || has_byte(p, n, 2)) {
            fail(RecordFormatError, index, "key %R holds a space, \\x01 or \\x02", key);
            goto error;
        }
    }
    if (props != Py_None) {
        if (PyDict_Check(props)) {
            PyObject *name, *value;
            Py_ssize_t it = 0;
            /* No Python code runs while the dict is walked: put_property only reads strs. */
            while (PyDict_Next(props, &it, &name, &value)) {
                if (put_property(out, index, name, value) < 0) {
                    goto error;
                }
            }
        } else {
            int is_mapping = PyObject_IsInstance(props, MappingABC);
            if (is_mapping < 0) {
                goto error;
            }
            if (!is_mapping) {
                fail_type(index, "properties must be a mapping of str to str or None, not ",
                          props);
                goto error;
            }
            PyObject *items = PyMapping_Items(props);
            if (items == NULL) {
                goto error;
            }
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(items); k++) {
                PyObject *pair = PyList_GET_ITEM(items, k);
                if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                    Py_DECREF(items);
                    fail(PyExc_TypeError, index, "properties' items must be (name, value) pairs");
                    goto error;
                }
                if (put_property(out, index, PyTuple_GET_ITEM(pair, 0),
                                 PyTuple_GET_ITEM(pair, 1)) < 0) {
                    Py_DECREF(items);
                    goto error;
                }
            }
            Py_DECREF(items);
        }
    }
    if (tag_n > 0) {
        /* The tag's UTF-8 is cached in the str, which the caller holds: tag_p is still valid. */
        if (buf_put(out, "TAGS\x01", 5) < 0 || buf_put(out, tag_p, tag_n) < 0 ||
            buf_put(out, "\x02", 1) < 0) {
            goto error;
        }
    }
    if (nkeys > 0) {
        if (buf_put(out, "KEYS\x01", 5) < 0) {
            goto error;
        }
        for (Py_ssize_t k = 0; k < nkeys; k++) {
            Py_ssize_t n;
            const char *p = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(key_tuple, k), &n);
            if (p == NULL || (k > 0 && buf_put(out, " ", 1) < 0) || buf_put(out, p, n) < 0) {
                goto error;
            }
        }
        if (buf_put(out, "\x02", 1) < 0) {
            goto error;
        }
    }
    Py_DECREF(key_tuple);
    Py_ssize_t written = out->len - start;
    if (written > MAX_PROPERTIES_BYTES) {
        out->len = start;
        fail(RecordFormatError, index,
             "properties are %zd bytes encoded (tag and keys included), at most %d allowed",
             written, MAX_PROPERTIES_BYTES);
        return -1;
    }
    return written;
error:
    Py_DECREF(key_tuple);
    out->len = start;
    return -1;
}

/* The topic's length byte and bytes, after the checks of record_blocks._topic_prefix. */
static int topic_prefix(PyObject *topic, unsigned char *prefix, Py_ssize_t *prefix_len) {
    if (!PyUnicode_Check(topic)) {
        fail_type(-1, "topic must be str, not ", topic);
        return -1;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(topic);
    if (n == 0) {
        fail(RecordFormatError, -1, "topic is empty");
        return -1;
    }
    int kind = PyUnicode_KIND(topic);
    const void *data = PyUnicode_DATA(topic);
    Py_ssize_t size = 0; /* UTF-8 bytes, a lone surrogate counted as 3 (surrogatepass) */
    int allowed = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        size += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '%' || c == '|' || c == '_' || c == '-')) {
            allowed = 0;
        }
    }
    if (size > TOPIC_MAX_BYTES) {
        fail(RecordFormatError, -1, "topic is %zd bytes, at most %d allowed", size,
             TOPIC_MAX_BYTES);
        return -1;
    }
    if (!allowed) {
        fail(RecordFormatError, -1,
             "topic %R may hold only letters, digits, '%%', '|', '_', '-'", topic);
        return -1;
    }
    prefix[0] = (unsigned char)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        prefix[1 + i] = (unsigned char)PyUnicode_READ(kind, data, i);
    }
    *prefix_len = n + 1;
    return 0;
}

/* ------------------------------------------------------------------------------ encode_block */

typedef struct {
    const char *body;
    Py_ssize_t body_len;
    Py_ssize_t props_at, props_len;
    int64_t born;
} Planned;

static inline int plain_message(PyObject *tag, PyObject *keys, PyObject *props) {
    return props == Py_None &&
           (tag == Py_None || (PyUnicode_Check(tag) && PyUnicode_GET_LENGTH(tag) == 0)) &&
           ((PyTuple_Check(keys) && PyTuple_GET_SIZE(keys) == 0) ||
            (PyList_Check(keys) && PyList_GET_SIZE(keys) == 0));
}

static PyObject *encode_block(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames) {
    static const char *const names[] = {"topic", "queue_id", "messages"};
    PyObject *a[3];
    if (unpack_args("encode_block", names, 3, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    PyObject *topic = a[0];
    PyObject *queue_id_obj = a[1];
    PyObject *messages = a[2];
    if (ensure_configured() < 0) {
        return NULL;
    }
    unsigned char prefix[1 + TOPIC_MAX_BYTES];
    Py_ssize_t prefix_len;
    if (topic_prefix(topic, prefix, &prefix_len) < 0) {
        return NULL;
    }
    if (!PyLong_Check(queue_id_obj)) {
        return fail_type(-1, "queue id must be int, not ", queue_id_obj);
    }
    int overflow;
    long long queue_id = PyLong_AsLongLongAndOverflow(queue_id_obj, &overflow);
    if (queue_id == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow || queue_id < 0 || queue_id > I32_MAX) {
        return fail(RecordFormatError, -1, "queue id %S is out of range (0 to %lld)",
                    queue_id_obj, I32_MAX);
    }
    PyObject *msgs = as_tuple(messages, -1, "messages must be a sequence of tuples, not ");
    if (msgs == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(msgs);
    PyObject *out = NULL;
    Planned *plan = NULL;
    Buf props = {NULL, 0, 0, NULL};
    if (n == 0) {
        fail(RecordFormatError, -1, "a block holds at least one message");
        goto done;
    }
    plan = PyMem_Malloc((size_t)n * sizeof(Planned));
    if (plan == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const Py_ssize_t overhead = FIXED_OVERHEAD + prefix_len - 1;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyTuple_GET_ITEM(msgs, i);
        if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 5) {
            fail(PyExc_TypeError, -1,
                 "message %zd: not a (body, tag, keys, properties, born timestamp ms) tuple", i);
            goto done;
        }
        PyObject *body = PyTuple_GET_ITEM(m, 0);
        PyObject *tag = PyTuple_GET_ITEM(m, 1);
        PyObject *keys = PyTuple_GET_ITEM(m, 2);
        PyObject *properties = PyTuple_GET_ITEM(m, 3);
        PyObject *born = PyTuple_GET_ITEM(m, 4);
        if (!PyBytes_Check(body)) {
            fail_type(i, "body must be bytes, not ", body);
            goto done;
        }
        Planned *p = &plan[i];
        p->props_at = props.len;
        if (plain_message(tag, keys, properties)) {
            p->props_len = 0;
        } else {
            p->props_len = put_properties(&props, i, tag, keys, properties);
            if (p->props_len < 0) {
                goto done;
            }
        }
        if (!PyLong_Check(born)) {
            fail_type(i, "born timestamp must be int, not ", born);
            goto done;
        }
        long long born_ms = PyLong_AsLongLongAndOverflow(born, &overflow);
        if (born_ms == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (overflow || born_ms < 0) {
            fail(RecordFormatError, i, "born timestamp %S is out of range (0 to 2^63-1)", born);
            goto done;
        }
        p->born = born_ms;
        p->body = PyBytes_AS_STRING(body);
        p->body_len = PyBytes_GET_SIZE(body);
        long long max_body = I32_MAX - overhead - p->props_len;
        if (p->body_len > max_body) {
            fail(RecordFormatError, i, "body is %zd bytes, at most %lld allowed", p->body_len,
                 max_body);
            goto done;
        }
        total += overhead + p->body_len + p->props_len;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        goto done;
    }
    unsigned char header[HEADER_SIZE];
    memset(header, 0, sizeof header);
    put_u32(header + 4, MAGIC_V1);
    put_u32(header + 12, (uint32_t)queue_id);
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        const Planned *p = &plan[i];
        memcpy(w, header, HEADER_SIZE);
        put_u32(w, (uint32_t)(overhead + p->body_len + p->props_len));
        put_u64(w + 40, (uint64_t)p->born);
        put_u32(w + 84, (uint32_t)p->body_len);
        w += HEADER_SIZE;
        memcpy(w, p->body, (size_t)p->body_len);
        w += p->body_len;
        memcpy(w, prefix, (size_t)prefix_len);
        w += prefix_len;
        w[0] = (unsigned char)(p->props_len >> 8);
        w[1] = (unsigned char)p->props_len;
        w += 2;
        if (p->props_len) {
            memcpy(w, props.data + p->props_at, (size_t)p->props_len);
            w += p->props_len;
        }
    }
done:
    if (PyErr_Occurred()) {
        Py_CLEAR(out);
    }
    PyMem_Free(plan);
    PyMem_Free(props.data);
    Py_DECREF(msgs);
    return out;
}

static PyObject *check_message(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames) {
    static const char *const names[] = {"tag", "keys", "properties"};
    PyObject *a[3];
    if (unpack_args("check_message", names, 3, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    PyObject *tag = a[0];
    PyObject *keys = a[1];
    PyObject *props = a[2];
    if (ensure_configured() < 0) {
        return NULL;
    }
    Buf scratch = {NULL, 0, 0, NULL};
    Py_ssize_t n = put_properties(&scratch, -1, tag, keys, props);
    PyMem_Free(scratch.data);
    if (n < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------- message ids */

static void hex_upper(char *out, const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        out[2 * i] = HEX[p[i] >> 4];
        out[2 * i + 1] = HEX[p[i] & 15];
    }
}

/* prefix (hex of address + port) followed by 16 hex digits of offset, as a str. */
static PyObject *msg_id_str(const char *prefix, Py_ssize_t prefix_len, uint64_t offset) {
    PyObject *s = PyUnicode_New(prefix_len + 16, 127);
    if (s == NULL) {
        return NULL;
    }
    char *d = (char *)PyUnicode_1BYTE_DATA(s);
    memcpy(d, prefix, (size_t)prefix_len);
    for (int k = 15; k >= 0; k--) {
        d[prefix_len + k] = HEX[offset & 15];
        offset >>= 4;
    }
    return s;
}

/* hex of store address + int32 port into prefix (56 chars at most); -1 with the pure twin's
 * error when the address or port is out of range. */
static int msg_id_prefix(PyObject *host, PyObject *port_obj, char *prefix, Py_ssize_t *len) {
    Py_ssize_t n = PyBytes_GET_SIZE(host);
    int overflow;
    long long port = PyLong_AsLongLongAndOverflow(port_obj, &overflow);
    if (port == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (n != 4 && n != 16) {
        fail(RecordFormatError, -1, "store host address is %zd bytes, not 4 (IPv4) or 16 (IPv6)",
             n);
        return -1;
    }
    if (overflow || port < -I32_MAX - 1 || port > I32_MAX) {
        fail(RecordFormatError, -1, "store port %S is out of range", port_obj);
        return -1;
    }
    unsigned char raw[20];
    memcpy(raw, PyBytes_AS_STRING(host), (size_t)n);
    put_u32(raw + n, (uint32_t)port);
    hex_upper(prefix, raw, n + 4);
    *len = 2 * (n + 4);
    return 0;
}

static PyObject *make_msg_id(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
    static const char *const names[] = {"store_address", "store_port", "commitlog_offset"};
    PyObject *a[3];
    if (unpack_args("make_msg_id", names, 3, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    PyObject *address = a[0];
    PyObject *port = a[1];
    PyObject *offset_obj = a[2];
    if (ensure_configured() < 0) {
        return NULL;
    }
    if (!PyBytes_Check(address)) {
        return fail_type(-1, "store address must be bytes, not ", address);
    }
    if (!PyLong_Check(port)) {
        return fail_type(-1, "store port must be int, not ", port);
    }
    if (!PyLong_Check(offset_obj)) {
        return fail_type(-1, "commitlog offset must be int, not ", offset_obj);
    }
    char prefix[40];
    Py_ssize_t prefix_len;
    if (msg_id_prefix(address, port, prefix, &prefix_len) < 0) {
        return NULL;
    }
    int overflow;
    long long offset = PyLong_AsLongLongAndOverflow(offset_obj, &overflow);
    if (offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow || offset < 0) {
        return fail(RecordFormatError, -1, "commitlog offset %S is out of range (0 to 2^63-1)",
                    offset_obj);
    }
    return msg_id_str(prefix, prefix_len, (uint64_t)offset);
}

/* ----------------------------------------------------------------------------- block_results */

/* A sequence of ints as a tuple; the pure twin's TypeError otherwise. */
static PyObject *int_tuple(PyObject *value, const char *name) {
    PyObject *t = PySequence_Tuple(value);
    if (t == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            fail(PyExc_TypeError, -1, "%s must be a sequence of int", name);
        }
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
        if (!PyLong_Check(PyTuple_GET_ITEM(t, i))) {
            Py_DECREF(t);
            fail(PyExc_TypeError, -1, "%s must be a sequence of int", name);
            return NULL;
        }
    }
    return t;
}

/* An int argument's value; *out_of_range when it does not fit `lo`..`hi`. */
static int int_in(PyObject *v, long long lo, long long hi, long long *out, int *out_of_range) {
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = x;
    *out_of_range = overflow || x < lo || x > hi;
    return 0;
}

/* A result tuple of `cls`: `template`'s items with the three at `at` replaced (in the order
 * msg_id, queue offset, CommitLog offset, as the pure twin assigns them). Steals the three. */
static PyObject *result_of(PyTypeObject *cls, PyObject *template, const Py_ssize_t at[3],
                           PyObject *replace[3]) {
    Py_ssize_t n = PyTuple_GET_SIZE(template);
#if PY_VERSION_HEX < 0x030E0000
    /* A tuple subclass instance filled in place, as tuple.__new__(cls, items) fills it: no
     * Python call per result. (3.14 tuples cache their hash, so there it goes through
     * tuple.__new__.) */
    PyObject *r = cls->tp_alloc(cls, n);
#else
    PyObject *r = PyTuple_New(n);
#endif
    if (r == NULL) {
        for (int k = 0; k < 3; k++) {
            Py_DECREF(replace[k]);
        }
        return NULL;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *item = PyTuple_GET_ITEM(template, j);
        Py_INCREF(item);
        PyTuple_SET_ITEM(r, j, item);
    }
    for (int k = 0; k < 3; k++) {
        PyObject *old = PyTuple_GET_ITEM(r, at[k]);
        PyTuple_SET_ITEM(r, at[k], replace[k]);
        Py_DECREF(old);
    }
#if PY_VERSION_HEX >= 0x030E0000
    PyObject *call_args = PyTuple_Pack(1, r);
    Py_DECREF(r);
    if (call_args == NULL) {
        return NULL;
    }
    r = PyTuple_Type.tp_new(cls, call_args, NULL);
    Py_DECREF(call_args);
    if (r == NULL) {
        return NULL;
    }
#endif
    /* Not tracked by the garbage collector: a result holds strings, numbers and the template's
     * items (a send status, an enum member), none of which can lead back to it, so it is in no
     * cycle. An application that keeps a million results then costs the collector nothing
     * (CPython untracks such tuples itself, but only ones whose items are all untracked). */
    if (PyObject_GC_IsTracked(r)) {
        PyObject_GC_UnTrack(r);
    }
    return r;
}

/* The send results of one block: block_results' work for its 12 arguments `a`, in the pure
 * twin's order of checks (record_blocks._derive_results). The records' sizes are read from the
 * block's bytes a[3], or, when a[3] is NULL, they are sizes[0..nsizes) (a BlockBuilder's, valid
 * by construction; sizes may be NULL when nsizes is 0). */
static PyObject *derive_results(PyObject *const *a, const int32_t *sizes, Py_ssize_t nsizes) {
    PyObject *cls_obj = a[0];
    PyObject *template = a[1];
    PyObject *at_obj = a[2];
    PyObject *records = a[3];
    PyObject *fqo_obj = a[4];
    PyObject *fco_obj = a[5];
    PyObject *added_obj = a[6];
    PyObject *head_obj = a[7];
    PyObject *starts_obj = a[8];
    PyObject *offsets_obj = a[9];
    PyObject *host = a[10];
    PyObject *port = a[11];
    if (ensure_configured() < 0) {
        return NULL;
    }
    if (!PyType_Check(cls_obj) || !PyType_IsSubtype((PyTypeObject *)cls_obj, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "cls must be a tuple subclass (a NamedTuple class)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)cls_obj;
    if (!PyObject_TypeCheck(template, cls)) {
        PyObject *cls_name = PyType_GetName(cls);
        if (cls_name == NULL) {
            return NULL;
        }
        fail_type(-1, "template must be a %U, not ", template, cls_name);
        Py_DECREF(cls_name);
        return NULL;
    }
    if (!PyTuple_Check(at_obj) || PyTuple_GET_SIZE(at_obj) != 3 ||
        !PyLong_Check(PyTuple_GET_ITEM(at_obj, 0)) || !PyLong_Check(PyTuple_GET_ITEM(at_obj, 1)) ||
        !PyLong_Check(PyTuple_GET_ITEM(at_obj, 2))) {
        PyErr_SetString(PyExc_TypeError, "at must be a tuple of three field indexes");
        return NULL;
    }
    Py_ssize_t fields = PyTuple_GET_SIZE(template);
    Py_ssize_t at[3];
    for (int k = 0; k < 3; k++) {
        long long v;
        int bad;
        if (int_in(PyTuple_GET_ITEM(at_obj, k), 0, (long long)fields - 1, &v, &bad) < 0) {
            return NULL;
        }
        if (bad) {
            return fail(RecordFormatError, -1, "field index %S is out of range for %zd fields",
                        PyTuple_GET_ITEM(at_obj, k), fields);
        }
        at[k] = (Py_ssize_t)v;
    }
    if (records != NULL && !PyBytes_Check(records)) {
        return fail_type(-1, "records must be bytes, not ", records);
    }
    PyObject *const ints[4] = {fqo_obj, fco_obj, added_obj, head_obj};
    const char *const int_names[4] = {"first_queue_offset", "first_commitlog_offset",
                                      "added_bytes", "head_added_bytes"};
    for (int k = 0; k < 4; k++) {
        if (!PyLong_Check(ints[k])) {
            return fail_type(-1, "%s must be int, not ", ints[k], int_names[k]);
        }
    }
    PyObject *starts = NULL, *offsets = NULL, *out = NULL;
    starts = int_tuple(starts_obj, "file_start_indexes");
    if (starts == NULL) {
        return NULL;
    }
    offsets = int_tuple(offsets_obj, "file_start_offsets");
    if (offsets == NULL) {
        goto done;
    }
    if (!PyBytes_Check(host)) {
        fail_type(-1, "store host must be bytes, not ", host);
        goto done;
    }
    if (!PyLong_Check(port)) {
        fail_type(-1, "store port must be int, not ", port);
        goto done;
    }
    long long vals[4];
    for (int k = 0; k < 4; k++) {
        int bad;
        long long lo = k < 2 ? LLONG_MIN : 0, hi = k < 2 ? LLONG_MAX : I32_MAX;
        if (int_in(ints[k], lo, hi, &vals[k], &bad) < 0) {
            goto done;
        }
        if (bad) {
            if (k < 2) {
                fail(RecordFormatError, -1, "%s %S is out of range", int_names[k], ints[k]);
            } else {
                fail(RecordFormatError, -1, "%s %S is out of range (0 to %lld)", int_names[k],
                     ints[k], I32_MAX);
            }
            goto done;
        }
    }
    const long long first_qoff = vals[0], first_coff = vals[1], added = vals[2], head = vals[3];
    char prefix[40];
    Py_ssize_t prefix_len;
    if (msg_id_prefix(host, port, prefix, &prefix_len) < 0) {
        goto done;
    }
    Py_ssize_t nstarts = PyTuple_GET_SIZE(starts);
    if (nstarts != PyTuple_GET_SIZE(offsets)) {
        fail(RecordFormatError, -1, "file_start_indexes and file_start_offsets differ in length");
        goto done;
    }
    const unsigned char *data = NULL;
    Py_ssize_t len = 0, count = nsizes;
    if (records != NULL) {
        data = (const unsigned char *)PyBytes_AS_STRING(records);
        len = PyBytes_GET_SIZE(records);
        count = 0;
    }
    for (Py_ssize_t pos = 0; pos < len; count++) {
        Py_ssize_t avail = len - pos;
        if (avail < FIXED_OVERHEAD) {
            fail(RecordFormatError, -1,
                 "record %zd of the block: %zd bytes left, fewer than the %d of the smallest "
                 "record",
                 count, avail, FIXED_OVERHEAD);
            goto done;
        }
        int32_t size = get_i32(data + pos);
        if (size < FIXED_OVERHEAD || size > avail) {
            fail(RecordFormatError, -1,
                 "record %zd of the block: size %d does not fit the %zd bytes left", count,
                 (int)size, avail);
            goto done;
        }
        pos += size;
    }
    long long previous = -1;
    for (Py_ssize_t j = 0; j < nstarts; j++) {
        long long k, off;
        int bad;
        if (int_in(PyTuple_GET_ITEM(starts, j), previous + 1, (long long)count - 1, &k, &bad) < 0) {
            goto done;
        }
        if (bad) {
            fail(RecordFormatError, -1,
                 "file start index %S is out of order or past the block's %zd records",
                 PyTuple_GET_ITEM(starts, j), count);
            goto done;
        }
        if (int_in(PyTuple_GET_ITEM(offsets, j), 0, LLONG_MAX, &off, &bad) < 0) {
            goto done;
        }
        if (bad) {
            fail(RecordFormatError, -1, "file start offset %S is out of range",
                 PyTuple_GET_ITEM(offsets, j));
            goto done;
        }
        previous = k;
    }
    out = PyList_New(count);
    if (out == NULL) {
        goto done;
    }
    if (first_qoff < 0) { /* a duplicate stored too long ago to be remembered */
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *replace[3] = {EmptyStr, PyLong_FromLong(-1), PyLong_FromLong(-1)};
            Py_INCREF(EmptyStr);
            PyObject *r = result_of(cls, template, at, replace);
            if (r == NULL) {
                goto done;
            }
            PyList_SET_ITEM(out, i, r);
        }
        goto done;
    }
    if (first_coff < 0) {
        fail(RecordFormatError, -1, "first_commitlog_offset %S is out of range", fco_obj);
        goto done;
    }
    if (count > 0 && first_qoff > LLONG_MAX - (count - 1)) {
        fail(RecordFormatError, -1, "queue offsets run past 2^63-1");
        goto done;
    }
    /* pos past 2^63-1 is an error only where a record would start there, as in the twin. */
    long long pos = first_coff;
    int pos_overflow = 0;
    Py_ssize_t next_start = 0, at_byte = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (next_start < nstarts &&
            PyLong_AsLongLong(PyTuple_GET_ITEM(starts, next_start)) == (long long)i) {
            pos = PyLong_AsLongLong(PyTuple_GET_ITEM(offsets, next_start));
            pos_overflow = 0;
            next_start++;
        }
        if (pos_overflow) {
            fail(RecordFormatError, -1, "CommitLog offsets run past 2^63-1");
            goto done;
        }
        PyObject *replace[3] = {msg_id_str(prefix, prefix_len, (uint64_t)pos),
                                PyLong_FromLongLong(first_qoff + i), PyLong_FromLongLong(pos)};
        if (replace[0] == NULL || replace[1] == NULL || replace[2] == NULL) {
            for (int k = 0; k < 3; k++) {
                Py_XDECREF(replace[k]);
            }
            goto done;
        }
        PyObject *r = result_of(cls, template, at, replace);
        if (r == NULL) {
            goto done;
        }
        PyList_SET_ITEM(out, i, r);
        const int32_t size = records == NULL ? sizes[i] : get_i32(data + at_byte);
        long long step = (long long)size + added + (i == 0 ? head : 0);
        at_byte += size;
        if (pos > LLONG_MAX - step) {
            pos_overflow = 1;
        } else {
            pos += step;
        }
    }
done:
    Py_XDECREF(starts);
    Py_XDECREF(offsets);
    if (PyErr_Occurred()) {
        Py_CLEAR(out);
    }
    return out;
}

static PyObject *block_results(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames) {
    static const char *const names[] = {
        "cls", "template", "at", "records", "first_queue_offset", "first_commitlog_offset",
        "added_bytes", "head_added_bytes", "file_start_indexes", "file_start_offsets",
        "store_host", "store_port",
    };
    PyObject *a[12];
    if (unpack_args("block_results", names, 12, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    return derive_results(a, NULL, 0);
}

/* ---------------------------------------------------------------------------- decode_records */

typedef struct {
    const char *raw;
    Py_ssize_t len;
    PyObject *text;
} TextEntry;

typedef struct {
    unsigned char raw[20]; /* address + port as the record holds them */
    int len;
    PyObject *text;
} HostEntry;

typedef struct {
    HostEntry hosts[HOST_CACHE];
    int nhosts, next_host;
    TextEntry topics[TOPIC_CACHE];
    int ntopics, next_topic;
    TextEntry tags[TOPIC_CACHE];
    int ntags, next_tag;
    unsigned char id_raw[20];
    int id_raw_len;
    char id_prefix[40];
    /* The last born and store timestamps: a pull's records often share them (one producer
     * batch, one store), and an int is immutable, so one object serves them all. */
    long long born_ms, store_ms;
    PyObject *born_obj, *store_obj;
} DecodeCache;

static void cache_clear(DecodeCache *c) {
    for (int i = 0; i < c->nhosts; i++) {
        Py_DECREF(c->hosts[i].text);
    }
    for (int i = 0; i < c->ntopics; i++) {
        Py_DECREF(c->topics[i].text);
    }
    for (int i = 0; i < c->ntags; i++) {
        Py_DECREF(c->tags[i].text);
    }
    Py_XDECREF(c->born_obj);
    Py_XDECREF(c->store_obj);
}

static PyObject *cached_int(long long v, long long *last, PyObject **obj) {
    if (*obj == NULL || *last != v) {
        PyObject *fresh = PyLong_FromLongLong(v);
        if (fresh == NULL) {
            return NULL;
        }
        Py_XSETREF(*obj, fresh);
        *last = v;
    }
    Py_INCREF(*obj);
    return *obj;
}

/* "a.b.c.d:port" or "[v6]:port", as the broker's host_str writes it; a new reference. */
static PyObject *host_text(DecodeCache *c, const unsigned char *raw, int len) {
    for (int i = 0; i < c->nhosts; i++) {
        if (c->hosts[i].len == len && memcmp(c->hosts[i].raw, raw, (size_t)len) == 0) {
            Py_INCREF(c->hosts[i].text);
            return c->hosts[i].text;
        }
    }
    int port = (int)get_i32(raw + len - 4);
    PyObject *text;
    if (len == 8) {
        char s[32];
        snprintf(s, sizeof s, "%u.%u.%u.%u:%d", raw[0], raw[1], raw[2], raw[3], port);
        text = PyUnicode_FromString(s);
    } else {
        PyObject *address = PyBytes_FromStringAndSize((const char *)raw, 16);
        if (address == NULL) {
            return NULL;
        }
        PyObject *v6 = PyObject_CallOneArg(Ipv6Text, address);
        Py_DECREF(address);
        if (v6 == NULL) {
            return NULL;
        }
        if (!PyUnicode_Check(v6)) {
            Py_DECREF(v6);
            PyErr_SetString(PyExc_TypeError, "ipv6_text must return str");
            return NULL;
        }
        text = PyUnicode_FromFormat("[%U]:%d", v6, port);
        Py_DECREF(v6);
    }
    if (text == NULL) {
        return NULL;
    }
    HostEntry *e;
    if (c->nhosts < HOST_CACHE) {
        e = &c->hosts[c->nhosts++];
    } else {
        e = &c->hosts[c->next_host];
        c->next_host = (c->next_host + 1) % HOST_CACHE;
        Py_DECREF(e->text);
    }
    memcpy(e->raw, raw, (size_t)len);
    e->len = len;
    Py_INCREF(text);
    e->text = text;
    return text;
}

/* UTF-8 text (errors replaced) decoded once per call for bytes that repeat (topics, tags). */
static PyObject *cached_text(TextEntry *entries, int *n, int *next, const char *raw,
                             Py_ssize_t len) {
    for (int i = 0; i < *n; i++) {
        if (entries[i].len == len && memcmp(entries[i].raw, raw, (size_t)len) == 0) {
            Py_INCREF(entries[i].text);
            return entries[i].text;
        }
    }
    PyObject *text = PyUnicode_DecodeUTF8(raw, len, "replace");
    if (text == NULL) {
        return NULL;
    }
    int slot;
    if (*n < TOPIC_CACHE) {
        slot = (*n)++;
    } else {
        slot = *next;
        *next = (*next + 1) % TOPIC_CACHE;
        Py_DECREF(entries[slot].text);
    }
    entries[slot].raw = raw; /* points into the records, which live for the whole call */
    entries[slot].len = len;
    Py_INCREF(text);
    entries[slot].text = text;
    return text;
}

static inline int name_is(const char *p, Py_ssize_t n, const char *name) {
    size_t len = strlen(name);
    return (size_t)n == len && memcmp(p, name, len) == 0;
}

/* The properties of one record as a reader gets them (tag, keys and the rest; the broker's own
 * dropped), with record_blocks.decode_records_py's rules. New references in *tag, *keys,
 * *props. */
static int decode_properties(DecodeCache *c, const char *p, Py_ssize_t n, PyObject **tag,
                             PyObject **keys, PyObject **props) {
    PyObject *d = PyDict_New();
    if (d == NULL) {
        return -1;
    }
    const char *tag_p = NULL, *keys_p = NULL;
    Py_ssize_t tag_n = 0, keys_n = 0;
    int has_keys = 0;
    const char *end = p + n;
    while (p < end) {
        const char *item_end = memchr(p, 2, (size_t)(end - p));
        if (item_end == NULL) {
            item_end = end;
        }
        const char *sep = memchr(p, 1, (size_t)(item_end - p));
        if (sep != NULL) {
            Py_ssize_t name_n = sep - p;
            const char *value = sep + 1;
            Py_ssize_t value_n = item_end - value;
            if (name_is(p, name_n, "TAGS")) {
                tag_p = value;
                tag_n = value_n;
            } else if (name_is(p, name_n, "KEYS")) {
                keys_p = value;
                keys_n = value_n;
                has_keys = 1;
            } else if (!name_is(p, name_n, "__CRC32H") && !name_is(p, name_n, "__CRC32#") &&
                       !name_is(p, name_n, "PRODUCER_SEQ")) {
                PyObject *name = PyUnicode_DecodeUTF8(p, name_n, "replace");
                if (name == NULL) {
                    goto error;
                }
                PyObject *text = PyUnicode_DecodeUTF8(value, value_n, "replace");
                if (text == NULL) {
                    Py_DECREF(name);
                    goto error;
                }
                int rc = PyDict_SetItem(d, name, text);
                Py_DECREF(name);
                Py_DECREF(text);
                if (rc < 0) {
                    goto error;
                }
            }
        }
        p = item_end + 1;
    }
    if (tag_n > 0) {
        *tag = cached_text(c->tags, &c->ntags, &c->next_tag, tag_p, tag_n);
        if (*tag == NULL) {
            goto error;
        }
    } else {
        Py_INCREF(Py_None);
        *tag = Py_None;
    }
    Py_ssize_t nkeys = 0;
    if (has_keys) {
        for (Py_ssize_t i = 0; i < keys_n; i++) {
            if (keys_p[i] != ' ' && (i == 0 || keys_p[i - 1] == ' ')) {
                nkeys++;
            }
        }
    }
    *keys = PyTuple_New(nkeys);
    if (*keys == NULL) {
        Py_DECREF(*tag);
        goto error;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; k < nkeys && i < keys_n;) {
        if (keys_p[i] == ' ') {
            i++;
            continue;
        }
        Py_ssize_t j = i;
        while (j < keys_n && keys_p[j] != ' ') {
            j++;
        }
        PyObject *key = PyUnicode_DecodeUTF8(keys_p + i, j - i, "replace");
        if (key == NULL) {
            Py_DECREF(*tag);
            Py_DECREF(*keys);
            goto error;
        }
        PyTuple_SET_ITEM(*keys, k++, key);
        i = j;
    }
    if (nkeys > 0) {
        /* Strs only: the collector would untrack it at its first pass (_PyTuple_MaybeUntrack). */
        PyObject_GC_UnTrack(*keys);
    }
    *props = d;
    return 0;
error:
    Py_DECREF(d);
    return -1;
}

#define RECORD_FAIL(...)                                                                     \
    do {                                                                                     \
        PyObject *where_ = PyUnicode_FromFormat("record %zd at byte %zd: ", index, pos);     \
        if (where_ != NULL) {                                                                \
            PyObject *what_ = PyUnicode_FromFormat(__VA_ARGS__);                             \
            if (what_ != NULL) {                                                             \
                fail(RecordFormatError, -1, "%U%U", where_, what_);                          \
                Py_DECREF(what_);                                                            \
            }                                                                                \
            Py_DECREF(where_);                                                               \
        }                                                                                    \
        goto done;                                                                           \
    } while (0)

/* Where decode_records puts each value in an instance of a class without __dict__. */
typedef struct {
    Py_ssize_t field_off[F_COUNT];
    Py_ssize_t ncommon;
    Py_ssize_t *common_off;     /* NULL: the class has a __dict__ (no plan) */
    PyObject **common_values;   /* borrowed from the caller's common dict */
} SlotPlan;

/* The offset of the object slot `name` of `cls` (a member descriptor found on the class), or
 * -1 with TypeError. */
static Py_ssize_t slot_offset(PyTypeObject *cls, PyObject *name) {
    PyObject *d = _PyType_Lookup(cls, name); /* borrowed */
    if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if ((m->type == T_OBJECT_EX || m->type == T_OBJECT) && !(m->flags & READONLY)) {
            return m->offset;
        }
    }
    PyObject *cls_name = PyType_GetName(cls);
    if (cls_name != NULL) {
        PyErr_Format(PyExc_TypeError, "%U has neither a __dict__ nor a slot %R", cls_name, name);
        Py_DECREF(cls_name);
    }
    return -1;
}

static void slot_plan_free(SlotPlan *plan) {
    PyMem_Free(plan->common_off);
    PyMem_Free(plan->common_values);
    plan->common_off = NULL;
    plan->common_values = NULL;
}

static int slot_plan(PyTypeObject *cls, PyObject *common, SlotPlan *plan) {
    Py_ssize_t n = PyDict_GET_SIZE(common);
    plan->ncommon = n;
    plan->common_off = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    plan->common_values = PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyObject *));
    if (plan->common_off == NULL || plan->common_values == NULL) {
        slot_plan_free(plan);
        PyErr_NoMemory();
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t i = 0, k = 0;
    while (PyDict_Next(common, &i, &key, &value)) {
        Py_ssize_t off = slot_offset(cls, key);
        if (off < 0) {
            slot_plan_free(plan);
            return -1;
        }
        plan->common_off[k] = off;
        plan->common_values[k++] = value;
    }
    for (int f = 0; f < F_COUNT; f++) {
        if ((plan->field_off[f] = slot_offset(cls, FieldKeys[f])) < 0) {
            slot_plan_free(plan);
            return -1;
        }
    }
    return 0;
}

static PyObject *decode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    static const char *const names[] = {"cls", "common", "records"};
    PyObject *a[3];
    if (unpack_args("decode_records", names, 3, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    PyObject *cls_obj = a[0];
    PyObject *common = a[1];
    PyObject *records = a[2];
    if (ensure_configured() < 0) {
        return NULL;
    }
    if (!PyType_Check(cls_obj)) {
        return fail_type(-1, "cls must be a class, not ", cls_obj);
    }
    PyTypeObject *cls = (PyTypeObject *)cls_obj;
    const char *cls_problem = NULL;
    if (cls->tp_new != PyBaseObject_Type.tp_new) {
        cls_problem = "%U is not created by object.__new__";
    } else if (PyType_HasFeature(cls, Py_TPFLAGS_IS_ABSTRACT)) {
        cls_problem = "%U is abstract";
    }
    if (cls_problem != NULL) {
        PyObject *name = PyType_GetName(cls);
        if (name != NULL) {
            fail(PyExc_TypeError, -1, cls_problem, name);
            Py_DECREF(name);
        }
        return NULL;
    }
    if (!PyDict_Check(common)) {
        return fail_type(-1, "common must be a dict, not ", common);
    }
    if (!PyBytes_Check(records)) {
        return fail_type(-1, "records must be bytes, not ", records);
    }
    /* A class whose instances have no __dict__ (a dataclass with slots): the values go
     * straight into the slots, found once per call (common's names, then the fields). */
    SlotPlan slots = {0};
    if (cls->tp_dictoffset == 0 && slot_plan(cls, common, &slots) < 0) {
        return NULL;
    }
    /* Every record's __dict__ starts as a copy of this one: common's items, then each field
     * name (bound to None until the record's value replaces it), so no copy ever resizes. */
    PyObject *base = PyDict_Copy(common);
    if (base == NULL) {
        slot_plan_free(&slots);
        return NULL;
    }
    for (int f = 0; f < F_COUNT; f++) {
        if (PyDict_SetItem(base, FieldKeys[f], Py_None) < 0) {
            Py_DECREF(base);
            return NULL;
        }
    }
    PyObject *out = PyList_New(0);
    DecodeCache cache;
    memset(&cache, 0, sizeof cache);
    if (out == NULL) {
        Py_DECREF(base);
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(records);
    const Py_ssize_t len = PyBytes_GET_SIZE(records);
    Py_ssize_t pos = 0, index = 0;
    while (pos < len) {
        const Py_ssize_t avail = len - pos;
        const unsigned char *r = data + pos;
        if (avail < FIXED_OVERHEAD) {
            RECORD_FAIL("%zd bytes left, fewer than the %d of the smallest record", avail,
                        FIXED_OVERHEAD);
        }
        int32_t size = get_i32(r);
        uint32_t magic = get_u32(r + 4);
        if (magic != MAGIC_V1 && magic != MAGIC_V2) {
            char hex[16];
            snprintf(hex, sizeof hex, "0x%08X", (unsigned)magic);
            RECORD_FAIL("bad magic %s", hex);
        }
        int32_t sys_flag = get_i32(r + 36);
        const int born_len = (sys_flag & SYSFLAG_BORNHOST_V6) ? 16 : 4;
        const int store_len = (sys_flag & SYSFLAG_STOREHOST_V6) ? 16 : 4;
        const Py_ssize_t header = HEADER_SIZE + (born_len - 4) + (store_len - 4);
        const int topic_len_size = magic == MAGIC_V2 ? 2 : 1;
        const Py_ssize_t smallest = header + topic_len_size + 2;
        if (size < smallest) {
            RECORD_FAIL("size %d is below the %zd of its fields", (int)size, smallest);
        }
        if (size > avail) {
            RECORD_FAIL("size %d runs past the %zd bytes left", (int)size, avail);
        }
        /* From here every read is inside [r, r + size). */
        const unsigned char *store_at = r + 52 + born_len + 8;
        int32_t body_len = get_i32(r + header - 4);
        if (body_len < 0 || header + (Py_ssize_t)body_len + topic_len_size + 2 > size) {
            RECORD_FAIL("body length %d runs past the record", (int)body_len);
        }
        const unsigned char *topic_len_at = r + header + body_len;
        int topic_len = topic_len_size == 2 ? get_i16(topic_len_at) : topic_len_at[0];
        const unsigned char *topic_at = topic_len_at + topic_len_size;
        if (topic_len < 0 || (topic_at - r) + topic_len + 2 > size) {
            RECORD_FAIL("topic length %d runs past the record", topic_len);
        }
        const unsigned char *props_len_at = topic_at + topic_len;
        int props_len = get_i16(props_len_at);
        if ((props_len_at - r) + 2 + props_len != size) {
            RECORD_FAIL("properties length %d does not match the record's size", props_len);
        }
        if (props_len && r[size - 1] != 0x02) {
            RECORD_FAIL("properties do not end with 0x02");
        }
        int64_t phy = get_i64(r + 28);
        if (phy < 0) {
            RECORD_FAIL("PHYSICALOFFSET %lld is negative", (long long)phy);
        }

        PyObject *values[F_COUNT] = {NULL};
        values[F_TOPIC] = cached_text(cache.topics, &cache.ntopics, &cache.next_topic,
                                      (const char *)topic_at, topic_len);
        values[F_QUEUE_ID] = PyLong_FromLong(get_i32(r + 12));
        values[F_QUEUE_OFFSET] = PyLong_FromLongLong(get_i64(r + 20));
        values[F_BODY] = PyBytes_FromStringAndSize((const char *)r + header, body_len);
        values[F_BORN_TS] = cached_int(get_i64(r + 40), &cache.born_ms, &cache.born_obj);
        values[F_STORE_TS] =
            cached_int(get_i64(r + 52 + born_len), &cache.store_ms, &cache.store_obj);
        values[F_COMMITLOG_OFFSET] = PyLong_FromLongLong(phy);
        values[F_BORN_HOST] = host_text(&cache, r + 48, born_len + 4);
        values[F_STORE_HOST] = host_text(&cache, store_at, store_len + 4);
        values[F_RECONSUME] = PyLong_FromLong(get_i32(store_at + store_len + 4));
        if (cache.id_raw_len != store_len + 4 ||
            memcmp(cache.id_raw, store_at, (size_t)store_len + 4) != 0) {
            memcpy(cache.id_raw, store_at, (size_t)store_len + 4);
            cache.id_raw_len = store_len + 4;
            hex_upper(cache.id_prefix, store_at, store_len + 4);
        }
        values[F_MSG_ID] = msg_id_str(cache.id_prefix, 2 * cache.id_raw_len, (uint64_t)phy);
        int ok = 1;
        for (int f = 0; f < F_COUNT; f++) {
            if (f != F_TAG && f != F_KEYS && f != F_PROPERTIES && values[f] == NULL) {
                ok = 0;
            }
        }
        if (ok) {
            if (props_len) {
                ok = decode_properties(&cache, (const char *)props_len_at + 2, props_len,
                                       &values[F_TAG], &values[F_KEYS],
                                       &values[F_PROPERTIES]) == 0;
            } else {
                Py_INCREF(Py_None);
                values[F_TAG] = Py_None;
                values[F_KEYS] = PyTuple_New(0);
                values[F_PROPERTIES] = PyDict_New();
                ok = values[F_KEYS] != NULL && values[F_PROPERTIES] != NULL;
            }
        }
        PyObject *obj = NULL, *dict = NULL;
        if (ok && slots.common_off != NULL) {
            /* No Python code runs between the allocation and the last store: the instance is
             * seen by nobody before every slot holds its value. */
            obj = cls->tp_alloc(cls, 0);
            ok = obj != NULL;
            for (Py_ssize_t k = 0; ok && k < slots.ncommon; k++) {
                *(PyObject **)((char *)obj + slots.common_off[k]) =
                    Py_NewRef(slots.common_values[k]);
            }
            for (int f = 0; ok && f < F_COUNT; f++) {
                *(PyObject **)((char *)obj + slots.field_off[f]) = values[f]; /* stolen */
                values[f] = NULL;
            }
            ok = ok && PyList_Append(out, obj) == 0;
            for (int f = 0; f < F_COUNT; f++) {
                Py_XDECREF(values[f]);
            }
            Py_XDECREF(obj);
            if (!ok) {
                goto done;
            }
            pos += size;
            index++;
            continue;
        }
        if (ok) {
            dict = PyDict_Copy(base);
            ok = dict != NULL;
        }
        for (int f = 0; ok && f < F_COUNT; f++) {
            ok = PyDict_SetItem(dict, FieldKeys[f], values[f]) == 0;
        }
        for (int f = 0; f < F_COUNT; f++) {
            Py_XDECREF(values[f]);
        }
        if (ok) {
            /* object.__new__(cls) without its argument checks (cls was checked above), and the
             * instance's __dict__ set as a whole: the frozen dataclass's __init__ is not run. */
            obj = cls->tp_alloc(cls, 0);
            ok = obj != NULL && PyObject_GenericSetDict(obj, dict, NULL) == 0 &&
                 PyList_Append(out, obj) == 0;
        }
        Py_XDECREF(dict);
        Py_XDECREF(obj);
        if (!ok) {
            goto done;
        }
        pos += size;
        index++;
    }
done:
    cache_clear(&cache);
    Py_DECREF(base);
    slot_plan_free(&slots);
    if (PyErr_Occurred()) {
        Py_CLEAR(out);
    }
    return out;
}

/* ------------------------------------------------------------------------------ BlockBuilder */

static PyTypeObject RecordRefType;
static PyObject *recordref_make(PyTypeObject *type, PyObject *owner, long long index);

/* The buffer's first size and the sizes array's first length; both grow geometrically. */
#define BUILDER_FIRST_BYTES 4096
#define BUILDER_FIRST_RECORDS 64
/* The most the buffer grows to at once on a guess of the block's final size. */
#define BUILDER_MAX_GUESS (4LL << 20)
/* Indexes below this are returned as shared int objects: a block holds at most 1024 records
 * (the broker's limit), and making and freeing an int per append costs more than the append's
 * header. */
#define SHARED_INDEXES 1024
static PyObject *SharedIndexes[SHARED_INDEXES];

typedef struct {
    PyObject_HEAD
    /* The records as appended (QUEUEID 0), in a bytes object of `cap` bytes that nothing else
     * refers to, so it is written in place: the first records() shrinks it to `len` and answers
     * with it, without copying the block. NULL before the first append, and once records() or
     * release() took it. */
    PyObject *buf;
    Py_ssize_t len, cap;  /* len: the block's size, kept when buf is gone */
    int32_t *sizes;       /* each record's TOTALSIZE: all results() needs after release() */
    Py_ssize_t count, sizes_cap;
    long long max_records, max_bytes;
    PyObject *records;       /* the last records(q) answer (bytes), for queue records_queue */
    long long records_queue;
    Py_ssize_t overhead;     /* a record's size less its body and properties */
    Py_ssize_t prefix_len;
    unsigned char prefix[1 + TOPIC_MAX_BYTES]; /* TOPIC LENGTH and TOPIC, as every record has */
    char sealed, released;
} BlockBuilderObject;

static PyObject *builder_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"topic", "max_records", "max_bytes", NULL};
    PyObject *topic, *limit_objs[2];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:BlockBuilder", kwlist, &topic,
                                     &limit_objs[0], &limit_objs[1])) {
        return NULL;
    }
    if (ensure_configured() < 0) {
        return NULL;
    }
    unsigned char prefix[1 + TOPIC_MAX_BYTES];
    Py_ssize_t prefix_len;
    if (topic_prefix(topic, prefix, &prefix_len) < 0) {
        return NULL;
    }
    static const char *const limit_names[2] = {"max_records", "max_bytes"};
    long long limits[2];
    for (int k = 0; k < 2; k++) {
        if (!PyLong_Check(limit_objs[k])) {
            return fail_type(-1, "%s must be int, not ", limit_objs[k], limit_names[k]);
        }
        int bad;
        if (int_in(limit_objs[k], 1, I32_MAX, &limits[k], &bad) < 0) {
            return NULL;
        }
        if (bad) {
            return fail(PyExc_ValueError, -1, "%s %S is out of range (1 to %lld)", limit_names[k],
                        limit_objs[k], I32_MAX);
        }
    }
    BlockBuilderObject *self = (BlockBuilderObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    memcpy(self->prefix, prefix, (size_t)prefix_len);
    self->prefix_len = prefix_len;
    self->overhead = FIXED_OVERHEAD + prefix_len - 1;
    self->max_records = limits[0];
    self->max_bytes = limits[1];
    return (PyObject *)self;
}

static void builder_dealloc(BlockBuilderObject *self) {
    Py_XDECREF(self->buf);
    PyMem_Free(self->sizes);
    Py_XDECREF(self->records);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Room for one more record of `need` bytes, growing both arrays geometrically. Only memory is
 * allocated, copied and freed (no GC object, so no Python code runs), which keeps append()
 * atomic. -1 with MemoryError and the builder unchanged. */
static int builder_reserve(BlockBuilderObject *self, Py_ssize_t need) {
    if (self->count == self->sizes_cap) {
        Py_ssize_t cap = BUILDER_FIRST_RECORDS;
        if (self->sizes_cap > 0) {
            if (self->sizes_cap > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(int32_t)) {
                PyErr_NoMemory();
                return -1;
            }
            cap = self->sizes_cap * 2;
        }
        int32_t *sizes = PyMem_Realloc(self->sizes, (size_t)cap * sizeof(int32_t));
        if (sizes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->sizes = sizes;
        self->sizes_cap = cap;
    }
    if (need > self->cap - self->len) {
        if (need > PY_SSIZE_T_MAX - self->len) {
            PyErr_NoMemory();
            return -1;
        }
        const Py_ssize_t want = self->len + need;
        Py_ssize_t cap = BUILDER_FIRST_BYTES;
        if (self->cap > 0) {
            cap = self->cap > PY_SSIZE_T_MAX / 2 ? want : self->cap * 2;
            /* A doubling buffer is copied again at each growth, about once more in all.
             * Growing at once to the block's likely final size, full by count (at the mean
             * record size so far) or by bytes (one record past max_bytes at most), copies it
             * once, small. */
            const long long mean = (long long)want / (long long)(self->count + 1);
            long long guess = mean > BUILDER_MAX_GUESS / self->max_records
                                  ? BUILDER_MAX_GUESS
                                  : mean * self->max_records;
            if (guess > self->max_bytes + (long long)need) {
                guess = self->max_bytes + (long long)need;
            }
            if (guess > BUILDER_MAX_GUESS) {
                guess = BUILDER_MAX_GUESS;
            }
            if (guess > (long long)cap) {
                cap = (Py_ssize_t)guess;
            }
        }
        if (cap < want) {
            cap = want;
        }
        /* A new buffer and a copy, not _PyBytes_Resize, which frees the old one when it fails. */
        PyObject *buf = PyBytes_FromStringAndSize(NULL, cap);
        if (buf == NULL) {
            return -1;
        }
        if (self->len > 0) {
            memcpy(PyBytes_AS_STRING(buf), PyBytes_AS_STRING(self->buf), (size_t)self->len);
        }
        Py_XSETREF(self->buf, buf); /* a bytes object: freeing it runs no Python code */
        self->cap = cap;
    }
    return 0;
}

static PyObject *builder_append(BlockBuilderObject *self, PyObject *const *args,
                                Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"body", "tag", "keys", "properties", "born_ms"};
    PyObject *a[5];
    if (kwnames == NULL && nargs == 4) { /* the SDK's call: the clock gives the born time */
        memcpy(a, args, 4 * sizeof *a);
        a[4] = NULL;
    } else if (unpack_some_args("append", names, 5, 4, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    PyObject *body = a[0], *tag = a[1], *keys = a[2], *props = a[3], *born = a[4];
    if (!PyBytes_Check(body)) {
        return fail_type(-1, "body must be bytes, not ", body);
    }
    /* The properties are checked and encoded into this call's own scratch first: checking a
     * Mapping that is not a dict, or keys that are not a list or tuple, runs Python code, during
     * which another thread may append to or seal this builder. */
    char stack[512];
    Buf scratch = {stack, 0, sizeof stack, stack};
    Py_ssize_t props_len = 0;
    PyObject *result = NULL;
    if (!plain_message(tag, keys, props)) {
        props_len = put_properties(&scratch, -1, tag, keys, props);
        if (props_len < 0) {
            goto done;
        }
    }
    long long born_ms;
    if (born == NULL || born == Py_None) {
        struct timespec now;
        if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        born_ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    } else {
        if (!PyLong_Check(born)) {
            fail_type(-1, "born timestamp must be int, not ", born);
            goto done;
        }
        int overflow;
        born_ms = PyLong_AsLongLongAndOverflow(born, &overflow);
        if (born_ms == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (overflow || born_ms < 0) {
            fail(RecordFormatError, -1, "born timestamp %S is out of range (0 to 2^63-1)", born);
            goto done;
        }
    }
    const Py_ssize_t body_len = PyBytes_GET_SIZE(body);
    const long long max_body = I32_MAX - self->overhead - props_len;
    if (body_len > max_body) {
        fail(RecordFormatError, -1, "body is %zd bytes, at most %lld allowed", body_len, max_body);
        goto done;
    }
    /* From the seal check to the end no Python code runs: only memory is allocated, copied and
     * freed (PyMem_Realloc, bytes and int objects, none of them a GC object, so no collection
     * and no finalizer can start), so with the GIL held the check and the append are one step
     * for every other thread: a record lands before a seal() or not at all. */
    if (self->sealed) {
        result = PyLong_FromLong(-1);
        goto done;
    }
    const Py_ssize_t size = self->overhead + body_len + props_len;
    if (builder_reserve(self, size) < 0) {
        goto done;
    }
    if (self->count < SHARED_INDEXES) {
        result = Py_NewRef(SharedIndexes[self->count]);
    } else {
        result = PyLong_FromSsize_t(self->count); /* not a GC object: no Python code runs */
        if (result == NULL) {
            goto done; /* nothing appended yet */
        }
    }
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(self->buf) + self->len;
    memset(w, 0, HEADER_SIZE); /* QUEUEID 0: records(queue_id) writes the queue */
    put_u32(w, (uint32_t)size);
    put_u32(w + 4, MAGIC_V1);
    put_u64(w + 40, (uint64_t)born_ms);
    put_u32(w + 84, (uint32_t)body_len);
    w += HEADER_SIZE;
    memcpy(w, PyBytes_AS_STRING(body), (size_t)body_len);
    w += body_len;
    memcpy(w, self->prefix, (size_t)self->prefix_len);
    w += self->prefix_len;
    w[0] = (unsigned char)(props_len >> 8);
    w[1] = (unsigned char)props_len;
    if (props_len > 0) {
        memcpy(w + 2, scratch.data, (size_t)props_len);
    }
    self->sizes[self->count++] = (int32_t)size;
    self->len += size;
done:
    buf_free(&scratch);
    return result;
}

/* add(ref_class, owner, body, tag, keys, properties): append() answered as a ref_class(owner,
 * index) made here (the SDK's future of the message, one call instead of two), or None when the
 * block is sealed (nothing appended). */
static PyObject *builder_add(BlockBuilderObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "add() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *cls = args[0];
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &RecordRefType) ||
        PyType_HasFeature((PyTypeObject *)cls, Py_TPFLAGS_IS_ABSTRACT)) {
        return fail_type(-1, "ref_class must be a concrete RecordRef class, not ", cls);
    }
    PyObject *index = builder_append(self, args + 2, 4, NULL);
    if (index == NULL) {
        return NULL;
    }
    long long i = PyLong_AsLongLong(index);
    Py_DECREF(index);
    if (i < 0) {
        Py_RETURN_NONE;
    }
    return recordref_make((PyTypeObject *)cls, args[1], i);
}

static PyObject *builder_seal(BlockBuilderObject *self, PyObject *unused) {
    if (self->sealed) {
        Py_RETURN_FALSE;
    }
    self->sealed = 1;
    Py_RETURN_TRUE;
}

static PyObject *builder_records(BlockBuilderObject *self, PyObject *queue_obj) {
    if (!self->sealed) {
        return fail(PyExc_RuntimeError, -1, "the block is not sealed");
    }
    if (self->released) {
        return fail(PyExc_RuntimeError, -1, "the block was released");
    }
    if (!PyLong_Check(queue_obj)) {
        return fail_type(-1, "queue id must be int, not ", queue_obj);
    }
    long long queue_id;
    int bad;
    if (int_in(queue_obj, 0, I32_MAX, &queue_id, &bad) < 0) {
        return NULL;
    }
    if (bad) {
        return fail(RecordFormatError, -1, "queue id %S is out of range (0 to %lld)", queue_obj,
                    I32_MAX);
    }
    if (self->count == 0) {
        return fail(RecordFormatError, -1, "a block holds at least one message");
    }
    if (self->records != NULL && self->records_queue == queue_id) {
        return Py_NewRef(self->records);
    }
    PyObject *out;
    if (self->buf == NULL) {
        /* Asked for another queue: a copy of the last answer (the same bytes but the QUEUEIDs).
         * There is one: records were appended, and their buffer goes only to records(), which
         * keeps its answer, or to release(), refused above. */
        if (self->records == NULL) {
            return fail(PyExc_RuntimeError, -1, "the block's records are gone");
        }
        out = PyBytes_FromStringAndSize(PyBytes_AS_STRING(self->records), self->len);
    } else if (self->cap - self->len <= (self->len / 4 > 4096 ? self->len / 4 : 4096)) {
        /* The buffer itself becomes the answer, its unused tail (at most a fifth of it) left
         * allocated: what _PyBytes_Resize does but the realloc, which may fail and free it. No
         * one else has seen it, so its size may still change. */
        out = self->buf;
        self->buf = NULL;
        Py_SET_SIZE(out, self->len);
        PyBytes_AS_STRING(out)[self->len] = '\0';
    } else {
        /* Mostly unused (sealed early): a copy of the records is smaller and cheap. */
        out = PyBytes_FromStringAndSize(PyBytes_AS_STRING(self->buf), self->len);
        if (out != NULL) {
            Py_CLEAR(self->buf);
        }
    }
    if (out == NULL) {
        return NULL;
    }
    self->cap = 0;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < self->count; i++) {
        put_u32(w + at + 12, (uint32_t)queue_id);
        at += self->sizes[i];
    }
    Py_XSETREF(self->records, Py_NewRef(out));
    self->records_queue = queue_id;
    return out;
}

static PyObject *builder_results(BlockBuilderObject *self, PyObject *const *args,
                                 Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {
        "cls", "template", "at", "first_queue_offset", "first_commitlog_offset", "added_bytes",
        "head_added_bytes", "file_start_indexes", "file_start_offsets", "store_host",
        "store_port",
    };
    PyObject *b[11];
    if (unpack_args("results", names, 11, args, nargs, kwnames, b) < 0) {
        return NULL;
    }
    if (!self->sealed) {
        return fail(PyExc_RuntimeError, -1, "the block is not sealed");
    }
    PyObject *const a[12] = {b[0], b[1], b[2], NULL, b[3], b[4], b[5], b[6], b[7], b[8], b[9],
                             b[10]};
    /* Python code may run in there (iterating the file start sequences, allocating results),
     * and may release() this builder: the sizes stay until it is freed, and the caller's
     * reference keeps it alive. */
    return derive_results(a, self->sizes, self->count);
}

static PyObject *builder_release(BlockBuilderObject *self, PyObject *unused) {
    self->sealed = 1;
    self->released = 1;
    Py_CLEAR(self->buf);
    self->cap = 0;
    Py_CLEAR(self->records);
    Py_RETURN_NONE;
}

static PyObject *builder_count(BlockBuilderObject *self, void *closure) {
    return PyLong_FromSsize_t(self->count);
}

static PyObject *builder_size(BlockBuilderObject *self, void *closure) {
    return PyLong_FromSsize_t(self->len);
}

static PyObject *builder_full(BlockBuilderObject *self, void *closure) {
    return PyBool_FromLong(self->count >= self->max_records || self->len >= self->max_bytes);
}

static PyObject *builder_sealed(BlockBuilderObject *self, void *closure) {
    return PyBool_FromLong(self->sealed);
}

static PyMethodDef builder_methods[] = {
    {"append", (PyCFunction)(void (*)(void))builder_append, METH_FASTCALL | METH_KEYWORDS,
     "append(body, tag, keys, properties, born_ms=None) -> int: encodes one message at the end "
     "of the block and returns its index, or -1 (nothing appended) when the block is sealed."},
    {"add", (PyCFunction)(void (*)(void))builder_add, METH_FASTCALL,
     "add(ref_class, owner, body, tag, keys, properties) -> ref_class | None: append(), "
     "answered as ref_class(owner, index), or None when the block is sealed."},
    {"seal", (PyCFunction)builder_seal, METH_NOARGS,
     "seal() -> bool: no append after this; True when this call sealed the block."},
    {"records", (PyCFunction)builder_records, METH_O,
     "records(queue_id, /) -> bytes: the sealed block's records for queue queue_id."},
    {"results", (PyCFunction)(void (*)(void))builder_results, METH_FASTCALL | METH_KEYWORDS,
     "results(cls, template, at, first_queue_offset, first_commitlog_offset, added_bytes, "
     "head_added_bytes, file_start_indexes, file_start_offsets, store_host, store_port) -> "
     "list: block_results() of this block."},
    {"release", (PyCFunction)builder_release, METH_NOARGS,
     "release() -> None: seals the block and frees its records (results() still works)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef builder_getset[] = {
    {"count", (getter)builder_count, NULL, "records appended", NULL},
    {"size", (getter)builder_size, NULL, "the block's size in bytes", NULL},
    {"full", (getter)builder_full, NULL, "count >= max_records or size >= max_bytes", NULL},
    {"sealed", (getter)builder_sealed, NULL, "no append is taken any more", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BlockBuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tidemq.protos._crecords.BlockBuilder",
    .tp_basicsize = sizeof(BlockBuilderObject),
    .tp_dealloc = (destructor)builder_dealloc,
    /* No GC support: a builder refers to no object but bytes, so it can be part of no
     * reference cycle. */
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR(
        "BlockBuilder(topic, max_records, max_bytes): an open record block of one topic, each "
        "message encoded into it as it is appended (record_blocks documents the format and the "
        "methods)."),
    .tp_methods = builder_methods,
    .tp_getset = builder_getset,
    .tp_new = builder_new,
};

/* -------------------------------------------------------------------------------- RecordRef */

typedef struct {
    PyObject_HEAD
    PyObject *owner;
    long long index;
} RecordRefObject;

/* A new `type` (RecordRef or a subclass that is not abstract) referring to owner's record
 * `index`. */
static PyObject *recordref_make(PyTypeObject *type, PyObject *owner, long long index) {
    RecordRefObject *self = (RecordRefObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->owner = Py_NewRef(owner);
    self->index = index;
    if (PyObject_IS_GC((PyObject *)self) && type->tp_basicsize == sizeof(RecordRefObject) &&
        type->tp_itemsize == 0 && type->tp_dictoffset == 0 &&
        !PyType_HasFeature(type, Py_TPFLAGS_MANAGED_DICT)) {
        /* A class statement makes a GC type whatever it adds (CPython 3.11 made every heap
         * type's instances GC objects, as they refer to their type). One that adds no field
         * holds nothing but what RecordRef holds, so its instances are untracked as RecordRef's
         * are never tracked (the docstring says what that asks of the owner). */
        PyObject_GC_UnTrack(self);
    }
    return (PyObject *)self;
}

static PyObject *recordref_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *owner, *index;
    if (kwds == NULL && PyTuple_GET_SIZE(args) == 2) {
        owner = PyTuple_GET_ITEM(args, 0);
        index = PyTuple_GET_ITEM(args, 1);
    } else {
        static char *kwlist[] = {"owner", "index", NULL};
        if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:RecordRef", kwlist, &owner, &index)) {
            return NULL;
        }
    }
    if (!PyLong_Check(index)) {
        return fail_type(-1, "index must be int, not ", index);
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow || v < 0) {
        return fail(PyExc_ValueError, -1, "index %S is out of range (0 to 2^63-1)", index);
    }
    if (PyType_HasFeature(type, Py_TPFLAGS_IS_ABSTRACT)) {
        /* A subclass with abstract methods left: object.__new__ refuses it, with its message. */
        PyObject *no_args = PyTuple_New(0);
        if (no_args == NULL) {
            return NULL;
        }
        PyObject *refused = PyBaseObject_Type.tp_new(type, no_args, NULL);
        Py_DECREF(no_args);
        if (refused != NULL) { /* cannot happen: the flag is what object.__new__ checks */
            Py_DECREF(refused);
            PyErr_SetString(PyExc_TypeError, "abstract class");
        }
        return NULL;
    }
    return recordref_make(type, owner, v);
}

static void recordref_dealloc(RecordRefObject *self) {
    Py_DECREF(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef recordref_members[] = {
    {"owner", T_OBJECT_EX, offsetof(RecordRefObject, owner), READONLY,
     "what the record belongs to (a block)"},
    {"index", T_LONGLONG, offsetof(RecordRefObject, index), READONLY,
     "the record's index in its owner"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RecordRefType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tidemq.protos._crecords.RecordRef",
    .tp_basicsize = sizeof(RecordRefObject),
    .tp_dealloc = (destructor)recordref_dealloc,
    /* Deliberately no Py_TPFLAGS_HAVE_GC (docstring). A subclass made by a class statement is a
     * GC type all the same; recordref_new untracks its instances when it adds no field. */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = PyDoc_STR(
        "RecordRef(owner, index): the index-th record of owner (a block), immutable; 32 bytes "
        "on 64-bit builds.\n\n"
        "It has no garbage-collector support: instances are not tracked, so a million of them "
        "(a producer's futures in flight) cost the cyclic collector nothing. The collector "
        "cannot see a RecordRef's reference to its owner, so a cycle through a RecordRef is "
        "never collected; one exists only if the owner (or something it refers to) refers back "
        "to the RecordRef. The SDK must guarantee that an owner never keeps its RecordRefs, or "
        "drops them on every path (a block's callbacks, which hold its futures, are cleared "
        "when it is answered or failed, and every block is answered or failed); otherwise the "
        "owner and its refs leak.\n\n"
        "A subclass that adds no field (__slots__ = () in it and in its other bases, e.g. "
        "class BlockFuture(RecordRef, SendFuture): __slots__ = ()) is a GC type, as every "
        "class statement makes one, but RecordRef() untracks its instances at once: they hold "
        "nothing RecordRef does not. (Its instances also refer to their class, so a class "
        "attribute holding one makes a cycle the collector cannot break either.) A subclass "
        "with a __dict__ or slots of its own keeps tracked instances."),
    .tp_members = recordref_members,
    .tp_new = recordref_new,
};

/* --------------------------------------------------------------------------------- the module */

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *error, *v6;
    if (!PyArg_ParseTuple(args, "OO:configure", &error, &v6)) {
        return NULL;
    }
    if (!PyType_Check(error) || !PyType_IsSubtype((PyTypeObject *)error,
                                                  (PyTypeObject *)PyExc_ValueError)) {
        PyErr_SetString(PyExc_TypeError, "the error class must be a ValueError subclass");
        return NULL;
    }
    if (!PyCallable_Check(v6)) {
        PyErr_SetString(PyExc_TypeError, "ipv6_text must be callable");
        return NULL;
    }
    Py_INCREF(error);
    Py_XSETREF(RecordFormatError, error);
    Py_INCREF(v6);
    Py_XSETREF(Ipv6Text, v6);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"encode_block", (PyCFunction)(void (*)(void))encode_block, METH_FASTCALL | METH_KEYWORDS,
     "encode_block(topic, queue_id, messages) -> bytes: a send's messages as one sent block."},
    {"check_message", (PyCFunction)(void (*)(void))check_message, METH_FASTCALL | METH_KEYWORDS,
     "check_message(tag, keys, properties) -> None: encode_block's per-message checks."},
    {"block_results", (PyCFunction)(void (*)(void))block_results, METH_FASTCALL | METH_KEYWORDS,
     "block_results(cls, template, at, records, first_queue_offset, first_commitlog_offset, "
     "added_bytes, head_added_bytes, file_start_indexes, file_start_offsets, store_host, "
     "store_port) -> list: the send results of one block."},
    {"decode_records", (PyCFunction)(void (*)(void))decode_records, METH_FASTCALL | METH_KEYWORDS,
     "decode_records(cls, common, records) -> list: pulled records as instances of cls."},
    {"make_msg_id", (PyCFunction)(void (*)(void))make_msg_id, METH_FASTCALL | METH_KEYWORDS,
     "make_msg_id(store_address, store_port, commitlog_offset) -> str: an offset message id."},
    {"configure", configure, METH_VARARGS,
     "configure(error_class, ipv6_text): record_blocks' error class and IPv6 formatter."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tidemq.protos._crecords",
    "The compiled twin of tidemq.protos.record_blocks (see there).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__crecords(void) {
    PyObject *abc = PyImport_ImportModule("collections.abc");
    if (abc == NULL) {
        return NULL;
    }
    MappingABC = PyObject_GetAttrString(abc, "Mapping");
    Py_DECREF(abc);
    if (MappingABC == NULL) {
        return NULL;
    }
    EmptyStr = PyUnicode_New(0, 0);
    if (EmptyStr == NULL) {
        return NULL;
    }
    for (int f = 0; f < F_COUNT; f++) {
        FieldKeys[f] = PyUnicode_InternFromString(FIELD_NAMES[f]);
        if (FieldKeys[f] == NULL) {
            return NULL;
        }
    }
    for (int i = 0; i < SHARED_INDEXES; i++) {
        SharedIndexes[i] = PyLong_FromLong(i);
        if (SharedIndexes[i] == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&BlockBuilderType) < 0 || PyType_Ready(&RecordRefType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddType(m, &BlockBuilderType) < 0 || PyModule_AddType(m, &RecordRefType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
