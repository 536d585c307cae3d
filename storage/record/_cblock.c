/* tidemq.storage.record._cblock: the compiled twin of storage/record/block.py and gather.py.
 *
 * The broker's per-record loops, one call per span of records: filling a producer's block
 * (fill_block), dispatch's walk (scan_span), a pull's gather (gather_records), and zlib's CRC-32
 * (crc32) that all of them compute. Python touches the span; only this file touches records.
 *
 * Every answer and every error is the pure-Python twin's, byte for byte and message for message
 * (tests/unit/test_record_codec_twins.py): the twins are the specification, and where this file
 * does something unusual it is to answer as they do (the Python slice rules in check_record,
 * the regex rule that lets a topic end in one newline, the UTF-8 "replace" decoding of tags).
 * The record layout is drawn in storage/record/layout.py, the sent block's in block.py, the
 * ConsumeQueue entry in gather.py.
 *
 * The error classes and the NamedTuple answers are Python's (block.py hands them over with
 * setup()), so a caller cannot tell the twins apart by what they raise or return.
 *
 * Robustness: every length and offset read from a record is checked against the buffer before
 * it is used; no input makes this code read or write outside the buffers it was given. Buffers
 * are held (PyObject_GetBuffer) for the whole call and released on every path.
 *
 * Builds with gcc or clang through setup.py (C11, no libraries; also for aarch64). The CRC is
 * chosen at import by what the CPU has: on x86-64, folding by carry-less multiplication, 256
 * bytes a round in AVX-512 registers (VPCLMULQDQ) or 64 bytes a round in SSE ones (PCLMULQDQ);
 * elsewhere, and for every tail, slice-by-8 tables. CBLOCK_PORTABLE builds the tables alone
 * (what other CPUs run), for testing that path on x86.
 *
 * Cost per 1 KiB record on the development machine (docs: the issue 22 note): fill 0.11 us,
 * scan with CRCs 0.08-0.10 us, gather 0.11 us; the CRC itself 14 GB/s at 1 KiB, 68 at 1 MiB.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CBLOCK_PORTABLE builds what other CPUs run (the tables alone), to test it on x86 too. */
#if (defined(__x86_64__) || defined(__i386__)) && !defined(CBLOCK_PORTABLE)
#define CBLOCK_X86 1
#include <immintrin.h>
#endif

/* ------------------------------------------------------------------ layout (layout.py) */

#define MAGIC_V1 0xDAA320A7u
#define MAGIC_V2 0xDAA320ABu
#define BLANK_MAGIC 0xCBD43194u
#define FIXED_OVERHEAD_V4 91
#define HEADER_V4 88
#define BLANK_SIZE 8
#define SYSFLAG_BORN_V6 0x10
#define SYSFLAG_STORE_V6 0x20
#define TX_MASK 0xC
#define TX_PREPARED 0x4
#define TX_ROLLBACK 0xC
#define PROPERTIES_MAX 32767
#define RECORD_CRC_SIZE 20
#define RECORD_CRC_NAME_LEN 9 /* "__CRC32H" 0x01 */
#define CRC_MASK 0x7FFFFFFFu
#define ENTRY_SIZE 20
#define BLANK_ENTRY_SIZE 0x7FFFFFFF
#define OFFSET_LIMIT (1LL << 62)

/* check_record's outcomes */
enum { ST_OK = 0, ST_EOF = 1, ST_INCOMPLETE = 2, ST_CORRUPT = 3 };
/* gather's stops (gather.py) */
enum { G_ENTRIES_END = 0, G_RECORD_LIMIT = 1, G_BYTE_LIMIT = 2, G_NOT_VISIBLE = 3, G_OTHER_FILE = 4 };

static const char RECORD_CRC_NAME[] = "__CRC32H\x01";
static const char LEGACY_CRC_NAME[] = "__CRC32#\x01";
static const char TIMER_TOPIC[] = "%SYS%TIMER";
static const char TIMER_PROP[] = "TIMER_DELIVER_MS\x01";

/* Handed over by block.py (setup). */
static PyObject *CorruptBlockError, *InvalidPropertyError, *PropertiesTooLargeError,
    *BodyTooLargeError, *CorruptRecordError, *FilledBlockType, *SpanScanType, *GatherResultType;

/* ------------------------------------------------------------------ big-endian fields */

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}
static inline uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) << 32 | rd32(p + 4); }
static inline void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}
static inline void wr32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}
static inline void wr64(uint8_t *p, uint64_t v) {
    wr32(p, (uint32_t)(v >> 32));
    wr32(p + 4, (uint32_t)v);
}

/* ------------------------------------------------------------------ CRC-32 (zlib's) */

static uint32_t crc_table[8][256];
static int have_clmul, have_vpclmul;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc_table[0][i] = c;
    }
    for (int i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
#ifdef CBLOCK_X86
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    have_vpclmul = have_clmul && __builtin_cpu_supports("avx512f") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq");
#endif
}

/* ``c`` is the running register (the CRC inverted), as in zlib's inner loop. */
static uint32_t crc_slice8(uint32_t c, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint32_t a = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                          (uint32_t)p[3] << 24);
        uint32_t b = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                     (uint32_t)p[7] << 24;
        c = crc_table[7][a & 0xFF] ^ crc_table[6][(a >> 8) & 0xFF] ^
            crc_table[5][(a >> 16) & 0xFF] ^ crc_table[4][a >> 24] ^ crc_table[3][b & 0xFF] ^
            crc_table[2][(b >> 8) & 0xFF] ^ crc_table[1][(b >> 16) & 0xFF] ^
            crc_table[0][b >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#ifdef CBLOCK_X86
__attribute__((target("pclmul,sse4.1"))) static inline uint32_t
crc_fold_finish(__m128i x1, const uint8_t *p, size_t len);

/* Folding by carry-less multiplication (Gopal et al., "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ Instruction", Intel 2009), in the bit-reflected domain of zlib's
 * polynomial: four 128-bit lanes fold 64 bytes per round, then fold into one lane, 16 bytes per
 * round, then 128 -> 64 -> 32 bits and a Barrett reduction. ``len`` >= 64 and a multiple of 16;
 * ``c`` is the running register. The constants are x^k mod P for the fold distances, and
 * floor(x^64 / P) with P itself for the reduction (the paper's k1..k5, mu and P'). */
__attribute__((target("pclmul,sse4.1"))) static uint32_t
crc_fold_clmul(const uint8_t *p, size_t len, uint32_t c) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k384 = _mm_set_epi64x(0x174359406LL, 0x03db1ecdcLL);
    const __m128i k256 = _mm_set_epi64x(0x15a546366LL, 0x0f1da05aaLL);
    __m128i x1, x2, x3, x4, x5, x6, x7, x8;

    x1 = _mm_loadu_si128((const __m128i *)(p + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(p + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(p + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(p + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)c));
    p += 64;
    len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, k1k2, 0x00);
        x6 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        x7 = _mm_clmulepi64_si128(x3, k1k2, 0x00);
        x8 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(p + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(p + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(p + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(p + 0x30)));
        p += 64;
        len -= 64;
    }
    /* four lanes into one, each by its distance from the last, at once rather than in turn:
     * a short input is bound by this chain's latency, not by throughput */
    x5 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k384, 0x00), _mm_clmulepi64_si128(x1, k384, 0x11));
    x6 = _mm_xor_si128(_mm_clmulepi64_si128(x2, k256, 0x00), _mm_clmulepi64_si128(x2, k256, 0x11));
    x7 = _mm_xor_si128(_mm_clmulepi64_si128(x3, k3k4, 0x00), _mm_clmulepi64_si128(x3, k3k4, 0x11));
    x1 = _mm_xor_si128(_mm_xor_si128(x5, x6), _mm_xor_si128(x7, x4));
    return crc_fold_finish(x1, p, len);
}

/* The end of a fold: the remaining 16-byte blocks (``len`` is a multiple of 16) into the
 * 128-bit lane ``x1``, then 128 -> 64 -> 32 bits and the Barrett reduction. */
__attribute__((target("pclmul,sse4.1"))) static inline uint32_t
crc_fold_finish(__m128i x1, const uint8_t *p, size_t len) {
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x2, x5;
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)p);
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        p += 16;
        len -= 16;
    }
    /* 128 -> 64 bits */
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    /* 64 -> 32 bits */
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, low32);
    x1 = _mm_clmulepi64_si128(x1, k5k0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction */
    x2 = _mm_and_si128(x1, low32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x10);
    x2 = _mm_and_si128(x2, low32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

/* The same folding 256 bytes per round in four 512-bit registers (VPCLMULQDQ, AVX-512), each
 * 128-bit lane as the loop above folds one: 4 x 512 -> 512 bits, 64-byte blocks into that,
 * its four lanes into one (by 384, 256 and 128 bits), then crc_fold_finish. ``len`` >= 256 and
 * a multiple of 16. Constants as above: (x^(D+32) mod P, x^(D-32) mod P) for a fold of D bits,
 * bit-reflected and shifted left once. */
__attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.1"))) static uint32_t
crc_fold_vpclmul(const uint8_t *p, size_t len, uint32_t c) {
    const __m512i k2048 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x1322d1430LL, 0x11542778aLL));
    const __m512i k1536 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x12e958ac4LL, 0x1821d8bc0LL));
    const __m512i k1024 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x14a7fe880LL, 0x1e88ef372LL));
    const __m512i k512 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL));
    const __m128i k384 = _mm_set_epi64x(0x174359406LL, 0x03db1ecdcLL);
    const __m128i k256 = _mm_set_epi64x(0x15a546366LL, 0x0f1da05aaLL);
    const __m128i k128 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    __m512i x0, x1, x2, x3;

#define FOLD512(x, k, data)                                                                   \
    _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128((x), (k), 0x00),                        \
                              _mm512_clmulepi64_epi128((x), (k), 0x11), (data), 0x96)
