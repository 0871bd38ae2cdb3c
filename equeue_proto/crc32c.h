/* CRC32C (Castagnoli), shared by the C accelerators (_codec.c, _keyhash.c): a
 * slicing-by-8 table, and the SSE4.2 instruction where the CPU has it. Each
 * extension includes it once (static functions) and calls crc_init() when its
 * module loads. */
#ifndef EQUEUE_CRC32C_H
#define EQUEUE_CRC32C_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <nmmintrin.h>
#define EQ_X86 1
#endif

static uint32_t crc_table[8][256];
static int have_hw_crc = 0;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
#ifdef EQ_X86
    __builtin_cpu_init();
    have_hw_crc = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc; /* little-endian host assumed for the fast path */
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

#ifdef EQ_X86
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}
#endif

static uint32_t crc32c(const uint8_t *p, size_t n) {
#ifdef EQ_X86
    if (have_hw_crc) return ~crc_hw(0xFFFFFFFFu, p, n);
#endif
    return ~crc_sw(0xFFFFFFFFu, p, n);
}

/* The CRC register after ``p`` from state ``c``, without the pre/post inversion:
 * linear in (c, data), which is what lets a patch adjust a checksum (patch_committed). */
static uint32_t crc_raw(uint32_t c, const uint8_t *p, size_t n) {
#ifdef EQ_X86
    if (have_hw_crc) return crc_hw(c, p, n);
#endif
    return crc_sw(c, p, n);
}

#endif
