#ifndef CAS_CRC32C_H
#define CAS_CRC32C_H

/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as used by
   iSCSI, ext4 and LevelDB. Pack frames, WAL batches and table blocks
   carry it so that damage is found without keys.

   cas_crc32c_update() continues a running CRC: start with 0, feed any
   split of the data, the result equals cas_crc32c() of the whole. Uses
   the SSE4.2 instruction when the CPU has it, a table otherwise; both
   give the same values (tested). */
uint32_t cas_crc32c_update(uint32_t crc, const void *data, size_t size);
uint32_t cas_crc32c(const void *data, size_t size);

/* The portable implementation, exported for tests and benchmarks. */
uint32_t cas_crc32c_update_sw(uint32_t crc, const void *data, size_t size);

/* LevelDB's mask: a CRC stored next to data that itself contains CRCs
   is masked, so CRC-of-CRC patterns do not collide. */
static inline uint32_t cas_crc32c_mask(uint32_t crc)
{
	return ((crc >> 15) | (crc << 17)) + 0xa282ead8U;
}

static inline uint32_t cas_crc32c_unmask(uint32_t masked)
{
	uint32_t rot = masked - 0xa282ead8U;

	return (rot >> 17) | (rot << 15);
}

#endif
