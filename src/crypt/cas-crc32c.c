/* CRC32C: hardware (SSE4.2 crc32 instruction) with a slicing-by-8 table
   fallback. The choice is made once, at first use, from cpuid. */

#include "lib.h"
#include "cas-crc32c.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#  define CAS_CRC32C_HAVE_X86 1
#  include <cpuid.h>
#endif

#define CRC32C_POLY 0x82F63B78U

static uint32_t crc32c_table[8][256];
static bool crc32c_table_ready = FALSE;

static void crc32c_table_init(void)
{
	uint32_t crc;
	unsigned int i, j;

	for (i = 0; i < 256; i++) {
		crc = i;
		for (j = 0; j < 8; j++)
			crc = (crc >> 1) ^ ((crc & 1) != 0 ? CRC32C_POLY : 0);
		crc32c_table[0][i] = crc;
	}
	for (i = 0; i < 256; i++) {
		crc = crc32c_table[0][i];
		for (j = 1; j < 8; j++) {
			crc = crc32c_table[0][crc & 0xff] ^ (crc >> 8);
			crc32c_table[j][i] = crc;
		}
	}
	crc32c_table_ready = TRUE;
}

uint32_t cas_crc32c_update_sw(uint32_t crc, const void *data, size_t size)
{
	const unsigned char *p = data;
	uint64_t word;

	if (!crc32c_table_ready)
		crc32c_table_init();
	crc = ~crc;
	for (; size > 0 && ((uintptr_t)p & 7) != 0; size--)
		crc = crc32c_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
	for (; size >= 8; size -= 8, p += 8) {
		memcpy(&word, p, 8);
#ifdef WORDS_BIGENDIAN
		word = __builtin_bswap64(word);
#endif
		word ^= crc;
		crc = crc32c_table[7][word & 0xff] ^
			crc32c_table[6][(word >> 8) & 0xff] ^
			crc32c_table[5][(word >> 16) & 0xff] ^
			crc32c_table[4][(word >> 24) & 0xff] ^
			crc32c_table[3][(word >> 32) & 0xff] ^
			crc32c_table[2][(word >> 40) & 0xff] ^
			crc32c_table[1][(word >> 48) & 0xff] ^
			crc32c_table[0][word >> 56];
	}
	for (; size > 0; size--)
		crc = crc32c_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

#ifdef CAS_CRC32C_HAVE_X86
__attribute__((target("sse4.2")))
static uint32_t crc32c_update_hw(uint32_t crc, const void *data, size_t size)
{
	const unsigned char *p = data;
	uint64_t crc64, word;

	crc = ~crc;
	for (; size > 0 && ((uintptr_t)p & 7) != 0; size--)
		crc = __builtin_ia32_crc32qi(crc, *p++);
	crc64 = crc;
	for (; size >= 8; size -= 8, p += 8) {
		memcpy(&word, p, 8);
		crc64 = __builtin_ia32_crc32di(crc64, word);
	}
	crc = (uint32_t)crc64;
	for (; size > 0; size--)
		crc = __builtin_ia32_crc32qi(crc, *p++);
	return ~crc;
}

static bool crc32c_cpu_has_sse42(void)
{
	unsigned int eax, ebx, ecx, edx;

	if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0)
		return FALSE;
	return (ecx & bit_SSE4_2) != 0;
}
#endif

uint32_t cas_crc32c_update(uint32_t crc, const void *data, size_t size)
{
#ifdef CAS_CRC32C_HAVE_X86
	static int have_hw = -1;

	if (have_hw < 0)
		have_hw = crc32c_cpu_has_sse42() ? 1 : 0;
	if (have_hw > 0)
		return crc32c_update_hw(crc, data, size);
#endif
	return cas_crc32c_update_sw(crc, data, size);
}

uint32_t cas_crc32c(const void *data, size_t size)
{
	return cas_crc32c_update(0, data, size);
}