#define FOLD128(x, k) \
    _mm_xor_si128(_mm_clmulepi64_si128((x), (k), 0x00), _mm_clmulepi64_si128((x), (k), 0x11))
    x0 = _mm512_loadu_si512((const void *)(p + 0x00));
    x1 = _mm512_loadu_si512((const void *)(p + 0x40));
    x2 = _mm512_loadu_si512((const void *)(p + 0x80));
    x3 = _mm512_loadu_si512((const void *)(p + 0xC0));
    x0 = _mm512_xor_si512(x0, _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)c)));
    p += 256;
    len -= 256;
    while (len >= 256) {
        x0 = FOLD512(x0, k2048, _mm512_loadu_si512((const void *)(p + 0x00)));
        x1 = FOLD512(x1, k2048, _mm512_loadu_si512((const void *)(p + 0x40)));
        x2 = FOLD512(x2, k2048, _mm512_loadu_si512((const void *)(p + 0x80)));
        x3 = FOLD512(x3, k2048, _mm512_loadu_si512((const void *)(p + 0xC0)));
        p += 256;
        len -= 256;
    }
    /* four registers into one at once (as crc_fold_clmul's lanes) */
    x0 = FOLD512(x0, k1536, FOLD512(x1, k1024, FOLD512(x2, k512, x3)));
    while (len >= 64) {
        x0 = FOLD512(x0, k512, _mm512_loadu_si512((const void *)p));
        p += 64;
        len -= 64;
    }
    __m128i a = _mm512_extracti32x4_epi32(x0, 0), b = _mm512_extracti32x4_epi32(x0, 1);
    __m128i d = _mm512_extracti32x4_epi32(x0, 2), e = _mm512_extracti32x4_epi32(x0, 3);
    __m128i x = _mm_xor_si128(_mm_xor_si128(FOLD128(a, k384), FOLD128(b, k256)),
                              _mm_xor_si128(FOLD128(d, k128), e));
#undef FOLD512
#undef FOLD128
    return crc_fold_finish(x, p, len);
}
#endif

/* zlib.crc32(p[:n], crc) */
static uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t c = ~crc;
#ifdef CBLOCK_X86
    if (have_clmul && n >= 64) {
        size_t chunk = n & ~(size_t)15;
        c = have_vpclmul && n >= 256 ? crc_fold_vpclmul(p, chunk, c) : crc_fold_clmul(p, chunk, c);
        p += chunk;
        n -= chunk;
    }
#endif
    return ~crc_slice8(c, p, n);
}

/* ------------------------------------------------------------------ small helpers */

/* Python's slice rule for buf[start:stop] on a buffer of ``len`` bytes. */
static void py_slice(Py_ssize_t len, int64_t start, int64_t stop, Py_ssize_t *s, Py_ssize_t *e) {
    if (start < 0) start = start + len < 0 ? 0 : start + len;
    if (start > len) start = len;
    if (stop < 0) stop = stop + len < 0 ? 0 : stop + len;
    if (stop > len) stop = len;
    if (stop < start) stop = start;
    *s = (Py_ssize_t)start;
    *e = (Py_ssize_t)stop;
}

/* One code point of strict UTF-8 (what Python's codec accepts): its length, 0 when invalid. */
static inline int utf8_next(const uint8_t *p, Py_ssize_t n, uint32_t *cp) {
    uint8_t b0 = p[0], b1;
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    if (b0 < 0xC2) return 0;
    if (b0 < 0xE0) {
        if (n < 2 || (p[1] & 0xC0) != 0x80) return 0;
        *cp = (uint32_t)(b0 & 0x1F) << 6 | (p[1] & 0x3F);
        return 2;
    }
    if (b0 < 0xF0) {
        if (n < 3) return 0;
        b1 = p[1];
        if (b0 == 0xE0 ? (b1 < 0xA0 || b1 > 0xBF)
                       : b0 == 0xED ? (b1 < 0x80 || b1 > 0x9F) : (b1 & 0xC0) != 0x80)
            return 0;
        if ((p[2] & 0xC0) != 0x80) return 0;
        *cp = (uint32_t)(b0 & 0x0F) << 12 | (uint32_t)(b1 & 0x3F) << 6 | (p[2] & 0x3F);
        return 3;
    }
    if (b0 < 0xF5) {
        if (n < 4) return 0;
        b1 = p[1];
        if (b0 == 0xF0 ? (b1 < 0x90 || b1 > 0xBF)
                       : b0 == 0xF4 ? (b1 < 0x80 || b1 > 0x8F) : (b1 & 0xC0) != 0x80)
            return 0;
        if ((p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        *cp = (uint32_t)(b0 & 0x07) << 18 | (uint32_t)(b1 & 0x3F) << 12 |
              (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
        return 4;
    }
    return 0;
}

static int utf8_valid(const uint8_t *p, Py_ssize_t n) {
    uint32_t cp;
    Py_ssize_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_next(p + i, n - i, &cp);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

static inline uint32_t java_step(uint32_t h, uint32_t cp) {
    if (cp < 0x10000) return h * 31u + cp;
    cp -= 0x10000;
    h = h * 31u + (0xD800u + (cp >> 10));
    return h * 31u + (0xDC00u + (cp & 0x3FF));
}

/* The ConsumeQueue tag code of a TAGS value (javahash.tag_code_of_bytes): Java's
 * String.hashCode over the UTF-16 units of the value decoded as UTF-8 with replacement.
 * Returns 0 and sets *out, or -1 with an exception set. */
static int tag_code_of(const uint8_t *p, Py_ssize_t n, int64_t *out) {
    uint32_t h = 0, cp;
    Py_ssize_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            h = h * 31u + p[i++];
            continue;
        }
        int k = utf8_next(p + i, n - i, &cp);
        if (!k) break;
        h = java_step(h, cp);
        i += k;
    }
    if (i < n) { /* invalid UTF-8: let Python's codec replace exactly as decode(errors=...) */
        PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "replace");
        if (s == NULL) return -1;
        Py_ssize_t len = PyUnicode_GET_LENGTH(s);
        int kind = PyUnicode_KIND(s);
        const void *data = PyUnicode_DATA(s);
        h = 0;
        for (Py_ssize_t j = 0; j < len; j++) h = java_step(h, PyUnicode_READ(kind, data, j));
        Py_DECREF(s);
    }
    *out = (int32_t)h;
    return 0;
}

/* The regex ^[%|a-zA-Z0-9_-]+$ of decode._topic_of, including Python's "$", which also matches
 * before one final newline. */
static int topic_ok(const uint8_t *t, Py_ssize_t n) {
    if (n >= 2 && t[n - 1] == '\n') n--;
    if (n <= 0) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t c = t[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '%' || c == '|' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* Ten ASCII digits as a number, most significant first (``reversed``: least significant first);
 * -1 when one is not a digit. Ten digits name one value only, so comparing numbers is
 * comparing the digits the record CRC property must hold. Two independent halves halve the
 * dependency chain. */
static int64_t parse10(const uint8_t *d, int reversed) {
    uint32_t hi = 0, lo = 0;
    for (int i = 0; i < 5; i++) {
        uint32_t a = (uint32_t)d[reversed ? 9 - i : i] - '0';
        uint32_t b = (uint32_t)d[reversed ? 4 - i : 5 + i] - '0';
        if (a > 9 || b > 9) return -1;
        hi = hi * 10 + a;
        lo = lo * 10 + b;
    }
    return (int64_t)hi * 100000 + lo;
}

/* The CRC of the part of a record after its body, up to the record CRC's digits, is the same
 * for every record of a topic with the same properties: the last one is kept and reused when
 * the bytes match (what the Python encoder's suffix cache does per topic and tags). */
typedef struct {
    const uint8_t *p;
    Py_ssize_t n;
    uint32_t crc;
} suffix_cache_t;

static uint32_t suffix_crc(suffix_cache_t *cache, const uint8_t *p, Py_ssize_t n) {
    if (cache->p != NULL && cache->n == n && !memcmp(cache->p, p, (size_t)n)) return cache->crc;
    cache->p = p;
    cache->n = n;
    cache->crc = crc32_update(0, p, (size_t)n);
    return cache->crc;
}

static void digits10(uint32_t v, uint8_t *out) { /* "%010d" */
    for (int i = 9; i >= 0; i--) {
        out[i] = (uint8_t)('0' + v % 10);
        v /= 10;
    }
}

/* ------------------------------------------------------------------ checking one record */

typedef struct {
    Py_ssize_t pos, end, body_at, body_end;
    Py_ssize_t topic_s, topic_e; /* buf[topic_at:props_len_at], Python's slice */
    Py_ssize_t props_s, props_e; /* buf[props_len_at + 2:end] */
    int32_t props_len, queue_id, sys_flag, body_crc;
    int64_t queue_offset, phy, store_ts;
} rec_t;

/* decode._layout: OK with ``r`` filled, or another status with ``why`` (empty: None). */
static int layout(const uint8_t *b, Py_ssize_t blen, Py_ssize_t pos, Py_ssize_t limit,
                  int64_t expect, rec_t *r, char *why, size_t whylen) {
    Py_ssize_t avail = limit - pos;
    why[0] = 0;
    if (avail < BLANK_SIZE) {
        snprintf(why, whylen, "only %zd bytes left", avail);
        return ST_INCOMPLETE;
    }
    int32_t size = (int32_t)rd32(b + pos);
    uint32_t magic = rd32(b + pos + 4);
    if (magic == BLANK_MAGIC) return ST_EOF;
    if (magic != MAGIC_V1 && magic != MAGIC_V2) {
        if (size == 0 && magic == 0) {
            snprintf(why, whylen, "zeros where a record should start");
            return ST_INCOMPLETE;
        }
        snprintf(why, whylen, "bad magic 0x%08X", magic);
        return ST_CORRUPT;
    }
    if (size < FIXED_OVERHEAD_V4) {
        snprintf(why, whylen, "record size %d below the minimum", size);
        return ST_CORRUPT;
    }
    if (size > avail) {
        snprintf(why, whylen, "record of %d bytes but only %zd available", size, avail);
        return ST_INCOMPLETE;
    }
    const uint8_t *h = b + pos;
    int32_t sys_flag = (int32_t)rd32(h + 36);
    int born_len = sys_flag & SYSFLAG_BORN_V6 ? 16 : 4;
    int store_len = sys_flag & SYSFLAG_STORE_V6 ? 16 : 4;
    int64_t hdr = HEADER_V4 + (born_len - 4) + (store_len - 4);
    int v2 = magic == MAGIC_V2;
    int tl = v2 ? 2 : 1;
    int64_t end = (int64_t)pos + size;
    /* A header that does not leave room for the lengths after it fails the check below
     * whatever its body length says; it is not read, as it may lie past the buffer. */
    if (hdr + tl + 2 > size) {
        snprintf(why, whylen, "body length runs past the record");
        return ST_CORRUPT;
    }
    int32_t body_len = (int32_t)rd32(h + hdr - 4);
    int64_t body_at = (int64_t)pos + hdr;
    int64_t topic_len_at = body_at + body_len;
    if (body_len < 0 || topic_len_at + tl + 2 > end) {
        snprintf(why, whylen, "body length runs past the record");
        return ST_CORRUPT;
    }
    int64_t topic_len, topic_at;
    if (v2) {
        topic_len = (int16_t)rd16(b + topic_len_at);
        topic_at = topic_len_at + 2;
    } else {
        topic_len = b[topic_len_at];
        topic_at = topic_len_at + 1;
    }
    int64_t props_len_at = topic_at + topic_len;
    if (props_len_at + 2 > end) {
        snprintf(why, whylen, "topic length runs past the record");
        return ST_CORRUPT;
    }
    /* struct's unpack_from counts a negative offset from the end (a V2 topic length may be
     * negative); one outside the buffer is an error the Python twin answers as below. */
    int64_t o = props_len_at < 0 ? props_len_at + blen : props_len_at;
    if (o < 0 || o + 2 > blen) {
        snprintf(why, whylen, "body length runs past the record");
        return ST_CORRUPT;
    }
    int32_t props_len = (int16_t)rd16(b + o);
    if (props_len < 0 || props_len_at + 2 + props_len != end) {
        snprintf(why, whylen, "record length does not match its fields");
        return ST_CORRUPT;
    }
    int64_t phy = (int64_t)rd64(h + 28);
    if (phy != expect) {
        snprintf(why, whylen, "PHYSICALOFFSET %lld where %lld was expected", (long long)phy,
                 (long long)expect);
        return ST_CORRUPT;
    }
    if (props_len && b[end - 1] != 0x02) {
        snprintf(why, whylen, "properties do not end with a separator");
        return ST_CORRUPT;
    }
    r->pos = pos;
    r->end = (Py_ssize_t)end;
    r->body_at = (Py_ssize_t)body_at;
    r->body_end = (Py_ssize_t)(body_at + body_len);
    py_slice(blen, topic_at, props_len_at, &r->topic_s, &r->topic_e);
    py_slice(blen, props_len_at + 2, end, &r->props_s, &r->props_e);
    r->props_len = props_len;
    r->queue_id = (int32_t)rd32(h + 12);
    r->queue_offset = (int64_t)rd64(h + 20);
    r->phy = phy;
    r->sys_flag = sys_flag;
    r->body_crc = (int32_t)rd32(h + 8);
    r->store_ts = (int64_t)rd64(h + 52 + born_len);
    return ST_OK;
}

/* decode._crc_problem: NULL or why the CRCs fail. */
static const char *crc_problem(const uint8_t *b, Py_ssize_t blen, const rec_t *r, int require,
                               suffix_cache_t *cache) {
    Py_ssize_t end = r->end, s, e;
    int name = 0;
    if (r->props_len >= RECORD_CRC_SIZE) {
        const uint8_t *at = b + end - RECORD_CRC_SIZE;
        if (!memcmp(at, RECORD_CRC_NAME, RECORD_CRC_NAME_LEN))
            name = 1;
        else if (!memcmp(at, LEGACY_CRC_NAME, RECORD_CRC_NAME_LEN))
            name = 2;
    }
    if (name == 1) {
        py_slice(blen, r->body_end, end - 11, &s, &e);
        uint32_t c = suffix_crc(cache, b + s, e - s);
        c = crc32_update(c, b + r->pos, (size_t)(r->body_at - r->pos)) & CRC_MASK;
        if (parse10(b + end - 11, 0) != (int64_t)c || b[end - 1] != 0x02)
            return "record CRC mismatch";
    } else if (name == 2) {
        uint32_t c = crc32_update(0, b + r->pos, (size_t)(end - RECORD_CRC_SIZE - r->pos));
        c &= CRC_MASK; /* digits least significant first, zero-padded */
        if (parse10(b + end - 11, 1) != (int64_t)c || b[end - 1] != 0x02)
            return "record CRC mismatch";
        return NULL;
    } else if (require) {
        return "record CRC property missing";
    }
    uint32_t body = crc32_update(0, b + r->body_at, (size_t)(r->body_end - r->body_at));
    if ((int64_t)(body & CRC_MASK) != (int64_t)r->body_crc) return "body CRC mismatch";
    return NULL;
}

typedef struct {
    const uint8_t *p;
    Py_ssize_t n;
} span_t;

/* The properties check_record reads: the last TAGS, KEYS and UNIQ_KEY items (an item without
 * 0x01 is a name with an empty value). */
static void props_of(const uint8_t *b, const rec_t *r, span_t *tags, span_t *keys, span_t *uniq) {
    tags->p = keys->p = uniq->p = NULL;
    tags->n = keys->n = uniq->n = 0;
    if (!r->props_len) return;
    const uint8_t *p = b + r->props_s, *end = b + r->props_e;
    for (;;) {
        const uint8_t *sep = memchr(p, 0x02, (size_t)(end - p));
        const uint8_t *item_end = sep ? sep : end;
        const uint8_t *one = memchr(p, 0x01, (size_t)(item_end - p));
        Py_ssize_t name_len = (one ? one : item_end) - p;
        const uint8_t *value = one ? one + 1 : item_end;
        span_t v = {value, item_end - value};
        if (name_len == 4 && !memcmp(p, "TAGS", 4))
            *tags = v;
        else if (name_len == 4 && !memcmp(p, "KEYS", 4))
            *keys = v;
        else if (name_len == 8 && !memcmp(p, "UNIQ_KEY", 8))
            *uniq = v;
        if (!sep) break;
        p = sep + 1;
    }
}

/* decode_properties(...).get("TAGS") as UTF-8 bytes: the last item named TAGS that has 0x01.
 * Returns 1 when found. */
static int stored_tags(const uint8_t *b, const rec_t *r, span_t *tags) {
    int found = 0;
    if (!r->props_len) return 0;
    const uint8_t *p = b + r->props_s, *end = b + r->props_e;
    for (;;) {
        const uint8_t *sep = memchr(p, 0x02, (size_t)(end - p));
        const uint8_t *item_end = sep ? sep : end;
        const uint8_t *one = memchr(p, 0x01, (size_t)(item_end - p));
        if (one && one - p == 4 && !memcmp(p, "TAGS", 4)) {
            tags->p = one + 1;
            tags->n = item_end - (one + 1);
            found = 1;
        }
        if (!sep) break;
        p = sep + 1;
    }
    return found;
}

/* properties.parse_timer_deliver_ms(find_property(props, b"TIMER_DELIVER_MS")): 1 with *ms set,
 * 0 when absent or malformed. */
static int timer_deliver_ms(const uint8_t *p, Py_ssize_t n, int64_t *ms) {
    const Py_ssize_t nl = (Py_ssize_t)sizeof(TIMER_PROP) - 1;
    Py_ssize_t start = -1;
    if (n >= nl && !memcmp(p, TIMER_PROP, (size_t)nl)) {
        start = nl;
    } else {
        for (Py_ssize_t i = 0; i + 1 + nl <= n; i++) {
            if (p[i] == 0x02 && !memcmp(p + i + 1, TIMER_PROP, (size_t)nl)) {
                start = i + 1 + nl;
                break;
            }
        }
    }
    if (start < 0) return 0;
    const uint8_t *sep = memchr(p + start, 0x02, (size_t)(n - start));
    Py_ssize_t len = (sep ? sep - p : n) - start;
    if (len <= 0 || len > 19) return 0;
    uint64_t v = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        uint8_t c = p[start + i];
        if (c < '0' || c > '9') return 0;
        v = v * 10 + (uint64_t)(c - '0');
    }
    if (v >= (uint64_t)1 << 63) return 0;
    *ms = (int64_t)v;
    return 1;
}

/* ------------------------------------------------------------------ argument helpers */

static int check_ready(void) {
    if (FilledBlockType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_cblock.setup() has not been called");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ crc32 */

PyDoc_STRVAR(crc32_doc, "crc32(data, start=0, /) -> int\n\nzlib.crc32, value for value.");

static PyObject *py_crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32 takes data and an optional start value");
        return NULL;
    }
    uint32_t start = 0;
    if (nargs == 2) {
        if (!PyLong_Check(args[1])) {
            PyErr_SetString(PyExc_TypeError, "crc32's start value must be an int");
            return NULL;
        }
        unsigned long v = PyLong_AsUnsignedLongMask(args[1]);
        if (v == (unsigned long)-1 && PyErr_Occurred()) return NULL;
        start = (uint32_t)v;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c;
    if (view.len >= 65536) { /* long enough that other threads should run meanwhile */
        Py_BEGIN_ALLOW_THREADS c = crc32_update(start, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        c = crc32_update(start, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_crc32_each(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* every path this CPU can take, for the tests: [table, pclmul?, vpclmulqdq?] */
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_crc32_each takes data and a start value");
        return NULL;
    }
    unsigned long v = PyLong_AsUnsignedLongMask(args[1]);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = view.buf;
    size_t n = (size_t)view.len;
    uint32_t c = ~(uint32_t)v;
    PyObject *out = PyList_New(0), *item;
    if (out == NULL) goto done;
    item = PyLong_FromUnsignedLong(~crc_slice8(c, p, n));
    if (item == NULL || PyList_Append(out, item) < 0) goto fail;
    Py_DECREF(item);
#ifdef CBLOCK_X86
    size_t chunk = n & ~(size_t)15;
    if (have_clmul && n >= 64) {
        item = PyLong_FromUnsignedLong(~crc_slice8(crc_fold_clmul(p, chunk, c), p + chunk, n - chunk));
        if (item == NULL || PyList_Append(out, item) < 0) goto fail;
        Py_DECREF(item);
    }
    if (have_vpclmul && n >= 256) {
        item = PyLong_FromUnsignedLong(~crc_slice8(crc_fold_vpclmul(p, chunk, c), p + chunk, n - chunk));
        if (item == NULL || PyList_Append(out, item) < 0) goto fail;
        Py_DECREF(item);
    }
#endif
    goto done;
fail:
    Py_XDECREF(item);
    Py_CLEAR(out);
done:
    PyBuffer_Release(&view);
    return out;
}

/* ------------------------------------------------------------------ fill_block */

typedef struct {
    Py_ssize_t at;        /* where the sent record starts in the block */
    int32_t size;         /* its sent size */
    int32_t body_len;     /* its body */
    int32_t props_len;    /* its properties as sent */
    int32_t stored_size;  /* its stored size */
    int64_t pos;          /* its log offset */
} sent_t;

static PyObject *refuse(PyObject *cls, Py_ssize_t i, const char *fmt, ...) {
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    PyErr_Format(cls, "record %zd of the block: %s", i, text);
    return NULL;
}

/* block._check_properties: 0, or -1 with InvalidPropertyError set. */
static int check_properties(Py_ssize_t i, const uint8_t *props, Py_ssize_t n) {
    if (!n) return 0;
    if (props[n - 1] != 0x02) {
        refuse(InvalidPropertyError, i, "properties must end with 0x02");
        return -1;
    }
    const uint8_t *p = props, *end = props + n - 1;
    for (;;) {
        const uint8_t *sep = memchr(p, 0x02, (size_t)(end - p));
        const uint8_t *item_end = sep ? sep : end;
        const uint8_t *one = memchr(p, 0x01, (size_t)(item_end - p));
        if (!one || one == p || memchr(one + 1, 0x01, (size_t)(item_end - one - 1))) {
            refuse(InvalidPropertyError, i, "properties must be name 0x01 value 0x02 pairs");
            return -1;
        }
        Py_ssize_t name_len = one - p;
        static const char *const reserved[] = {"__CRC32H", "__CRC32#", "PRODUCER_SEQ"};
        for (int k = 0; k < 3; k++) {
            if ((size_t)name_len == strlen(reserved[k]) && !memcmp(p, reserved[k], (size_t)name_len)) {
                refuse(InvalidPropertyError, i, "property %s is the store's", reserved[k]);
                return -1;
            }
        }
        if (!sep) break;
        p = sep + 1;
    }
    if (!utf8_valid(props, n)) {
        refuse(InvalidPropertyError, i, "properties are not valid UTF-8");
        return -1;
    }
    return 0;
}

static int parse_host(PyObject *host, const char *which, const uint8_t **addr, Py_ssize_t *len,
                      long *port) {
    PyObject *a, *p;
    if (!PyTuple_Check(host) || PyTuple_GET_SIZE(host) != 2) {
        PyErr_Format(PyExc_TypeError, "the %s host must be an (address, port) tuple", which);
        return -1;
    }
    a = PyTuple_GET_ITEM(host, 0);
    p = PyTuple_GET_ITEM(host, 1);
    if (!PyBytes_Check(a) || !PyLong_Check(p)) {
        PyErr_Format(PyExc_TypeError, "the %s host must be an (address, port) tuple", which);
        return -1;
    }
    int overflow;
    long v = PyLong_AsLongAndOverflow(p, &overflow);
    *len = PyBytes_GET_SIZE(a);
    if ((*len != 4 && *len != 16) || overflow || v < 0 || v > 65535) {
        PyErr_Format(PyExc_ValueError,
                     "the %s host must be a 4 or 16-byte address and a port", which);
        return -1;
    }
    *addr = (const uint8_t *)PyBytes_AS_STRING(a);
    *port = v;
    return 0;
}

static int append_span(PyObject *spans, int64_t log_at, Py_ssize_t out_at, Py_ssize_t len,
                       int fills) {
    PyObject *t = Py_BuildValue("(LnnO)", (long long)log_at, out_at, len,
                                fills ? Py_True : Py_False);
    if (t == NULL) return -1;
    int rc = PyList_Append(spans, t);
    Py_DECREF(t);
    return rc;
}

static int append_pair(PyObject *list, Py_ssize_t a, int64_t b) {
    PyObject *t = Py_BuildValue("(nL)", a, (long long)b);
    if (t == NULL) return -1;
    int rc = PyList_Append(list, t);
    Py_DECREF(t);
    return rc;
}

PyDoc_STRVAR(fill_block_doc,
             "fill_block(records, count, topic, queue_id, start, file_size, first_queue_offset,"
             " now_ms, born_host, store_host, max_body_bytes, record_crc, out, out_pos,"
             " head_property=b'', member_sys_flag=0) -> FilledBlock\n\n"
             "block.py_fill_block, compiled.");

static PyObject *fill_block(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"records", "count", "topic", "queue_id", "start", "file_size",
                             "first_queue_offset", "now_ms", "born_host", "store_host",
                             "max_body_bytes", "record_crc", "out", "out_pos", "head_property",
                             "member_sys_flag", NULL};
    Py_buffer rec = {0}, outb = {0}, head = {0};
    PyObject *topic, *born_host, *store_host, *out;
    long long count, queue_id, start, file_size, first_qoff, now_ms, max_body, out_pos;
    long long member = 0;
    int record_crc;
    PyObject *result = NULL, *spans = NULL, *file_starts = NULL;
    sent_t *sent = NULL, sent_small[64];
    uint8_t *copy = NULL;
    int have_out = 0;

    if (check_ready() < 0) return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*LULLLLLOOLpOL|y*L", kwlist, &rec, &count,
                                     &topic, &queue_id, &start, &file_size, &first_qoff,
                                     &now_ms, &born_host, &store_host, &max_body, &record_crc,
                                     &out, &out_pos, &head, &member))
        return NULL;

    const uint8_t *born_addr, *store_addr;
    Py_ssize_t born_alen, store_alen;
    long born_port, store_port;
    if (parse_host(born_host, "born", &born_addr, &born_alen, &born_port) < 0 ||
        parse_host(store_host, "store", &store_addr, &store_alen, &store_port) < 0)
        goto done;
    /* below 2**62, log offsets and queue offsets cannot overflow however many records come */
    if (!(file_size > 0 && file_size < OFFSET_LIMIT && start >= 0 && start < OFFSET_LIMIT &&
          first_qoff >= 0 && first_qoff < OFFSET_LIMIT && out_pos >= 0 && now_ms >= 0)) {
        PyErr_SetString(PyExc_ValueError,
                        "file_size, start, first_queue_offset, out_pos or now_ms out of range");
        goto done;
    }
    if (member < 0 || member > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "member_sys_flag must be a non-negative int32");
        goto done;
    }
    if (PyObject_GetBuffer(out, &outb, PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "out must be a writable buffer");
        goto done;
    }
    have_out = 1;
    if (count <= 0) {
        PyErr_SetString(CorruptBlockError, "a block holds at least one record");
        goto done;
    }
    Py_ssize_t topic_len;
    const char *topic_raw = PyUnicode_AsUTF8AndSize(topic, &topic_len);
    if (topic_raw == NULL) goto done;

    const int born_v6 = born_alen == 16, store_v6 = store_alen == 16;
    const int64_t hdr_size = HEADER_V4 + (born_v6 ? 12 : 0) + (store_v6 ? 12 : 0);
    const int32_t host_flags = (born_v6 ? SYSFLAG_BORN_V6 : 0) | (store_v6 ? SYSFLAG_STORE_V6 : 0);
    const int64_t added = hdr_size - HEADER_V4 + (record_crc ? RECORD_CRC_SIZE : 0);
    long long body_total = 0; /* the bodies' bytes, for the broker's send metrics */
    const uint8_t *b = rec.buf;
    const Py_ssize_t n = rec.len;

    spans = PyList_New(0);
    file_starts = PyList_New(0);
    if (spans == NULL || file_starts == NULL) goto done;

    /* pass 1: check every record and place it; nothing is written to out */
    Py_ssize_t cap = 64, nsent = 0;
    sent = sent_small;
    int64_t pos = start, span_start = start;
    Py_ssize_t out_at = (Py_ssize_t)out_pos, span_out = out_at;
    int64_t file_end = start - start % file_size + file_size;
    Py_ssize_t at = 0;
    int64_t last_pos = 0, last_size = 0;
    for (long long i = 0; i < count; i++) {
        if (n - at < FIXED_OVERHEAD_V4) {
            refuse(CorruptBlockError, i, "%zd bytes left where a record of at least 91 should start",
                   n - at);
            goto done;
        }
        const uint8_t *r = b + at;
        int32_t size = (int32_t)rd32(r);
        uint32_t magic = rd32(r + 4);
        if (size < FIXED_OVERHEAD_V4 || size > n - at) {
            refuse(CorruptBlockError, i, "size %d does not fit the %zd bytes left", size, n - at);
            goto done;
        }
        if (magic != MAGIC_V1) {
            refuse(CorruptBlockError, i, "magic 0x%08X is not V1", magic);
            goto done;
        }
        int32_t qid = (int32_t)rd32(r + 12);
        if (qid != queue_id) {
            refuse(CorruptBlockError, i, "queue id %d in a block of queue %lld", qid, queue_id);
            goto done;
        }
        /* BODYCRC [8,12), QUEUEOFFSET..SYSFLAG [20,40), hosts, store time .. PREPARED [48,84) */
        uint64_t filled = rd32(r + 8) | rd64(r + 20) | rd64(r + 28) | rd32(r + 36);
        for (int k = 48; k < 84; k += 4) filled |= rd32(r + k);
        if (filled) {
            refuse(CorruptBlockError, i, "a field the broker fills is not zero");
            goto done;
        }
        if ((int64_t)rd64(r + 40) < 0) {
            refuse(CorruptBlockError, i, "the born timestamp is negative");
            goto done;
        }
        int32_t body_len = (int32_t)rd32(r + 84);
        int64_t topic_len_at = (int64_t)at + HEADER_V4 + body_len;
        if (body_len < 0 || topic_len_at + 3 > (int64_t)at + size) {
            refuse(CorruptBlockError, i, "body length runs past the record");
            goto done;
        }
        if (body_len > max_body) {
            refuse(BodyTooLargeError, i, "body is %d bytes, at most %lld allowed", body_len,
                   max_body);
            goto done;
        }
        int64_t tlen = b[topic_len_at];
        int64_t props_len_at = topic_len_at + 1 + tlen;
        if (props_len_at + 2 > (int64_t)at + size) {
            refuse(CorruptBlockError, i, "topic length runs past the record");
            goto done;
        }
        if (tlen != topic_len || memcmp(b + topic_len_at + 1, topic_raw, (size_t)tlen)) {
            PyErr_Format(CorruptBlockError, "record %lld of the block: its topic is not the block's (%U)",
                         i, topic);
            goto done;
        }
        int32_t props_len = (int16_t)rd16(b + props_len_at);
        if (props_len < 0 || props_len_at + 2 + props_len != (int64_t)at + size) {
            refuse(CorruptBlockError, i, "record length does not match its fields");
            goto done;
        }
        if (check_properties(i, b + props_len_at + 2, props_len) < 0) goto done;
        int64_t head_len = i == 0 ? head.len : 0;
        int64_t new_props_len = props_len + head_len + (record_crc ? RECORD_CRC_SIZE : 0);
        if (new_props_len > PROPERTIES_MAX) {
            refuse(PropertiesTooLargeError, i, "properties are %d bytes, at most %lld allowed",
                   props_len, (long long)(PROPERTIES_MAX - new_props_len + props_len));
            goto done;
        }
        int64_t stored_size = size + added + head_len;
        if (pos + stored_size + BLANK_SIZE > file_end) {
            if (stored_size + BLANK_SIZE > file_size) {
                refuse(BodyTooLargeError, i,
                       "%lld bytes cannot fit a CommitLog file of %lld bytes",
                       (long long)stored_size, file_size);
                goto done;
            }
            if (out_at > span_out && append_span(spans, span_start, span_out, out_at - span_out, 0) < 0)
                goto done;
            if (append_span(spans, pos, out_at, 0, 1) < 0) goto done;
            pos = span_start = file_end;
            span_out = out_at;
            file_end += file_size;
            if (append_pair(file_starts, (Py_ssize_t)i, pos) < 0) goto done;
        }
        if (nsent == cap) {
            sent_t *grown = PyMem_Malloc(sizeof(sent_t) * (size_t)cap * 2);
            if (grown == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            memcpy(grown, sent, sizeof(sent_t) * (size_t)cap);
            if (sent != sent_small) PyMem_Free(sent);
            sent = grown;
            cap *= 2;
        }
        sent[nsent].at = at;
        sent[nsent].size = size;
        sent[nsent].body_len = body_len;
        body_total += body_len;
        sent[nsent].props_len = props_len;
        sent[nsent].stored_size = (int32_t)stored_size;
        sent[nsent].pos = pos;
        nsent++;
        last_pos = pos;
        last_size = stored_size;
        pos += stored_size;
        out_at += (Py_ssize_t)stored_size;
        at += size;
    }
    if (at != n) {
        PyErr_Format(CorruptBlockError, "the block holds %zd bytes after its %lld records", n - at,
                     count);
        goto done;
    }
    if (out_at > span_out && append_span(spans, span_start, span_out, out_at - span_out, 0) < 0)
        goto done;
    Py_ssize_t total = out_at - (Py_ssize_t)out_pos;
    if ((Py_ssize_t)out_pos > outb.len || total > outb.len - (Py_ssize_t)out_pos) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes; the block needs %zd from out_pos %lld",
                     outb.len, total, out_pos);
        goto done;
    }

    /* pass 2: write the stored records; a block that shares memory with out is read from a
     * copy, so the bytes are those the Python twin writes */
    uint8_t *o = (uint8_t *)outb.buf + out_pos;
    if ((const uint8_t *)b < o + total && o < (const uint8_t *)b + n) {
        copy = PyMem_Malloc((size_t)n ? (size_t)n : 1);
        if (copy == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(copy, b, (size_t)n);
        b = copy;
    }
    suffix_cache_t suffixes = {NULL, 0, 0};
    for (Py_ssize_t i = 0; i < nsent; i++) {
        const sent_t *s = &sent[i];
        const uint8_t *r = b + s->at;
        const uint8_t *body = r + HEADER_V4;
        const uint8_t *tail = body + s->body_len; /* topic length, topic, props length, props */
        Py_ssize_t tail_len = s->size - HEADER_V4 - s->body_len;
        Py_ssize_t head_len = i == 0 ? head.len : 0;
        uint8_t *h = o;
        uint8_t *w;
        wr32(h, (uint32_t)s->stored_size);
        wr32(h + 4, MAGIC_V1);
        wr32(h + 8, crc32_update(0, body, (size_t)s->body_len) & CRC_MASK);
        wr32(h + 12, (uint32_t)queue_id);
        memcpy(h + 16, r + 16, 4); /* FLAG */
        wr64(h + 20, (uint64_t)(first_qoff + i));
        wr64(h + 28, (uint64_t)s->pos);
        wr32(h + 36, (uint32_t)(host_flags | (i ? (int32_t)member : 0)));
        int64_t born_ts = (int64_t)rd64(r + 40);
        wr64(h + 40, (uint64_t)(born_ts ? born_ts : now_ms));
        w = h + 48;
        memcpy(w, born_addr, (size_t)born_alen);
        w += born_alen;
        wr32(w, (uint32_t)born_port);
        wr64(w + 4, (uint64_t)now_ms);
        w += 12;
        memcpy(w, store_addr, (size_t)store_alen);
        w += store_alen;
        wr32(w, (uint32_t)store_port);
        memset(w + 4, 0, 12); /* RECONSUMETIMES, PREPARED TRANSACTION OFFSET */
        wr32(w + 16, (uint32_t)s->body_len);
        w += 20;
        memcpy(w, body, (size_t)s->body_len);
        w += s->body_len;
        uint8_t *suffix = w;
        Py_ssize_t topic_part = tail_len - 2 - s->props_len; /* topic length byte and topic */
        memcpy(w, tail, (size_t)topic_part);
        w += topic_part;
        wr16(w, (uint16_t)(s->props_len + head_len + (record_crc ? RECORD_CRC_SIZE : 0)));
        w += 2;
        memcpy(w, tail + topic_part + 2, (size_t)s->props_len);
        w += s->props_len;
        if (head_len) {
            memcpy(w, head.buf, (size_t)head_len);
            w += head_len;
        }
        if (record_crc) {
            memcpy(w, RECORD_CRC_NAME, RECORD_CRC_NAME_LEN);
            w += RECORD_CRC_NAME_LEN;
            uint32_t c = suffix_crc(&suffixes, suffix, w - suffix);
            c = crc32_update(c, h, (size_t)hdr_size) & CRC_MASK;
            digits10(c, w);
            w[10] = 0x02;
            w += 11;
        }
        o = w;
    }

    {
        int64_t first = start;
        if (PyList_GET_SIZE(file_starts)) {
            PyObject *fs0 = PyList_GET_ITEM(file_starts, 0);
            if (PyLong_AsSsize_t(PyTuple_GET_ITEM(fs0, 0)) == 0)
                first = PyLong_AsLongLong(PyTuple_GET_ITEM(fs0, 1));
        }
        result = PyObject_CallFunction(FilledBlockType, "OLLLLLnOL", spans, (long long)pos,
                                       (long long)first, (long long)last_pos,
                                       (long long)last_size, (long long)added, head.len,
                                       file_starts, body_total);
    }

done:
    if (sent != NULL && sent != sent_small) PyMem_Free(sent);
    PyMem_Free(copy);
    Py_XDECREF(spans);
    Py_XDECREF(file_starts);
    if (have_out) PyBuffer_Release(&outb);
    PyBuffer_Release(&rec);
    if (head.obj != NULL) PyBuffer_Release(&head);
    return result;
}

/* ------------------------------------------------------------------ scan_span */

typedef struct {
    PyObject *str;
    uint64_t hash;
    Py_ssize_t len;
    const uint8_t *data; /* the str's ASCII bytes */
} topic_t;

typedef struct {
    Py_ssize_t topic;
    int32_t qid;
    int64_t first, next;
    int next_ok; /* false when the last queue offset was INT64_MAX */
    uint8_t *entries;
    Py_ssize_t len, cap;
} run_t;

typedef struct {
    topic_t *topics;
    Py_ssize_t ntopics, captopics;
    Py_ssize_t *tslots; /* index + 1, 0 empty */
    size_t tmask;
    run_t *runs;
    Py_ssize_t nruns, capruns;
    Py_ssize_t *rslots;
    size_t rmask;
    Py_ssize_t last_topic, last_run;
} scan_t;

static uint64_t fnv(const uint8_t *p, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static uint64_t run_hash(Py_ssize_t topic, int32_t qid) {
    uint64_t h = (uint64_t)topic * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uint32_t)qid * 0xC2B2AE3D27D4EB4FULL;
    return h ^ (h >> 29);
}

static void scan_free(scan_t *s) {
    for (Py_ssize_t i = 0; i < s->ntopics; i++) Py_DECREF(s->topics[i].str);
    for (Py_ssize_t i = 0; i < s->nruns; i++) PyMem_Free(s->runs[i].entries);
    PyMem_Free(s->topics);
    PyMem_Free(s->tslots);
    PyMem_Free(s->runs);
    PyMem_Free(s->rslots);
}

static int rehash(Py_ssize_t **slots, size_t *mask, Py_ssize_t count, uint64_t (*key)(void *, Py_ssize_t),
                  void *ctx) {
    size_t size = (*mask + 1) * 2;
    Py_ssize_t *grown = PyMem_Calloc(size, sizeof(Py_ssize_t));
    if (grown == NULL) return -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        size_t j = (size_t)key(ctx, i) & (size - 1);
        while (grown[j]) j = (j + 1) & (size - 1);
        grown[j] = i + 1;
    }
    PyMem_Free(*slots);
    *slots = grown;
    *mask = size - 1;
    return 0;
}

static uint64_t topic_key(void *ctx, Py_ssize_t i) { return ((scan_t *)ctx)->topics[i].hash; }
static uint64_t run_key(void *ctx, Py_ssize_t i) {
    run_t *r = &((scan_t *)ctx)->runs[i];
    return run_hash(r->topic, r->qid);
}

/* Whether these are the bytes of the last topic seen, one already found valid. */
static inline int same_topic(const scan_t *s, const uint8_t *p, Py_ssize_t n) {
    if (s->last_topic < 0) return 0;
    const topic_t *t = &s->topics[s->last_topic];
    return t->len == n && !memcmp(t->data, p, (size_t)n);
}

/* The index of the topic with these bytes, creating its str on first sight; -1 on error. */
static Py_ssize_t topic_index(scan_t *s, const uint8_t *p, Py_ssize_t n) {
    if (s->last_topic >= 0) {
        topic_t *t = &s->topics[s->last_topic];
        if (t->len == n && !memcmp(t->data, p, (size_t)n)) return s->last_topic;
    }
    uint64_t h = fnv(p, n);
    size_t j = (size_t)h & s->tmask;
    while (s->tslots[j]) {
        topic_t *t = &s->topics[s->tslots[j] - 1];
        if (t->hash == h && t->len == n && !memcmp(t->data, p, (size_t)n))
            return s->last_topic = s->tslots[j] - 1;
        j = (j + 1) & s->tmask;
    }
    if (s->ntopics == s->captopics) {
        Py_ssize_t cap = s->captopics ? s->captopics * 2 : 8;
        topic_t *grown = PyMem_Realloc(s->topics, sizeof(topic_t) * (size_t)cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->topics = grown;
        s->captopics = cap;
    }
    PyObject *str = PyUnicode_DecodeASCII((const char *)p, n, "strict");
    if (str == NULL) return -1;
    topic_t *t = &s->topics[s->ntopics];
    t->str = str;
    t->hash = h;
    t->len = n;
    t->data = PyUnicode_1BYTE_DATA(str);
    s->tslots[j] = ++s->ntopics;
    if ((size_t)s->ntopics * 2 > s->tmask + 1 &&
        rehash(&s->tslots, &s->tmask, s->ntopics, topic_key, s) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return s->last_topic = s->ntopics - 1;
}

static PyObject *run_tuple(scan_t *s, run_t *r) {
    PyObject *entries = PyBytes_FromStringAndSize((const char *)r->entries, r->len);
    if (entries == NULL) return NULL;
    PyObject *t = Py_BuildValue("(OiLN)", s->topics[r->topic].str, r->qid, (long long)r->first,
                                entries);
    return t;
}

/* Add one ConsumeQueue entry; a record that does not continue its queue's open run closes it
 * into ``closed`` and opens a new one in the same place of the order (block.py's dict). */
static int add_entry(scan_t *s, PyObject *closed, Py_ssize_t topic, int32_t qid, int64_t qoff,
                     const uint8_t entry[ENTRY_SIZE]) {
    run_t *r = NULL;
    if (s->last_run >= 0 && s->runs[s->last_run].topic == topic && s->runs[s->last_run].qid == qid) {
        r = &s->runs[s->last_run];
    } else {
        size_t j = (size_t)run_hash(topic, qid) & s->rmask;
        while (s->rslots[j]) {
            run_t *c = &s->runs[s->rslots[j] - 1];
            if (c->topic == topic && c->qid == qid) {
                r = c;
                break;
            }
            j = (j + 1) & s->rmask;
        }
        if (r == NULL) {
            if (s->nruns == s->capruns) {
                Py_ssize_t cap = s->capruns ? s->capruns * 2 : 8;
                run_t *grown = PyMem_Realloc(s->runs, sizeof(run_t) * (size_t)cap);
                if (grown == NULL) {
                    PyErr_NoMemory();
                    return -1;
                }
                s->runs = grown;
                s->capruns = cap;
            }
            r = &s->runs[s->nruns];
            memset(r, 0, sizeof *r);
            r->topic = topic;
            r->qid = qid;
            r->first = qoff;
            s->rslots[j] = ++s->nruns;
            if ((size_t)s->nruns * 2 > s->rmask + 1 &&
                rehash(&s->rslots, &s->rmask, s->nruns, run_key, s) < 0) {
                PyErr_NoMemory();
                return -1;
            }
            r = &s->runs[s->nruns - 1];
        }
        s->last_run = r - s->runs;
    }
    if (r->len > 0 && !(r->next_ok && r->next == qoff)) {
        PyObject *t = run_tuple(s, r);
        if (t == NULL || PyList_Append(closed, t) < 0) {
            Py_XDECREF(t);
            return -1;
        }
        Py_DECREF(t);
        r->len = 0;
        r->first = qoff;
    }
    if (r->len + ENTRY_SIZE > r->cap) {
        Py_ssize_t cap = r->cap ? r->cap * 2 : 20 * 64;
        uint8_t *grown = PyMem_Realloc(r->entries, (size_t)cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        r->entries = grown;
        r->cap = cap;
    }
    memcpy(r->entries + r->len, entry, ENTRY_SIZE);
    r->len += ENTRY_SIZE;
    r->next_ok = qoff != INT64_MAX;
    r->next = qoff + (r->next_ok ? 1 : 0);
    return 0;
}

static PyObject *keys_list(const span_t *uniq, const span_t *keys) {
    PyObject *list = PyList_New(0), *k;
    if (list == NULL) return NULL;
    if (uniq->n) {
        k = PyBytes_FromStringAndSize((const char *)uniq->p, uniq->n);
        if (k == NULL || PyList_Append(list, k) < 0) goto fail;
        Py_DECREF(k);
    }
    if (keys->n) { /* bytes.split(b" "): empty pieces included */
        const uint8_t *p = keys->p, *end = keys->p + keys->n;
        for (;;) {
            const uint8_t *sp = memchr(p, ' ', (size_t)(end - p));
            const uint8_t *e = sp ? sp : end;
            k = PyBytes_FromStringAndSize((const char *)p, e - p);
            if (k == NULL || PyList_Append(list, k) < 0) goto fail;
            Py_DECREF(k);
            if (!sp) break;
            p = sp + 1;
        }
    }
    return list;
fail:
    Py_XDECREF(k);
    Py_DECREF(list);
    return NULL;
}

PyDoc_STRVAR(scan_span_doc,
             "scan_span(buf, pos, limit, base, verify_from, require_record_crc, max_records)"
             " -> SpanScan\n\nblock.py_scan_span, compiled.");

static PyObject *scan_span(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buf", "pos", "limit", "base", "verify_from", "require_record_crc",
                             "max_records", NULL};
    Py_buffer view;
    Py_ssize_t pos, limit, max_records;
    long long base, verify_from;
    int require;
    scan_t s;
    PyObject *closed = NULL, *keyed = NULL, *result = NULL, *reason = NULL;
    char why[160];

    if (check_ready() < 0) return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*nnLLpn", kwlist, &view, &pos, &limit, &base,
                                     &verify_from, &require, &max_records))
        return NULL;
    memset(&s, 0, sizeof s);
    s.last_topic = s.last_run = -1;
    if (pos < 0 || limit > view.len) {
        PyErr_Format(PyExc_ValueError, "span [%zd, %zd) outside a buffer of %zd bytes", pos, limit,
                     view.len);
        goto done;
    }
    s.tmask = s.rmask = 15;
    s.tslots = PyMem_Calloc(16, sizeof(Py_ssize_t));
    s.rslots = PyMem_Calloc(16, sizeof(Py_ssize_t));
    closed = PyList_New(0);
    keyed = PyList_New(0);
    if (s.tslots == NULL || s.rslots == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (closed == NULL || keyed == NULL) goto done;

    const uint8_t *b = view.buf;
    Py_ssize_t count = 0;
    int64_t last_ms = 0;
    suffix_cache_t suffixes = {NULL, 0, 0};
    int status = ST_OK;
    while (pos < limit) {
        if (max_records && count >= max_records) break;
        int64_t at = base + pos;
        rec_t r;
        int st = layout(b, view.len, pos, limit, at, &r, why, sizeof why);
        if (st == ST_OK && !same_topic(&s, b + r.topic_s, r.topic_e - r.topic_s) &&
            !topic_ok(b + r.topic_s, r.topic_e - r.topic_s)) {
            st = ST_CORRUPT;
            snprintf(why, sizeof why, "topic is empty or holds bytes no topic may hold");
        }
        if (st == ST_OK && at >= verify_from) {
            const char *problem = crc_problem(b, view.len, &r, require, &suffixes);
            if (problem != NULL) {
                st = ST_CORRUPT;
                snprintf(why, sizeof why, "%s", problem);
            }
        }
        if (st != ST_OK) {
            status = st;
            if (why[0] && (reason = PyUnicode_FromString(why)) == NULL) goto done;
            break;
        }
        span_t tags, keys, uniq;
        props_of(b, &r, &tags, &keys, &uniq);
        Py_ssize_t topic = topic_index(&s, b + r.topic_s, r.topic_e - r.topic_s);
        if (topic < 0) goto done;
        int tx = r.sys_flag & TX_MASK;
        if (tx != TX_PREPARED && tx != TX_ROLLBACK) {
            int64_t code = 0;
            topic_t *t = &s.topics[topic];
            if (!(r.props_len && t->len == (Py_ssize_t)sizeof(TIMER_TOPIC) - 1 &&
                  !memcmp(t->data, TIMER_TOPIC, sizeof(TIMER_TOPIC) - 1) &&
                  timer_deliver_ms(b + r.props_s, r.props_e - r.props_s, &code))) {
                code = 0;
                if (tags.n && tag_code_of(tags.p, tags.n, &code) < 0) goto done;
            }
            uint8_t entry[ENTRY_SIZE];
            wr64(entry, (uint64_t)r.phy);
            wr32(entry + 8, (uint32_t)(r.end - r.pos));
            wr64(entry + 12, (uint64_t)code);
            if (add_entry(&s, closed, topic, r.queue_id, r.queue_offset, entry) < 0) goto done;
        }
        if (tx != TX_ROLLBACK && (keys.n || uniq.n)) {
            PyObject *list = keys_list(&uniq, &keys);
            if (list == NULL) goto done;
            PyObject *t = Py_BuildValue("(OLLN)", s.topics[topic].str, (long long)r.phy,
                                        (long long)r.store_ts, list);
            if (t == NULL || PyList_Append(keyed, t) < 0) {
                Py_XDECREF(t);
                goto done;
            }
            Py_DECREF(t);
        }
        last_ms = r.store_ts;
        count++;
        pos = r.end;
    }
    for (Py_ssize_t i = 0; i < s.nruns; i++) {
        PyObject *t = run_tuple(&s, &s.runs[i]);
        if (t == NULL || PyList_Append(closed, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
    }
    result = PyObject_CallFunction(SpanScanType, "nniOOOL", count, pos, status,
                                   reason ? reason : Py_None, closed, keyed, (long long)last_ms);
done:
    scan_free(&s);
    Py_XDECREF(reason);
    Py_XDECREF(closed);
    Py_XDECREF(keyed);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------ gather_records */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int has_code(const int64_t *codes, Py_ssize_t n, int64_t code) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (codes[mid] < code)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && codes[lo] == code;
}

static PyObject *corrupt_record(int64_t phy, const char *why) {
    PyObject *e = PyObject_CallFunction(CorruptRecordError, "Ls", (long long)phy, why);
    if (e != NULL) {
        PyErr_SetObject(CorruptRecordError, e);
        Py_DECREF(e);
    }
    return NULL;
}

/* Whether the record's TAGS (decoded as a reader decodes it) is one of ``tags`` (UTF-8). */
static int tags_match(const uint8_t *b, const rec_t *r, PyObject *const *tags, Py_ssize_t ntags) {
    span_t v;
    if (!stored_tags(b, r, &v)) return 0;
    PyObject *fixed = NULL;
    if (!utf8_valid(v.p, v.n)) { /* compare what decoding with replacement gives */
        PyObject *s = PyUnicode_DecodeUTF8((const char *)v.p, v.n, "replace");
        if (s == NULL) return -1;
        fixed = PyUnicode_AsUTF8String(s);
        Py_DECREF(s);
        if (fixed == NULL) return -1;
        v.p = (const uint8_t *)PyBytes_AS_STRING(fixed);
        v.n = PyBytes_GET_SIZE(fixed);
    }
    int found = 0;
    for (Py_ssize_t i = 0; i < ntags && !found; i++) {
        if (tags[i] == NULL) continue;
        found = PyBytes_GET_SIZE(tags[i]) == v.n && !memcmp(PyBytes_AS_STRING(tags[i]), v.p, (size_t)v.n);
    }
    Py_XDECREF(fixed);
    return found;
}

PyDoc_STRVAR(gather_doc,
             "gather_records(buf, base, written, readable, visible, entries, tag_codes, tags,"
             " max_records, max_bytes, out, require_record_crc) -> GatherResult\n\n"
             "gather.py_gather_records, compiled.");

static PyObject *gather_records(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buf", "base", "written", "readable", "visible", "entries",
                             "tag_codes", "tags", "max_records", "max_bytes", "out",
                             "require_record_crc", NULL};
    Py_buffer view, ents = {0};
    long long base, readable, visible;
    Py_ssize_t written, max_records, max_bytes;
    PyObject *tag_codes, *tags, *out, *result = NULL;
    int require;
    int64_t *codes = NULL;
    Py_ssize_t ncodes = 0, ntags = 0;
    PyObject **tag_bytes = NULL;
    char why[160];
    Py_ssize_t consumed = 0, records = 0, nbytes = 0;
    int stop = G_ENTRIES_END;

    if (check_ready() < 0) return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*LnLLy*OOnnOp", kwlist, &view, &base, &written,
                                     &readable, &visible, &ents, &tag_codes, &tags, &max_records,
                                     &max_bytes, &out, &require))
        return NULL;
    if (base < 0 || written < 0 || written > view.len) {
        PyErr_Format(PyExc_ValueError, "a file at log offset %lld with %zd of %zd bytes written",
                     base, written, view.len);
        goto done;
    }
    if (ents.len % ENTRY_SIZE) {
        PyErr_Format(PyExc_ValueError, "%zd bytes of entries are not whole 20-byte entries",
                     ents.len);
        goto done;
    }
    if (!PyByteArray_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a bytearray");
        goto done;
    }
    if (max_records <= 0) {
        stop = G_RECORD_LIMIT;
        goto answer;
    }
    if (tag_codes != Py_None) {
        PyObject *seq = PySequence_Fast(tag_codes, "tag_codes must be a collection of ints");
        if (seq == NULL) goto done;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        codes = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
        if (codes == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            int overflow;
            long long v = PyLong_AsLongLongAndOverflow(PySequence_Fast_GET_ITEM(seq, i), &overflow);
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                goto done;
            }
            if (!overflow) codes[ncodes++] = v; /* a code beyond int64 matches no entry */
        }
        Py_DECREF(seq);
        qsort(codes, (size_t)ncodes, sizeof(int64_t), cmp_i64);
    }
    if (tags != Py_None) {
        PyObject *seq = PySequence_Fast(tags, "tags must be a collection of str");
        if (seq == NULL) goto done;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        tag_bytes = PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyObject *));
        if (tag_bytes == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            goto done;
        }
        ntags = n;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *t = PySequence_Fast_GET_ITEM(seq, i);
            if (!PyUnicode_Check(t)) {
                Py_DECREF(seq);
                PyErr_SetString(PyExc_TypeError, "tags must be a collection of str");
                goto done;
            }
            tag_bytes[i] = PyUnicode_AsUTF8String(t);
            if (tag_bytes[i] == NULL) { /* a lone surrogate: no stored TAGS decodes to it */
                if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
                    Py_DECREF(seq);
                    goto done;
                }
                PyErr_Clear();
            }
        }
        Py_DECREF(seq);
    }

    const uint8_t *b = view.buf, *e = ents.buf;
    const Py_ssize_t nents = ents.len / ENTRY_SIZE;
    const int64_t file_end = base + view.len;
    const int64_t limit64 = readable - base < written ? readable - base : written;
    suffix_cache_t suffixes = {NULL, 0, 0};
    for (Py_ssize_t i = 0; i < nents; i++, e += ENTRY_SIZE) {
        int64_t phy = (int64_t)rd64(e);
        int32_t size = (int32_t)rd32(e + 8);
        int64_t code = (int64_t)rd64(e + 12);
        if (phy == 0 && size == BLANK_ENTRY_SIZE) {
            consumed++;
            continue;
        }
        int64_t reach;
        if (__builtin_add_overflow(phy, (int64_t)size, &reach) ? size > 0 : reach > visible) {
            stop = G_NOT_VISIBLE;
            break;
        }
        if (codes != NULL && !has_code(codes, ncodes, code)) {
            consumed++;
            continue;
        }
        Py_ssize_t have = PyByteArray_GET_SIZE(out);
        if (have > 0 && (int64_t)have + size > (int64_t)max_bytes) {
            stop = G_BYTE_LIMIT;
            break;
        }
        if (phy < base || phy >= file_end) {
            stop = G_OTHER_FILE;
            break;
        }
        if (phy >= readable) {
            corrupt_record(phy, "no record at this offset");
            goto done;
        }
        /* base <= phy < readable: the limit, as CommitLog.read computes it, is past pos */
        Py_ssize_t pos = (Py_ssize_t)(phy - base);
        Py_ssize_t limit = (Py_ssize_t)limit64;
        rec_t r;
        int st = layout(b, view.len, pos, limit, phy, &r, why, sizeof why);
        if (st == ST_EOF) {
            corrupt_record(phy, "a blank marker, not a record");
            goto done;
        }
        if (st != ST_OK) {
            corrupt_record(phy, why);
            goto done;
        }
        if (!topic_ok(b + r.topic_s, r.topic_e - r.topic_s)) {
            corrupt_record(phy, "topic is empty or holds bytes no topic may hold");
            goto done;
        }
        const char *problem = crc_problem(b, view.len, &r, require, &suffixes);
        if (problem != NULL) {
            corrupt_record(phy, problem);
            goto done;
        }
        if (r.end - r.pos != size) {
            corrupt_record(phy, "not a record");
            goto done;
        }
        consumed++;
        if (tags != Py_None) {
            int m = tags_match(b, &r, tag_bytes, ntags);
            if (m < 0) goto done;
            if (!m) continue; /* a tag-hash collision */
        }
        if (PyByteArray_Resize(out, have + size) < 0) goto done;
        memcpy(PyByteArray_AS_STRING(out) + have, b + pos, (size_t)size);
        records++;
        nbytes += size;
        if (records >= max_records) {
            stop = G_RECORD_LIMIT;
            break;
        }
    }
answer:
    result = PyObject_CallFunction(GatherResultType, "nnni", consumed, records, nbytes, stop);
done:
    PyMem_Free(codes);
    if (tag_bytes != NULL) {
        for (Py_ssize_t i = 0; i < ntags; i++) Py_XDECREF(tag_bytes[i]);
        PyMem_Free(tag_bytes);
    }
    PyBuffer_Release(&ents);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------ setup, module */

PyDoc_STRVAR(setup_doc,
             "setup(corrupt_block, invalid_property, properties_too_large, body_too_large,"
             " corrupt_record, filled_block, span_scan, gather_result)\n\n"
             "The error classes and answer types, from block.py (called once at its import).");

/* ------------------------------------------------------------------ scan_runs */

/* Whether the properties hold an item named exactly `name` (name 0x01 value). */
static int find_prop(const uint8_t *b, const rec_t *r, const uint8_t *name, Py_ssize_t name_len) {
    if (!r->props_len) return 0;
    const uint8_t *p = b + r->props_s, *end = b + r->props_e;
    for (;;) {
        const uint8_t *sep = memchr(p, 0x02, (size_t)(end - p));
        const uint8_t *item_end = sep ? sep : end;
        if (item_end - p > name_len && p[name_len] == 0x01 && !memcmp(p, name, (size_t)name_len))
            return 1;
        if (!sep) return 0;
        p = sep + 1;
    }
}

static int append_item(PyObject *items, PyObject *t) {
    if (t == NULL) return -1;
    int rc = PyList_Append(items, t);
    Py_DECREF(t);
    return rc;
}

PyDoc_STRVAR(scan_runs_doc,
"scan_runs(buf, pos, limit, base, max_records, name, member_flag) -> tuple\n\n"
"The compiled twin of runs.py_scan_runs (its docstring says what it answers).");

static PyObject *scan_runs(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buf", "pos", "limit", "base", "max_records", "name", "member_flag",
                             NULL};
    Py_buffer view, name;
    Py_ssize_t pos, limit, max_records;
    long long base;
    int member_flag;
    scan_t s;
    PyObject *items = NULL, *result = NULL, *reason = NULL, *last = NULL;
    char why[160];

    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*nnLny*i", kwlist, &view, &pos, &limit, &base,
                                     &max_records, &name, &member_flag))
        return NULL;
    memset(&s, 0, sizeof s);
    s.last_topic = s.last_run = -1;
    if (pos < 0 || limit > view.len) {
        PyErr_Format(PyExc_ValueError, "span [%zd, %zd) outside a buffer of %zd bytes", pos, limit,
                     view.len);
        goto done;
    }
    s.tmask = 15;
    s.tslots = PyMem_Calloc(16, sizeof(Py_ssize_t));
    if (s.tslots == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    items = PyList_New(0);
    if (items == NULL) goto done;

    const uint8_t *b = view.buf;
    Py_ssize_t count = 0;
    int status = ST_OK;
    /* The open segment of member records: their topic and queue, first and next queue offset,
     * count, and the last one's position and size; kind: 0 none, 1 members, 2 plain records. */
    int kind = 0;
    Py_ssize_t seg_topic = -1;
    int32_t seg_qid = 0;
    int64_t seg_first = 0, seg_next = 0, seg_last_phy = 0;
    Py_ssize_t seg_count = 0, seg_last_size = 0;
    rec_t prev;
    Py_ssize_t prev_topic = -1;
    while (pos < limit) {
        if (max_records && count >= max_records) break;
        int64_t at = base + pos;
        rec_t r;
        int st = layout(b, view.len, pos, limit, at, &r, why, sizeof why);
        if (st == ST_OK && !same_topic(&s, b + r.topic_s, r.topic_e - r.topic_s) &&
            !topic_ok(b + r.topic_s, r.topic_e - r.topic_s)) {
            st = ST_CORRUPT;
            snprintf(why, sizeof why, "topic is empty or holds bytes no topic may hold");
        }
        if (st != ST_OK) {
            status = st;
            if (why[0] && (reason = PyUnicode_FromString(why)) == NULL) goto done;
            break;
        }
        Py_ssize_t topic = topic_index(&s, b + r.topic_s, r.topic_e - r.topic_s);
        if (topic < 0) goto done;
        int stamped = find_prop(b, &r, name.buf, name.len);
        int member = !stamped && (r.sys_flag & member_flag);
        int continues = kind == 1 && member && topic == seg_topic && r.queue_id == seg_qid &&
                        r.queue_offset == seg_next;
        if (kind == 1 && !continues) {
            if (append_item(items, Py_BuildValue("(iOiLnLn)", 1, s.topics[seg_topic].str, seg_qid,
                                                 (long long)seg_first, seg_count,
                                                 (long long)seg_last_phy, seg_last_size)) < 0)
                goto done;
            kind = 0;
        }
        if (stamped) {
            PyObject *props = PyBytes_FromStringAndSize((const char *)b + r.props_s,
                                                        r.props_e - r.props_s);
            if (props == NULL) goto done;
            if (append_item(items, Py_BuildValue("(iLnOiLN)", 0, (long long)r.phy, r.end - r.pos,
                                                 s.topics[topic].str, r.queue_id,
                                                 (long long)r.queue_offset, props)) < 0)
                goto done;
            kind = 0;
        } else if (member) {
            if (!continues) {
                kind = 1;
                seg_topic = topic;
                seg_qid = r.queue_id;
                seg_first = r.queue_offset;
                seg_count = 0;
            }
            seg_count++;
            seg_next = r.queue_offset + 1;
            seg_last_phy = r.phy;
            seg_last_size = r.end - r.pos;
        } else if (kind != 2) {
            if (append_item(items, Py_BuildValue("(iL)", 2, (long long)r.phy)) < 0) goto done;
            kind = 2;
        }
        prev = r;
        prev_topic = topic;
        count++;
        pos = r.end;
    }
    if (kind == 1 &&
        append_item(items, Py_BuildValue("(iOiLnLn)", 1, s.topics[seg_topic].str, seg_qid,
                                         (long long)seg_first, seg_count, (long long)seg_last_phy,
                                         seg_last_size)) < 0)
        goto done;
    if (prev_topic >= 0) {
        last = Py_BuildValue("(LnLO)", (long long)prev.phy, prev.end - prev.pos,
                             (long long)prev.queue_offset, s.topics[prev_topic].str);
        if (last == NULL) goto done;
    } else {
        last = Py_NewRef(Py_None);
    }
    result = Py_BuildValue("(nniOOO)", count, pos, status, reason ? reason : Py_None, items, last);
done:
    scan_free(&s);
    Py_XDECREF(reason);
    Py_XDECREF(items);
    Py_XDECREF(last);
    PyBuffer_Release(&view);
    if (name.obj != NULL) PyBuffer_Release(&name);
    return result;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *o[8];
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7]))
        return NULL;
    for (int i = 0; i < 8; i++) {
        if (!PyType_Check(o[i])) {
            PyErr_SetString(PyExc_TypeError, "setup takes classes");
            return NULL;
        }
    }
    PyObject **slots[8] = {&CorruptBlockError, &InvalidPropertyError, &PropertiesTooLargeError,
                           &BodyTooLargeError, &CorruptRecordError, &FilledBlockType,
                           &SpanScanType, &GatherResultType};
    for (int i = 0; i < 8; i++) {
        Py_INCREF(o[i]);
        Py_XSETREF(*slots[i], o[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, setup_doc},
    {"crc32", (PyCFunction)(void (*)(void))py_crc32, METH_FASTCALL, crc32_doc},
    {"_crc32_each", (PyCFunction)(void (*)(void))py_crc32_each, METH_FASTCALL,
     "_crc32_each(data, start) -> list[int]: crc32 by each path this CPU has (tests)."},
    {"fill_block", (PyCFunction)(void (*)(void))fill_block, METH_VARARGS | METH_KEYWORDS,
     fill_block_doc},
    {"scan_span", (PyCFunction)(void (*)(void))scan_span, METH_VARARGS | METH_KEYWORDS,
     scan_span_doc},
    {"gather_records", (PyCFunction)(void (*)(void))gather_records, METH_VARARGS | METH_KEYWORDS,
     gather_doc},
    {"scan_runs", (PyCFunction)(void (*)(void))scan_runs, METH_VARARGS | METH_KEYWORDS,
     scan_runs_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cblock",
    "The compiled twin of tidemq.storage.record.block and gather (see _cblock.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cblock(void) {
    crc_init();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    const char *crc = have_vpclmul ? "vpclmulqdq" : have_clmul ? "pclmul" : "slice-by-8";
    if (PyModule_AddStringConstant(m, "CRC32_IMPLEMENTATION", crc) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
