/* Key file layouts (doc/casbox-format.md, "Key file"):

   CASKEY1 (created by key init, read forever):
     0   7  magic "CASKEY1"
     7   1  version (1)
     8  32  root secret (every sub-key is derived from it)
    40  32  BLAKE2b-256 of bytes 0..39
   = 72 bytes

   CASKEY2 (written by key rotate):
     0   7  magic "CASKEY2"
     7   1  version (2)
     8  32  root secret (blob-id key, index key, store key id)
    40   1  slot count n (1..2)
    41   1  current slot (0..n-1): wraps new DEKs
    42   2  reserved, zero
    44  36n slots: key id (4, big-endian) | wrap key (32)
   44+36n 32 BLAKE2b-256 of everything before
   = 112 or 148 bytes

   A CASKEY1 file is a CASKEY2 file with one implicit slot: the wrap key
   derived from the root with the root's key id, so converting one
   changes no blob id, index key or wrapped DEK.

   CASKEY3 (written by key rotate since key epochs, issue 15):
     0   7  magic "CASKEY3"
     7   1  version (3)
     8   4  key id (big-endian): the store's key name, from the first root
    12  32  key fingerprint (public, cas_keyring_fingerprint())
    44   1  slot count n (1..2)
    45   1  current slot (0..n-1): wraps new DEKs
    46   1  epoch count m (1..2)
    47   1  current epoch (0..m-1): new blob ids, sealed records, store keys
    48  36n slots: key id (4, big-endian) | wrap key (32)
   48+36n 36m epochs: epoch number (4, big-endian) | epoch secret (32)
   end  32  BLAKE2b-256 of everything before
   = 152 .. 224 bytes

   An epoch's secret gives its blob-id, index and store keys with the
   same KDF as the CASKEY1/2 root, so the root of a CASKEY1/2 file is
   epoch 0's secret and converting one changes nothing. Epochs after 0
   are random, never derived from an older one: a copy of an older key
   file computes none of their keys. The key id and the fingerprint are
   stored (they stay the same over rotation) because after --finish no
   secret they were derived from remains in the file. */

#include "lib.h"
#include "buffer.h"
#include "str.h"
#include "hex-binary.h"
#include "cas-keyfile.h"
#include "cas-key.h"
#include "cas-userkey.h"
#include "cas-keymode.h"
#include "cas-secmem.h"

#include <sodium.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#define CAS_KEY_FILE_MAGIC_SIZE 7
#define CAS_KEY_FILE_V1_MAGIC "CASKEY1"
#define CAS_KEY_FILE_V1_CHECK_OFFSET (CAS_KEY_FILE_MAGIC_SIZE + 1 + \
				      CAS_KEK_SIZE)
#define CAS_KEY_FILE_V1_SIZE (CAS_KEY_FILE_V1_CHECK_OFFSET + 32)

#define CAS_KEY_FILE_V2_MAGIC "CASKEY2"
#define CAS_KEY_FILE_V2_OFF_COUNT 40
#define CAS_KEY_FILE_V2_OFF_CURRENT 41
#define CAS_KEY_FILE_V2_OFF_SLOTS 44
#define CAS_KEY_FILE_SLOT_SIZE (4 + CAS_KEK_SIZE)
#define CAS_KEY_FILE_V2_SIZE(n) \
	(CAS_KEY_FILE_V2_OFF_SLOTS + (n) * CAS_KEY_FILE_SLOT_SIZE + 32)
#define CAS_KEY_FILE_V3_MAGIC "CASKEY3"
#define CAS_KEY_FILE_V3_OFF_KEY_ID 8
#define CAS_KEY_FILE_V3_OFF_FP 12
#define CAS_KEY_FILE_V3_OFF_COUNT 44
#define CAS_KEY_FILE_V3_OFF_CURRENT 45
#define CAS_KEY_FILE_V3_OFF_EPOCHS 46
#define CAS_KEY_FILE_V3_OFF_CUR_EPOCH 47
#define CAS_KEY_FILE_V3_OFF_SLOTS 48
#define CAS_KEY_FILE_EPOCH_SIZE (4 + CAS_KEK_SIZE)
#define CAS_KEY_FILE_V3_SIZE(n, m) \
	(CAS_KEY_FILE_V3_OFF_SLOTS + (n) * CAS_KEY_FILE_SLOT_SIZE + \
	 (m) * CAS_KEY_FILE_EPOCH_SIZE + 32)
#define CAS_KEY_FILE_MAX_SIZE \
	CAS_KEY_FILE_V3_SIZE(CAS_KEY_FILE_MAX_SLOTS, CAS_KEY_FILE_MAX_EPOCHS)

/* slots a key ring holds in memory: the file's, plus slots a reload
   dropped, kept for unwrapping streams opened before it. A long IMAP
   session can see several rotations between opening a message and
   reading it (32 bytes a slot). */
#define CAS_KEYRING_MAX_SLOTS (CAS_KEY_FILE_MAX_SLOTS + 14)
/* epochs likewise: the file's and those a reload dropped (for opening
   records read before the re-seal reached them) */
#define CAS_KEYRING_MAX_EPOCHS (CAS_KEY_FILE_MAX_EPOCHS + 6)

/* crypto_kdf context (8 bytes) and sub-key ids */
#define CAS_KDF_CONTEXT "CASBOXK1"
enum cas_kdf_subkey {
	CAS_KDF_WRAP = 1,
	CAS_KDF_BLOB_ID = 2,
	CAS_KDF_INDEX = 3,
	CAS_KDF_KEY_ID = 4,
	CAS_KDF_FINGERPRINT = 5,
};
/* store keys (cas_keyring_store_key()): context, purpose = sub-key id */
#define CAS_KDF_STORE_CONTEXT "CASBOXS1"
#define CAS_FINGERPRINT_PERSONAL "CASKFP01"

#define CAS_DEK_AAD_MAGIC "CASDEK1"
#define CAS_DEK_AAD_SIZE (7 + 4 + CAS_BLOB_ID_SIZE)

struct cas_keyring_secrets {
	/* wrap keys, by slot */
	unsigned char wrap[CAS_KEYRING_MAX_SLOTS][CAS_KEK_SIZE];
	/* by epoch index: the epoch's secret and what it derives */
	unsigned char epoch[CAS_KEYRING_MAX_EPOCHS][CAS_KEK_SIZE];
	unsigned char blob_id[CAS_KEYRING_MAX_EPOCHS][CAS_KEK_SIZE];
	unsigned char index[CAS_KEYRING_MAX_EPOCHS][CAS_KEK_SIZE];
};

struct cas_keyring {
	struct cas_keyring_secrets *secrets; /* sodium_malloc()ed, read-only */
	/* the root's id: names the store's key ('K' record), never
	   changes with rotation */
	uint32_t key_id;
	/* slots [0, file_slots) are the key file's; the rest are slots a
	   reload dropped (unwrap only) */
	uint32_t slot_key_ids[CAS_KEYRING_MAX_SLOTS];
	unsigned int slot_count, file_slots, current;
	/* epochs [0, file_epochs) are the key file's, the rest were
	   dropped by a reload (open only); cur_epoch seals and names */
	uint32_t epoch_numbers[CAS_KEYRING_MAX_EPOCHS];
	unsigned int epoch_count, file_epochs, cur_epoch;
	/* public: names the key, the same over every rotation */
	unsigned char fingerprint[CAS_KEY_FINGERPRINT_SIZE];
	/* the loaded file, to notice a replacement (cas_keyring_refresh) */
	bool have_stat;
	struct stat st;
	/* password mode: the user key does everything, secrets is NULL */
	struct cas_userkey *userkey;
	/* what differs between the key modes */
	const struct cas_keyring_backend *backend;
};

/* A key ring's backend: the server key (a KEK in the key file wraps the
   DEKs; slots for rotation) or the password-mode user key (a key pair;
   DEKs sealed to its public key, opened with the password). Each key
   ring has one from its creation; no function branches on the mode. */
struct cas_keyring_backend {
	void (*free)(struct cas_keyring *keyring);
	uint32_t (*wrap_key_id)(const struct cas_keyring *keyring);
	bool (*has_key_id)(const struct cas_keyring *keyring,
			   uint32_t key_id);
	/* st: the file's stat() made by the caller, or NULL */
	int (*refresh)(struct cas_keyring *keyring, const char *path,
		       const struct stat *st, bool *changed_r,
		       const char **error_r);
	void (*blob_id_init)(const struct cas_keyring *keyring,
			     struct cas_blob_id_ctx *ctx);
	void (*record_seal)(const struct cas_keyring *keyring,
			    const void *aad, size_t aad_size,
			    const void *data, size_t size, buffer_t *sealed);
	int (*record_open)(const struct cas_keyring *keyring,
			   const void *aad, size_t aad_size,
			   const void *sealed, size_t sealed_size,
			   buffer_t *plain, const char **error_r);
	bool (*can_decrypt)(const struct cas_keyring *keyring);
	int (*dek_protect)(const struct cas_keyring *keyring,
			   const struct cas_blob_id *id,
			   const unsigned char dek[CAS_DEK_SIZE],
			   uint8_t *kind_r,
			   unsigned char stored_r[CAS_STORED_DEK_MAX_SIZE],
			   const char **error_r);
	/* kind is the other mode's: error_r names both */
	int (*dek_open)(const struct cas_keyring *keyring,
			const struct cas_blob_id *id, uint8_t kind,
			const unsigned char *stored,
			unsigned char dek_r[CAS_DEK_SIZE],
			const char **error_r);
	int (*dek_verify)(const struct cas_keyring *keyring,
			  const struct cas_blob_id *id, uint8_t kind,
			  const unsigned char *stored, const char **error_r);
	uint32_t (*store_epoch)(const struct cas_keyring *keyring);
	int (*store_key)(const struct cas_keyring *keyring,
			 enum cas_store_key_purpose purpose, uint32_t epoch,
			 unsigned char key_r[CAS_STORE_KEY_SIZE],
			 const char **error_r);
	void (*fingerprint)(const struct cas_keyring *keyring,
			    unsigned char fp_r[CAS_KEY_FINGERPRINT_SIZE]);
};
static const struct cas_keyring_backend cas_keyring_server;
static const struct cas_keyring_backend cas_keyring_password;
static void cas_keyring_seal(struct cas_keyring *keyring);

static void cas_sodium_init(void)
{
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
}

static uint32_t cas_be32(const unsigned char *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
		((uint32_t)p[2] << 8) | p[3];
}

static void cas_put_be32(unsigned char *p, uint32_t v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

static struct cas_keyring_secrets *cas_keyring_secrets_alloc(void)
{
	struct cas_keyring_secrets *secrets;

	secrets = cas_secmem_alloc(sizeof(*secrets));
	sodium_memzero(secrets, sizeof(*secrets));
	return secrets;
}

/* The keys of the epoch at index i from its secret (already in
   secrets->epoch[i]). */
static void
cas_keyring_derive_epoch(struct cas_keyring_secrets *secrets, unsigned int i)
{
	crypto_kdf_derive_from_key(secrets->blob_id[i], CAS_KEK_SIZE,
				   CAS_KDF_BLOB_ID, CAS_KDF_CONTEXT,
				   secrets->epoch[i]);
	crypto_kdf_derive_from_key(secrets->index[i], CAS_KEK_SIZE,
				   CAS_KDF_INDEX, CAS_KDF_CONTEXT,
				   secrets->epoch[i]);
}

/* a one-way image of a root-derived key: names the root without
   giving anything that helps to find it */
static void
cas_keyring_root_fingerprint(const unsigned char root[CAS_KEK_SIZE],
			     unsigned char fp_r[CAS_KEY_FINGERPRINT_SIZE])
{
	unsigned char sub[32];

	crypto_kdf_derive_from_key(sub, sizeof(sub), CAS_KDF_FINGERPRINT,
				   CAS_KDF_CONTEXT, root);
	crypto_generichash(fp_r, CAS_KEY_FINGERPRINT_SIZE,
			   (const void *)CAS_FINGERPRINT_PERSONAL,
			   strlen(CAS_FINGERPRINT_PERSONAL), sub, sizeof(sub));
	sodium_memzero(sub, sizeof(sub));
}

/* A CASKEY1/2 root: epoch 0 (the root is its secret), the root's id and
   fingerprint. The v1 slot (wrap key derived from the root, key id =
   root id) goes to wrap_r. */
static void
cas_keyring_derive(struct cas_keyring *keyring,
		   const unsigned char root[CAS_KEK_SIZE],
		   unsigned char wrap_r[CAS_KEK_SIZE])
{
	struct cas_keyring_secrets *secrets = keyring->secrets;
	unsigned char key_id[crypto_kdf_BYTES_MIN];

	crypto_kdf_derive_from_key(wrap_r, CAS_KEK_SIZE, CAS_KDF_WRAP,
				   CAS_KDF_CONTEXT, root);
	memcpy(secrets->epoch[0], root, CAS_KEK_SIZE);
	cas_keyring_derive_epoch(secrets, 0);
	crypto_kdf_derive_from_key(key_id, sizeof(key_id),
				   CAS_KDF_KEY_ID, CAS_KDF_CONTEXT, root);
	keyring->key_id = cas_be32(key_id);
	cas_keyring_root_fingerprint(root, keyring->fingerprint);
	keyring->epoch_numbers[0] = 0;
	keyring->epoch_count = keyring->file_epochs = 1;
	keyring->cur_epoch = 0;
}

/* A v1 key ring: one slot, derived from the root. */
static struct cas_keyring *cas_keyring_from_kek(const unsigned char *kek)
{
	struct cas_keyring *keyring;

	keyring = i_new(struct cas_keyring, 1);
	keyring->backend = &cas_keyring_server;
	keyring->secrets = cas_keyring_secrets_alloc();
	cas_keyring_derive(keyring, kek, keyring->secrets->wrap[0]);
	keyring->slot_key_ids[0] = keyring->key_id;
	keyring->slot_count = keyring->file_slots = 1;
	keyring->current = 0;
	sodium_mprotect_readonly(keyring->secrets);
	return keyring;
}

struct cas_keyring *
cas_keyring_create_from_kek(const unsigned char kek[CAS_KEK_SIZE])
{
	cas_sodium_init();
	return cas_keyring_from_kek(kek);
}

static void
cas_key_file_check(const unsigned char *file, size_t size,
		   unsigned char check_r[32])
{
	crypto_generichash(check_r, 32, file, size, NULL, 0);
}

static int cas_key_file_parse_v1(const unsigned char *file, size_t size,
				 struct cas_keyring **keyring_r,
				 const char **error_r)
{
	unsigned char check[32];

	if (size != CAS_KEY_FILE_V1_SIZE) {
		*error_r = t_strdup_printf("size %zu, expected %u",
					   size, CAS_KEY_FILE_V1_SIZE);
		return -1;
	}
	cas_key_file_check(file, CAS_KEY_FILE_V1_CHECK_OFFSET, check);
	if (sodium_memcmp(check, file + CAS_KEY_FILE_V1_CHECK_OFFSET,
			  sizeof(check)) != 0) {
		*error_r = "checksum mismatch (file damaged)";
		return -1;
	}
	*keyring_r = cas_keyring_from_kek(file + CAS_KEY_FILE_MAGIC_SIZE + 1);
	return 1;
}

/* The 4-byte ids at the start of count entries of entry_size bytes are
   distinct (and not 0 if nonzero). Returns 0 ok, -1 with error_r. */
static int
cas_key_file_check_ids(const unsigned char *entries, unsigned int count,
		       size_t entry_size, const char *what,
		       const char *id_name, bool nonzero,
		       const char **error_r)
{
	unsigned int i, j;
	uint32_t id;

	for (i = 0; i < count; i++) {
		id = cas_be32(entries + i * entry_size);
		if (nonzero && id == 0) {
			*error_r = t_strdup_printf("%s %u has %s 0",
						   what, i, id_name);
			return -1;
		}
		for (j = 0; j < i; j++) {
			if (id == cas_be32(entries + j * entry_size)) {
				*error_r = t_strdup_printf(
					"%ss %u and %u have the same %s "
					"%08x", what, j, i, id_name, id);
				return -1;
			}
		}
	}
	return 0;
}

static int cas_key_file_parse_v2(const unsigned char *file, size_t size,
				 struct cas_keyring **keyring_r,
				 const char **error_r)
{
	struct cas_keyring *keyring;
	unsigned char check[32], derived_wrap[CAS_KEK_SIZE];
	const unsigned char *slot;
	unsigned int i, count, current;

	if (size < CAS_KEY_FILE_V2_SIZE(1)) {
		*error_r = t_strdup_printf("size %zu, expected %u or %u",
			size, CAS_KEY_FILE_V2_SIZE(1), CAS_KEY_FILE_V2_SIZE(2));
		return -1;
	}
	count = file[CAS_KEY_FILE_V2_OFF_COUNT];
	if (count < 1 || count > CAS_KEY_FILE_MAX_SLOTS) {
		*error_r = t_strdup_printf("slot count %u, expected 1..%u",
					   count, CAS_KEY_FILE_MAX_SLOTS);
		return -1;
	}
	if (size != CAS_KEY_FILE_V2_SIZE(count)) {
		*error_r = t_strdup_printf(
			"size %zu, expected %u for %u slot(s)",
			size, CAS_KEY_FILE_V2_SIZE(count), count);
		return -1;
	}
	cas_key_file_check(file, size - 32, check);
	if (sodium_memcmp(check, file + size - 32, sizeof(check)) != 0) {
		*error_r = "checksum mismatch (file damaged)";
		return -1;
	}
	/* the checksum only catches damage: check the fields too */
	current = file[CAS_KEY_FILE_V2_OFF_CURRENT];
	if (current >= count) {
		*error_r = t_strdup_printf("current slot %u, but %u slot(s)",
					   current, count);
		return -1;
	}
	if (file[42] != 0 || file[43] != 0) {
		*error_r = "reserved bytes are not zero";
		return -1;
	}
	if (cas_key_file_check_ids(file + CAS_KEY_FILE_V2_OFF_SLOTS, count,
				   CAS_KEY_FILE_SLOT_SIZE, "slot", "key id",
				   TRUE, error_r) < 0)
		return -1;

	keyring = i_new(struct cas_keyring, 1);
	keyring->backend = &cas_keyring_server;
	keyring->secrets = cas_keyring_secrets_alloc();
	cas_keyring_derive(keyring, file + 8, derived_wrap);
	sodium_memzero(derived_wrap, sizeof(derived_wrap));
	for (i = 0; i < count; i++) {
		slot = file + CAS_KEY_FILE_V2_OFF_SLOTS +
			i * CAS_KEY_FILE_SLOT_SIZE;
		keyring->slot_key_ids[i] = cas_be32(slot);
		memcpy(keyring->secrets->wrap[i], slot + 4, CAS_KEK_SIZE);
	}
	keyring->slot_count = keyring->file_slots = count;
	keyring->current = current;
	sodium_mprotect_readonly(keyring->secrets);
	*keyring_r = keyring;
	return 1;
}

static int cas_key_file_parse_v3(const unsigned char *file, size_t size,
				 struct cas_keyring **keyring_r,
				 const char **error_r)
{
	struct cas_keyring *keyring;
	unsigned char check[32];
	const unsigned char *slots, *epochs, *p;
	unsigned int i, count, current, epoch_count, cur_epoch;

	if (size < CAS_KEY_FILE_V3_SIZE(1, 1)) {
		*error_r = t_strdup_printf("size %zu, expected %u..%u", size,
			CAS_KEY_FILE_V3_SIZE(1, 1), CAS_KEY_FILE_MAX_SIZE);
		return -1;
	}
	count = file[CAS_KEY_FILE_V3_OFF_COUNT];
	current = file[CAS_KEY_FILE_V3_OFF_CURRENT];
	epoch_count = file[CAS_KEY_FILE_V3_OFF_EPOCHS];
	cur_epoch = file[CAS_KEY_FILE_V3_OFF_CUR_EPOCH];
	if (count < 1 || count > CAS_KEY_FILE_MAX_SLOTS) {
		*error_r = t_strdup_printf("slot count %u, expected 1..%u",
					   count, CAS_KEY_FILE_MAX_SLOTS);
		return -1;
	}
	if (epoch_count < 1 || epoch_count > CAS_KEY_FILE_MAX_EPOCHS) {
		*error_r = t_strdup_printf("epoch count %u, expected 1..%u",
					   epoch_count,
					   CAS_KEY_FILE_MAX_EPOCHS);
		return -1;
	}
	if (size != CAS_KEY_FILE_V3_SIZE(count, epoch_count)) {
		*error_r = t_strdup_printf(
			"size %zu, expected %u for %u slot(s) and %u "
			"epoch(s)", size,
			CAS_KEY_FILE_V3_SIZE(count, epoch_count), count,
			epoch_count);
		return -1;
	}
	cas_key_file_check(file, size - 32, check);
	if (sodium_memcmp(check, file + size - 32, sizeof(check)) != 0) {
		*error_r = "checksum mismatch (file damaged)";
		return -1;
	}
	if (current >= count) {
		*error_r = t_strdup_printf("current slot %u, but %u slot(s)",
					   current, count);
		return -1;
	}
	if (cur_epoch >= epoch_count) {
		*error_r = t_strdup_printf(
			"current epoch %u, but %u epoch(s)",
			cur_epoch, epoch_count);
		return -1;
	}
	slots = file + CAS_KEY_FILE_V3_OFF_SLOTS;
	epochs = slots + count * CAS_KEY_FILE_SLOT_SIZE;
	if (cas_be32(file + CAS_KEY_FILE_V3_OFF_KEY_ID) == 0) {
		*error_r = "key id 0";
		return -1;
	}
	if (cas_key_file_check_ids(slots, count, CAS_KEY_FILE_SLOT_SIZE,
				   "slot", "key id", TRUE, error_r) < 0 ||
	    cas_key_file_check_ids(epochs, epoch_count,
				   CAS_KEY_FILE_EPOCH_SIZE, "epoch", "number",
				   FALSE, error_r) < 0)
		return -1;

	keyring = i_new(struct cas_keyring, 1);
	keyring->backend = &cas_keyring_server;
	keyring->secrets = cas_keyring_secrets_alloc();
	keyring->key_id = cas_be32(file + CAS_KEY_FILE_V3_OFF_KEY_ID);
	memcpy(keyring->fingerprint, file + CAS_KEY_FILE_V3_OFF_FP,
	       CAS_KEY_FINGERPRINT_SIZE);
	for (i = 0; i < count; i++) {
		p = slots + i * CAS_KEY_FILE_SLOT_SIZE;
		keyring->slot_key_ids[i] = cas_be32(p);
		memcpy(keyring->secrets->wrap[i], p + 4, CAS_KEK_SIZE);
	}
	keyring->slot_count = keyring->file_slots = count;
	keyring->current = current;
	for (i = 0; i < epoch_count; i++) {
		p = epochs + i * CAS_KEY_FILE_EPOCH_SIZE;
		keyring->epoch_numbers[i] = cas_be32(p);
		memcpy(keyring->secrets->epoch[i], p + 4, CAS_KEK_SIZE);
		cas_keyring_derive_epoch(keyring->secrets, i);
	}
	keyring->epoch_count = keyring->file_epochs = epoch_count;
	keyring->cur_epoch = cur_epoch;
	sodium_mprotect_readonly(keyring->secrets);
	*keyring_r = keyring;
	return 1;
}

/* Parse a key file image. Returns 1 ok, -1 with reason (no key bytes). */
int cas_key_file_parse(const void *data, size_t size,
		       struct cas_keyring **keyring_r, const char **error_r)
{
	const unsigned char *file = data;

	*keyring_r = NULL;
	cas_sodium_init();
	if (size < CAS_KEY_FILE_MAGIC_SIZE + 1) {
		*error_r = t_strdup_printf("size %zu, expected %u, %u, %u "
			"or %u..%u", size, CAS_KEY_FILE_V1_SIZE,
			CAS_KEY_FILE_V2_SIZE(1), CAS_KEY_FILE_V2_SIZE(2),
			CAS_KEY_FILE_V3_SIZE(1, 1), CAS_KEY_FILE_MAX_SIZE);
		return -1;
	}
	if (memcmp(file, CAS_KEY_FILE_V1_MAGIC,
		   CAS_KEY_FILE_MAGIC_SIZE) == 0) {
		if (file[CAS_KEY_FILE_MAGIC_SIZE] != 1) {
			*error_r = t_strdup_printf("unsupported version %u",
				file[CAS_KEY_FILE_MAGIC_SIZE]);
			return -1;
		}
		return cas_key_file_parse_v1(file, size, keyring_r, error_r);
	}
	if (memcmp(file, CAS_KEY_FILE_V2_MAGIC,
		   CAS_KEY_FILE_MAGIC_SIZE) == 0) {
		if (file[CAS_KEY_FILE_MAGIC_SIZE] != 2) {
			*error_r = t_strdup_printf("unsupported version %u",
				file[CAS_KEY_FILE_MAGIC_SIZE]);
			return -1;
		}
		return cas_key_file_parse_v2(file, size, keyring_r, error_r);
	}
	if (memcmp(file, CAS_KEY_FILE_V3_MAGIC,
		   CAS_KEY_FILE_MAGIC_SIZE) == 0) {
		if (file[CAS_KEY_FILE_MAGIC_SIZE] != 3) {
			*error_r = t_strdup_printf("unsupported version %u",
				file[CAS_KEY_FILE_MAGIC_SIZE]);
			return -1;
		}
		return cas_key_file_parse_v3(file, size, keyring_r, error_r);
	}
	*error_r = "bad magic (not a casbox key file)";
	return -1;
}

/* One attempt of cas_keyring_load(). *replaced_r is set when the file
   did not parse and had lost its name meanwhile: key rotation renamed a
   new file over it and shredded the old one while it was being read. */
static int
cas_keyring_load_once(const char *path, struct cas_keyring **keyring_r,
		      bool *replaced_r, const char **error_r)
{
	unsigned char *file;
	const char *error;
	struct stat st;
	ssize_t ret;
	int fd, result;

	*keyring_r = NULL;
	*replaced_r = FALSE;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd == -1) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	if (fstat(fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		i_close_fd(&fd);
		return -1;
	}
	if (cas_keyfile_check_mode_stat(&st, path, error_r) < 0) {
		i_close_fd(&fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode) || st.st_size > CAS_KEY_FILE_MAX_SIZE) {
		*error_r = t_strdup_printf(
			"Key file %s is damaged: size %lld, expected "
			"at most %u", path, (long long)st.st_size,
			CAS_KEY_FILE_MAX_SIZE);
		i_close_fd(&fd);
		return -1;
	}
	file = cas_secmem_alloc(CAS_KEY_FILE_MAX_SIZE + 1);
	/* read one byte more than allowed to notice a file that grew */
	ret = pread(fd, file, CAS_KEY_FILE_MAX_SIZE + 1, 0);
	if (ret < 0) {
		*error_r = t_strdup_printf("read(%s) failed: %m", path);
		result = -1;
	} else if (cas_key_file_parse(file, (size_t)ret, keyring_r,
				      &error) < 0) {
		*error_r = t_strdup_printf("Key file %s is damaged: %s",
					   path, error);
		*replaced_r = fstat(fd, &st) == 0 && st.st_nlink == 0;
		result = -1;
	} else {
		(*keyring_r)->st = st;
		(*keyring_r)->have_stat = TRUE;
		result = 1;
	}
	cas_secmem_free(file, CAS_KEY_FILE_MAX_SIZE + 1);
	i_close_fd(&fd);
	return result;
}

int cas_keyring_load(const char *path, struct cas_keyring **keyring_r,
		     const char **error_r)
{
	unsigned int tries = 0;
	bool replaced;
	int ret;

	do {
		ret = cas_keyring_load_once(path, keyring_r, &replaced,
					    error_r);
	} while (ret < 0 && replaced && ++tries < 3);
	return ret;
}

int cas_keyring_create(const char *path, struct cas_keyring **keyring_r,
		       const char **error_r)
{
	unsigned char *file;
	struct stat st;
	int ret = -1;

	*keyring_r = NULL;
	cas_sodium_init();
	file = sodium_malloc(CAS_KEY_FILE_V1_SIZE);
	if (file == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "sodium_malloc() failed: %m");
	memcpy(file, CAS_KEY_FILE_V1_MAGIC, CAS_KEY_FILE_MAGIC_SIZE);
	file[CAS_KEY_FILE_MAGIC_SIZE] = 1;
	randombytes_buf(file + CAS_KEY_FILE_MAGIC_SIZE + 1, CAS_KEK_SIZE);
	cas_key_file_check(file, CAS_KEY_FILE_V1_CHECK_OFFSET,
			   file + CAS_KEY_FILE_V1_CHECK_OFFSET);

	/* never over an existing file, never half a file */
	if (cas_keyfile_write_atomic(path, file, CAS_KEY_FILE_V1_SIZE,
				     NULL, FALSE, error_r) == 0) {
		*keyring_r = cas_keyring_from_kek(file +
						  CAS_KEY_FILE_MAGIC_SIZE + 1);
		if (stat(path, &st) == 0) {
			(*keyring_r)->st = st;
			(*keyring_r)->have_stat = TRUE;
		}
		ret = 1;
	}
	sodium_free(file);
	return ret;
}

void cas_keyring_free(struct cas_keyring **_keyring)
{
	struct cas_keyring *keyring = *_keyring;

	if (keyring == NULL)
		return;
	*_keyring = NULL;
	keyring->backend->free(keyring);
	i_free(keyring);
}

struct cas_keyring *cas_keyring_dup(const struct cas_keyring *keyring)
{
	struct cas_keyring *copy;

	if (keyring->backend != &cas_keyring_server)
		return NULL;
	copy = i_new(struct cas_keyring, 1);
	*copy = *keyring;
	copy->secrets = cas_keyring_secrets_alloc();
	memcpy(copy->secrets, keyring->secrets, sizeof(*copy->secrets));
	cas_keyring_seal(copy);
	return copy;
}

static void cas_keyring_server_free(struct cas_keyring *keyring)
{
	/* wiped there */
	cas_secmem_free_protected(keyring->secrets, sizeof(*keyring->secrets));
}

static void cas_keyring_password_free(struct cas_keyring *keyring)
{
	cas_userkey_free(&keyring->userkey);
}

uint32_t cas_keyring_key_id(const struct cas_keyring *keyring)
{
	return keyring->key_id;
}

uint32_t cas_keyring_wrap_key_id(const struct cas_keyring *keyring)
{
	return keyring->backend->wrap_key_id(keyring);
}

static uint32_t
cas_keyring_server_wrap_key_id(const struct cas_keyring *keyring)
{
	return keyring->slot_key_ids[keyring->current];
}

/* the key pair's id: it seals every DEK */
static uint32_t
cas_keyring_password_key_id(const struct cas_keyring *keyring)
{
	return keyring->key_id;
}

unsigned int cas_keyring_slot_count(const struct cas_keyring *keyring)
{
	return keyring->file_slots;
}

bool cas_keyring_retiring_key_id(const struct cas_keyring *keyring,
				 uint32_t *key_id_r)
{
	unsigned int i;

	for (i = 0; i < keyring->file_slots; i++) {
		if (i != keyring->current) {
			*key_id_r = keyring->slot_key_ids[i];
			return TRUE;
		}
	}
	return FALSE;
}

bool cas_keyring_has_key_id(const struct cas_keyring *keyring,
			    uint32_t key_id)
{
	return keyring->backend->has_key_id(keyring, key_id);
}

static bool
cas_keyring_password_has_key_id(const struct cas_keyring *keyring,
				uint32_t key_id)
{
	return key_id == keyring->key_id;
}

static bool
cas_keyring_server_has_key_id(const struct cas_keyring *keyring,
			      uint32_t key_id)
{
	unsigned int i;
	bool found = FALSE;

	for (i = 0; i < keyring->slot_count; i++)
		found = found || keyring->slot_key_ids[i] == key_id;
	return found;
}

/* Replace the secrets with a writable copy; cas_keyring_seal() makes
   them read-only again. */
static struct cas_keyring_secrets *
cas_keyring_unseal(struct cas_keyring *keyring)
{
	struct cas_keyring_secrets *copy;

	copy = cas_keyring_secrets_alloc();
	memcpy(copy, keyring->secrets, sizeof(*copy));
	cas_secmem_free_protected(keyring->secrets, sizeof(*keyring->secrets));
	keyring->secrets = copy;
	return copy;
}

static void cas_keyring_seal(struct cas_keyring *keyring)
{
	sodium_mprotect_readonly(keyring->secrets);
}

/* A new random epoch right after the file's one, made current; epochs
   only held in memory move up (the oldest falls off when full). */
static void cas_keyring_add_epoch(struct cas_keyring *keyring,
				  struct cas_keyring_secrets *secrets)
{
	unsigned int i, slot = 1;
	uint32_t number = 0;

	for (i = 0; i < keyring->epoch_count; i++)
		number = I_MAX(number, keyring->epoch_numbers[i]);
	for (i = I_MIN(keyring->epoch_count, CAS_KEYRING_MAX_EPOCHS - 1);
	     i > slot; i--) {
		keyring->epoch_numbers[i] = keyring->epoch_numbers[i - 1];
		memcpy(secrets->epoch[i], secrets->epoch[i - 1], CAS_KEK_SIZE);
		memcpy(secrets->blob_id[i], secrets->blob_id[i - 1],
		       CAS_KEK_SIZE);
		memcpy(secrets->index[i], secrets->index[i - 1], CAS_KEK_SIZE);
	}
	/* fresh randomness, nothing of the old epoch goes in */
	randombytes_buf(secrets->epoch[slot], CAS_KEK_SIZE);
	cas_keyring_derive_epoch(secrets, slot);
	keyring->epoch_numbers[slot] = number + 1;
	keyring->epoch_count = I_MIN(keyring->epoch_count + 1,
				     CAS_KEYRING_MAX_EPOCHS);
	keyring->file_epochs = 2;
	keyring->cur_epoch = slot;
}

void cas_keyring_rotate_add(struct cas_keyring *keyring)
{
	struct cas_keyring_secrets *secrets;
	unsigned int i, slot;
	uint32_t key_id;

	i_assert(keyring->file_slots == 1 && keyring->file_epochs == 1);
	cas_sodium_init();
	do {
		key_id = randombytes_random();
	} while (key_id == 0 || key_id == keyring->key_id ||
		 cas_keyring_has_key_id(keyring, key_id));
	secrets = cas_keyring_unseal(keyring);
	/* the new slot goes right after the file's slot; slots only held
	   in memory move up (the oldest falls off when full) */
	slot = 1;
	for (i = I_MIN(keyring->slot_count, CAS_KEYRING_MAX_SLOTS - 1);
	     i > slot; i--) {
		keyring->slot_key_ids[i] = keyring->slot_key_ids[i - 1];
		memcpy(secrets->wrap[i], secrets->wrap[i - 1], CAS_KEK_SIZE);
	}
	randombytes_buf(secrets->wrap[slot], CAS_KEK_SIZE);
	keyring->slot_key_ids[slot] = key_id;
	keyring->slot_count = I_MIN(keyring->slot_count + 1,
				    CAS_KEYRING_MAX_SLOTS);
	keyring->file_slots = 2;
	keyring->current = slot;
	cas_keyring_add_epoch(keyring, secrets);
	cas_keyring_seal(keyring);
}

void cas_keyring_rotate_finish(struct cas_keyring *keyring)
{
	struct cas_keyring_secrets *secrets;
	unsigned int i;

	if (keyring->file_slots == 1 && keyring->file_epochs == 1 &&
	    keyring->epoch_count == 1)
		return;
	secrets = cas_keyring_unseal(keyring);
	/* the current slot becomes the only one; every other slot is
	   forgotten, also in memory */
	if (keyring->current != 0) {
		keyring->slot_key_ids[0] =
			keyring->slot_key_ids[keyring->current];
		memcpy(secrets->wrap[0], secrets->wrap[keyring->current],
		       CAS_KEK_SIZE);
	}
	for (i = 1; i < CAS_KEYRING_MAX_SLOTS; i++) {
		sodium_memzero(secrets->wrap[i], CAS_KEK_SIZE);
		keyring->slot_key_ids[i] = 0;
	}
	keyring->slot_count = keyring->file_slots = 1;
	keyring->current = 0;
	/* the same for epochs: only the current one stays */
	i = keyring->cur_epoch;
	if (i != 0) {
		keyring->epoch_numbers[0] = keyring->epoch_numbers[i];
		memcpy(secrets->epoch[0], secrets->epoch[i], CAS_KEK_SIZE);
		memcpy(secrets->blob_id[0], secrets->blob_id[i], CAS_KEK_SIZE);
		memcpy(secrets->index[0], secrets->index[i], CAS_KEK_SIZE);
	}
	for (i = 1; i < CAS_KEYRING_MAX_EPOCHS; i++) {
		sodium_memzero(secrets->epoch[i], CAS_KEK_SIZE);
		sodium_memzero(secrets->blob_id[i], CAS_KEK_SIZE);
		sodium_memzero(secrets->index[i], CAS_KEK_SIZE);
		keyring->epoch_numbers[i] = 0;
	}
	keyring->epoch_count = keyring->file_epochs = 1;
	keyring->cur_epoch = 0;
	cas_keyring_seal(keyring);
}

int cas_keyring_save(struct cas_keyring *keyring, const char *path,
		     const char **error_r)
{
	unsigned char *file, *p;
	unsigned int i, count = keyring->file_slots;
	unsigned int epochs = keyring->file_epochs;
	size_t size = CAS_KEY_FILE_V3_SIZE(count, epochs);
	struct stat st;
	const struct stat *keep_st = NULL;
	const char *error;
	int ret, old_fd;

	i_assert(count >= 1 && count <= CAS_KEY_FILE_MAX_SLOTS);
	i_assert(epochs >= 1 && epochs <= CAS_KEY_FILE_MAX_EPOCHS);
	i_assert(keyring->backend == &cas_keyring_server);
	/* keep the owner and mode of the file it replaces (the mail
	   processes must still read it) */
	if (stat(path, &st) == 0)
		keep_st = &st;
	else if (errno != ENOENT) {
		*error_r = t_strdup_printf("stat(%s) failed: %m", path);
		return -1;
	}
	/* held open to shred the file this one replaces (an old slot
	   must not survive in freed blocks) */
	old_fd = keep_st == NULL ? -1 :
		open(path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	file = sodium_malloc(size);
	if (file == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "sodium_malloc() failed: %m");
	/* always CASKEY3: a CASKEY1/2 root is epoch 0's secret, the key
	   id and fingerprint it gave are stored as they are */
	memcpy(file, CAS_KEY_FILE_V3_MAGIC, CAS_KEY_FILE_MAGIC_SIZE);
	file[CAS_KEY_FILE_MAGIC_SIZE] = 3;
	cas_put_be32(file + CAS_KEY_FILE_V3_OFF_KEY_ID, keyring->key_id);
	memcpy(file + CAS_KEY_FILE_V3_OFF_FP, keyring->fingerprint,
	       CAS_KEY_FINGERPRINT_SIZE);
	file[CAS_KEY_FILE_V3_OFF_COUNT] = count;
	file[CAS_KEY_FILE_V3_OFF_CURRENT] = keyring->current;
	file[CAS_KEY_FILE_V3_OFF_EPOCHS] = epochs;
	file[CAS_KEY_FILE_V3_OFF_CUR_EPOCH] = keyring->cur_epoch;
	p = file + CAS_KEY_FILE_V3_OFF_SLOTS;
	for (i = 0; i < count; i++, p += CAS_KEY_FILE_SLOT_SIZE) {
		cas_put_be32(p, keyring->slot_key_ids[i]);
		memcpy(p + 4, keyring->secrets->wrap[i], CAS_KEK_SIZE);
	}
	for (i = 0; i < epochs; i++, p += CAS_KEY_FILE_EPOCH_SIZE) {
		cas_put_be32(p, keyring->epoch_numbers[i]);
		memcpy(p + 4, keyring->secrets->epoch[i], CAS_KEK_SIZE);
	}
	i_assert((size_t)(p - file) == size - 32);
	cas_key_file_check(file, size - 32, file + size - 32);
	ret = cas_keyfile_write_atomic(path, file, size, keep_st, TRUE,
				       error_r);
	sodium_free(file);
	if (ret == 0 && stat(path, &st) == 0) {
		keyring->st = st;
		keyring->have_stat = TRUE;
	}
	if (old_fd != -1) {
		/* readers that opened it just before the rename retry
		   (cas_keyring_load()) */
		if (ret == 0 && cas_keyfile_shred_unlinked(old_fd, path,
							   &error) < 0) {
			i_warning("casbox: could not overwrite the replaced "
				  "key file: %s", error);
		}
		i_close_fd(&old_fd);
	}
	return ret < 0 ? -1 : 1;
}

/* The index of an epoch in the key ring, UINT_MAX if not held. */
static unsigned int
cas_keyring_epoch_index(const struct cas_keyring *keyring, uint32_t epoch)
{
	unsigned int i;

	for (i = 0; i < keyring->epoch_count; i++) {
		if (keyring->epoch_numbers[i] == epoch)
			return i;
	}
	return UINT_MAX;
}

static bool cas_keyring_same_file(const struct cas_keyring *keyring,
				  const struct stat *st)
{
	return keyring->have_stat &&
		keyring->st.st_dev == st->st_dev &&
		keyring->st.st_ino == st->st_ino &&
		keyring->st.st_size == st->st_size &&
		keyring->st.st_mtim.tv_sec == st->st_mtim.tv_sec &&
		keyring->st.st_mtim.tv_nsec == st->st_mtim.tv_nsec &&
		keyring->st.st_ctim.tv_sec == st->st_ctim.tv_sec &&
		keyring->st.st_ctim.tv_nsec == st->st_ctim.tv_nsec;
}

int cas_keyring_refresh(struct cas_keyring *keyring, const char *path,
			bool *changed_r, const char **error_r)
{
	*changed_r = FALSE;
	return keyring->backend->refresh(keyring, path, NULL, changed_r,
					 error_r);
}

int cas_keyring_refresh_stat(struct cas_keyring *keyring, const char *path,
			     const struct stat *st, bool *changed_r,
			     const char **error_r)
{
	*changed_r = FALSE;
	return keyring->backend->refresh(keyring, path, st, changed_r,
					 error_r);
}

static int
cas_keyring_password_refresh(struct cas_keyring *keyring ATTR_UNUSED,
			     const char *path ATTR_UNUSED,
			     const struct stat *st ATTR_UNUSED,
			     bool *changed_r ATTR_UNUSED,
			     const char **error_r ATTR_UNUSED)
{
	/* a user key file changes only by a password change, which keeps
	   the key pair and the delivery key */
	return 1;
}

bool cas_keyring_refresh_needs_stat(const struct cas_keyring *keyring)
{
	return keyring->backend->refresh != cas_keyring_password_refresh;
}

static int
cas_keyring_server_refresh(struct cas_keyring *keyring, const char *path,
			   const struct stat *given_st, bool *changed_r,
			   const char **error_r)
{
	struct cas_keyring *fresh;
	struct cas_keyring_secrets *secrets;
	unsigned int i, n;
	struct stat st;
	int ret;

	if (given_st != NULL)
		st = *given_st;
	else if (stat(path, &st) < 0) {
		*error_r = t_strdup_printf("stat(%s) failed: %m", path);
		return -1;
	}
	if (cas_keyring_same_file(keyring, &st))
		return 1;
	ret = cas_keyring_load(path, &fresh, error_r);
	if (ret == 0) {
		*error_r = t_strdup_printf("key file %s vanished", path);
		return -1;
	}
	if (ret < 0)
		return -1;
	/* the key id and fingerprint name the key over every rotation: a
	   different one is another key, never adopted */
	if (fresh->key_id != keyring->key_id ||
	    sodium_memcmp(fresh->fingerprint, keyring->fingerprint,
			  CAS_KEY_FINGERPRINT_SIZE) != 0) {
		*error_r = t_strdup_printf(
			"key file %s was replaced by another key "
			"(key id %08x, expected %08x)", path,
			fresh->key_id, keyring->key_id);
		cas_keyring_free(&fresh);
		return -1;
	}
	/* adopt the file's slots; keep slots it no longer has for
	   unwrapping, as far as there is room */
	secrets = cas_keyring_unseal(fresh);
	n = fresh->slot_count;
	for (i = 0; i < keyring->slot_count && n < CAS_KEYRING_MAX_SLOTS;
	     i++) {
		if (cas_keyring_has_key_id(fresh, keyring->slot_key_ids[i]))
			continue;
		fresh->slot_key_ids[n] = keyring->slot_key_ids[i];
		memcpy(secrets->wrap[n], keyring->secrets->wrap[i],
		       CAS_KEK_SIZE);
		fresh->slot_count = ++n;
	}
	/* epochs alike: records sealed under a dropped epoch stay
	   readable here until this process reads their re-sealed form */
	n = fresh->epoch_count;
	for (i = 0; i < keyring->epoch_count && n < CAS_KEYRING_MAX_EPOCHS;
	     i++) {
		if (cas_keyring_epoch_index(fresh,
				keyring->epoch_numbers[i]) != UINT_MAX)
			continue;
		fresh->epoch_numbers[n] = keyring->epoch_numbers[i];
		memcpy(secrets->epoch[n], keyring->secrets->epoch[i],
		       CAS_KEK_SIZE);
		cas_keyring_derive_epoch(secrets, n);
		fresh->epoch_count = ++n;
	}
	cas_keyring_seal(fresh);
	/* swap in place: the pack store and streams hold this pointer */
	cas_secmem_free_protected(keyring->secrets, sizeof(*keyring->secrets));
	*keyring = *fresh;
	i_free(fresh);
	*changed_r = TRUE;
	return 1;
}

void cas_blob_id_init(const struct cas_keyring *keyring,
		      struct cas_blob_id_ctx *ctx)
{
	keyring->backend->blob_id_init(keyring, ctx);
}

static void
cas_keyring_password_blob_id_init(const struct cas_keyring *keyring,
				  struct cas_blob_id_ctx *ctx)
{
	cas_userkey_blob_id_init(keyring->userkey, ctx);
}

static void
cas_keyring_server_blob_id_init(const struct cas_keyring *keyring,
				struct cas_blob_id_ctx *ctx)
{
	i_assert(crypto_generichash_statebytes() <= sizeof(ctx->state));
	crypto_generichash_init((crypto_generichash_state *)ctx->state,
				keyring->secrets->blob_id[keyring->cur_epoch],
				CAS_KEK_SIZE, CAS_BLOB_ID_SIZE);
}

void cas_blob_id_update(struct cas_blob_id_ctx *ctx, const void *data,
			size_t size)
{
	crypto_generichash_update((crypto_generichash_state *)ctx->state,
				  data, size);
}

void cas_blob_id_final(struct cas_blob_id_ctx *ctx, struct cas_blob_id *id_r)
{
	crypto_generichash_final((crypto_generichash_state *)ctx->state,
				 id_r->id, CAS_BLOB_ID_SIZE);
	/* the state holds the keyed chaining value */
	sodium_memzero(ctx->state, sizeof(ctx->state));
}

void cas_blob_id_compute(const struct cas_keyring *keyring, const void *data,
			 size_t size, struct cas_blob_id *id_r)
{
	struct cas_blob_id_ctx ctx;

	cas_blob_id_init(keyring, &ctx);
	cas_blob_id_update(&ctx, data, size);
	cas_blob_id_final(&ctx, id_r);
}

const char *cas_blob_id_to_hex(const struct cas_blob_id *id)
{
	return binary_to_hex(id->id, sizeof(id->id));
}

int cas_blob_id_from_hex(const char *hex, struct cas_blob_id *id_r)
{
	buffer_t buf;
	size_t i;

	if (strlen(hex) != CAS_BLOB_ID_SIZE * 2)
		return -1;
	for (i = 0; hex[i] != '\0'; i++) {
		if (!((hex[i] >= '0' && hex[i] <= '9') ||
		      (hex[i] >= 'a' && hex[i] <= 'f')))
			return -1;
	}
	buffer_create_from_data(&buf, id_r->id, sizeof(id_r->id));
	if (hex_to_binary(hex, &buf) < 0 || buf.used != sizeof(id_r->id))
		return -1;
	return 0;
}

/* "key id 1234abcd" or "key ids 1234abcd, 5678ef01" (public ids). */
static const char *cas_keyring_slots_str(const struct cas_keyring *keyring)
{
	string_t *str = t_str_new(40);
	unsigned int i;

	str_append(str, keyring->slot_count == 1 ? "key id " : "key ids ");
	for (i = 0; i < keyring->slot_count; i++) {
		if (i > 0)
			str_append(str, ", ");
		str_printfa(str, "%08x", keyring->slot_key_ids[i]);
	}
	return str_c(str);
}

void cas_dek_generate(unsigned char dek_r[CAS_DEK_SIZE])
{
	cas_sodium_init();
	randombytes_buf(dek_r, CAS_DEK_SIZE);
}

static void
cas_dek_aad(uint32_t key_id, const struct cas_blob_id *id,
	    unsigned char aad_r[CAS_DEK_AAD_SIZE])
{
	memcpy(aad_r, CAS_DEK_AAD_MAGIC, 7);
	aad_r[7] = key_id >> 24;
	aad_r[8] = key_id >> 16;
	aad_r[9] = key_id >> 8;
	aad_r[10] = key_id;
	memcpy(aad_r + 11, id->id, CAS_BLOB_ID_SIZE);
}

void cas_dek_wrap(const struct cas_keyring *keyring,
		  const struct cas_blob_id *id,
		  const unsigned char dek[CAS_DEK_SIZE],
		  unsigned char wrapped_r[CAS_WRAPPED_DEK_SIZE])
{
	unsigned char aad[CAS_DEK_AAD_SIZE];
	unsigned char *nonce = wrapped_r + 4;

	/* password mode seals instead: cas_keyring_dek_protect() */
	i_assert(keyring->backend == &cas_keyring_server);
	/* new wraps always use the current slot */
	cas_dek_aad(cas_keyring_wrap_key_id(keyring), id, aad);
	memcpy(wrapped_r, aad + 7, 4);
	randombytes_buf(nonce, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
	crypto_aead_xchacha20poly1305_ietf_encrypt(
		wrapped_r + 4 + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
		NULL, dek, CAS_DEK_SIZE, aad, sizeof(aad), NULL, nonce,
		keyring->secrets->wrap[keyring->current]);
}

uint32_t cas_dek_wrapped_key_id(const unsigned char wrapped[CAS_WRAPPED_DEK_SIZE])
{
	return cas_be32(wrapped);
}

int cas_dek_unwrap(const struct cas_keyring *keyring,
		   const struct cas_blob_id *id,
		   const unsigned char wrapped[CAS_WRAPPED_DEK_SIZE],
		   unsigned char dek_r[CAS_DEK_SIZE], const char **error_r)
{
	unsigned char aad[CAS_DEK_AAD_SIZE];
	unsigned int i, slot = UINT_MAX;
	uint32_t key_id;

	sodium_memzero(dek_r, CAS_DEK_SIZE);
	if (keyring->backend != &cas_keyring_server) {
		*error_r = "DEK wrapped by a server key, "
			"but this key ring is in password mode";
		return -1;
	}
	/* the key id is public (stored in the clear): picking the slot by
	   it leaks nothing; the tag check below is constant-time */
	key_id = cas_be32(wrapped);
	for (i = 0; i < keyring->slot_count; i++) {
		if (keyring->slot_key_ids[i] == key_id)
			slot = i;
	}
	if (slot == UINT_MAX) {
		*error_r = t_strdup_printf(
			"DEK wrapped by another key (key id %08x; the key "
			"file has %s)", key_id,
			cas_keyring_slots_str(keyring));
		return -1;
	}
	cas_dek_aad(key_id, id, aad);
	if (crypto_aead_xchacha20poly1305_ietf_decrypt(
		dek_r, NULL, NULL,
		wrapped + 4 + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
		CAS_DEK_SIZE + crypto_aead_xchacha20poly1305_ietf_ABYTES,
		aad, sizeof(aad), wrapped + 4,
		keyring->secrets->wrap[slot]) != 0) {
		sodium_memzero(dek_r, CAS_DEK_SIZE);
		*error_r = "DEK unwrap: authentication failed";
		return -1;
	}
	return 1;
}

int cas_dek_rewrap(const struct cas_keyring *old_keyring,
		   const struct cas_keyring *new_keyring,
		   const struct cas_blob_id *id,
		   const unsigned char wrapped[CAS_WRAPPED_DEK_SIZE],
		   unsigned char new_wrapped_r[CAS_WRAPPED_DEK_SIZE],
		   const char **error_r)
{
	unsigned char dek[CAS_DEK_SIZE];

	if (cas_dek_unwrap(old_keyring, id, wrapped, dek, error_r) < 0)
		return -1;
	cas_dek_wrap(new_keyring, id, dek, new_wrapped_r);
	sodium_memzero(dek, sizeof(dek));
	return 1;
}

void cas_record_seal_key(const unsigned char key[CAS_KEK_SIZE],
			 const void *aad, size_t aad_size,
			 const void *data, size_t size, buffer_t *sealed)
{
	unsigned char *nonce, *ct;

	nonce = buffer_append_space_unsafe(sealed,
		crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
	randombytes_buf(nonce, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
	ct = buffer_append_space_unsafe(sealed,
		size + crypto_aead_xchacha20poly1305_ietf_ABYTES);
	/* the append may have moved the buffer */
	nonce = ct - crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
	crypto_aead_xchacha20poly1305_ietf_encrypt(ct, NULL, data, size,
		aad, aad_size, NULL, nonce, key);
}

int cas_record_open_key(const unsigned char key[CAS_KEK_SIZE],
			const void *aad, size_t aad_size,
			const void *sealed, size_t sealed_size,
			buffer_t *plain, const char **error_r)
{
	const unsigned char *nonce = sealed;
	size_t overhead = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES +
		crypto_aead_xchacha20poly1305_ietf_ABYTES;
	size_t old_used = plain->used;
	unsigned char *dest;

	if (sealed_size < overhead) {
		*error_r = t_strdup_printf(
			"sealed record too short (%zu bytes)",
			sealed_size);
		return -1;
	}
	dest = buffer_append_space_unsafe(plain, sealed_size - overhead);
	if (crypto_aead_xchacha20poly1305_ietf_decrypt(dest, NULL, NULL,
		nonce + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
		sealed_size - crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
		aad, aad_size, nonce, key) != 0) {
		sodium_memzero(dest, sealed_size - overhead);
		buffer_set_used_size(plain, old_used);
		*error_r = "sealed record: authentication failed";
		return -1;
	}
	return 1;
}

void cas_record_seal(const struct cas_keyring *keyring,
		     const void *aad, size_t aad_size,
		     const void *data, size_t size, buffer_t *sealed)
{
	keyring->backend->record_seal(keyring, aad, aad_size, data, size,
				      sealed);
}

static void
cas_keyring_server_record_seal(const struct cas_keyring *keyring,
			       const void *aad, size_t aad_size,
			       const void *data, size_t size,
			       buffer_t *sealed)
{
	cas_record_seal_key(keyring->secrets->index[keyring->cur_epoch],
			    aad, aad_size, data, size, sealed);
}

static void
cas_keyring_password_record_seal(const struct cas_keyring *keyring,
				 const void *aad, size_t aad_size,
				 const void *data, size_t size,
				 buffer_t *sealed)
{
	/* asserts the key is unlocked: see cas_keyring_can_decrypt() */
	cas_userkey_record_seal(keyring->userkey, aad, aad_size,
				data, size, sealed);
}

int cas_record_open(const struct cas_keyring *keyring,
		    const void *aad, size_t aad_size,
		    const void *sealed, size_t sealed_size,
		    buffer_t *plain, const char **error_r)
{
	return keyring->backend->record_open(keyring, aad, aad_size, sealed,
					     sealed_size, plain, error_r);
}

static int
cas_keyring_server_record_open(const struct cas_keyring *keyring,
			       const void *aad, size_t aad_size,
			       const void *sealed, size_t sealed_size,
			       buffer_t *plain, const char **error_r)
{
	unsigned int i;

	/* the current epoch first (what nearly every record is under),
	   then the older ones: a wrong key fails the tag check, so trying
	   each is safe; nothing in the record says its epoch */
	if (cas_record_open_key(keyring->secrets->index[keyring->cur_epoch],
				aad, aad_size, sealed, sealed_size, plain,
				error_r) > 0)
		return 1;
	for (i = 0; i < keyring->epoch_count; i++) {
		if (i != keyring->cur_epoch &&
		    cas_record_open_key(keyring->secrets->index[i], aad,
					aad_size, sealed, sealed_size, plain,
					error_r) > 0)
			return 1;
	}
	return -1;
}

static int
cas_keyring_password_record_open(const struct cas_keyring *keyring,
				 const void *aad, size_t aad_size,
				 const void *sealed, size_t sealed_size,
				 buffer_t *plain, const char **error_r)
{
	return cas_userkey_record_open(keyring->userkey, aad, aad_size,
				       sealed, sealed_size, plain, error_r);
}

/* Raw AEAD with a caller-held key (the blob codec's per-blob DEK). */
void cas_aead_encrypt(const unsigned char key[CAS_DEK_SIZE],
		      const unsigned char nonce[CAS_AEAD_NONCE_SIZE],
		      const void *aad, size_t aad_size,
		      const void *plain, size_t size, unsigned char *dest)
{
	crypto_aead_xchacha20poly1305_ietf_encrypt(dest, NULL, plain, size,
		aad, aad_size, NULL, nonce, key);
}

int cas_aead_decrypt(const unsigned char key[CAS_DEK_SIZE],
		     const unsigned char nonce[CAS_AEAD_NONCE_SIZE],
		     const void *aad, size_t aad_size,
		     const void *cipher, size_t cipher_size,
		     unsigned char *dest)
{
	if (cipher_size < CAS_AEAD_TAG_SIZE)
		return -1;
	if (crypto_aead_xchacha20poly1305_ietf_decrypt(dest, NULL, NULL,
		cipher, cipher_size, aad, aad_size, nonce, key) != 0) {
		sodium_memzero(dest, cipher_size - CAS_AEAD_TAG_SIZE);
		return -1;
	}
	return 0;
}

struct cas_keyring *
cas_keyring_create_from_userkey(struct cas_userkey **userkey)
{
	struct cas_keyring *keyring;

	i_assert(*userkey != NULL);
	keyring = i_new(struct cas_keyring, 1);
	keyring->backend = &cas_keyring_password;
	keyring->userkey = *userkey;
	/* cas_keyring_key_id() then names the key pair */
	keyring->key_id = cas_userkey_key_id(*userkey);
	*userkey = NULL;
	return keyring;
}

const struct cas_userkey *
cas_keyring_get_userkey(const struct cas_keyring *keyring)
{
	return keyring->userkey;
}

bool cas_keyring_can_decrypt(const struct cas_keyring *keyring)
{
	return keyring->backend->can_decrypt(keyring);
}

uint32_t cas_keyring_store_epoch(const struct cas_keyring *keyring)
{
	return keyring->backend->store_epoch(keyring);
}

int cas_keyring_store_key(const struct cas_keyring *keyring,
			  enum cas_store_key_purpose purpose, uint32_t epoch,
			  unsigned char key_r[CAS_STORE_KEY_SIZE],
			  const char **error_r)
{
	if (keyring->backend->store_key(keyring, purpose, epoch, key_r,
					error_r) < 0) {
		sodium_memzero(key_r, CAS_STORE_KEY_SIZE);
		return -1;
	}
	return 1;
}

void cas_keyring_fingerprint(const struct cas_keyring *keyring,
			     unsigned char fp_r[CAS_KEY_FINGERPRINT_SIZE])
{
	keyring->backend->fingerprint(keyring, fp_r);
}

static uint32_t
cas_keyring_epoch0(const struct cas_keyring *keyring ATTR_UNUSED)
{
	return 0;
}

static uint32_t
cas_keyring_server_store_epoch(const struct cas_keyring *keyring)
{
	return keyring->epoch_numbers[keyring->cur_epoch];
}

/* "epoch 3" or "epochs 3, 2" (public numbers). */
static const char *cas_keyring_epochs_str(const struct cas_keyring *keyring)
{
	string_t *str = t_str_new(32);
	unsigned int i;

	str_append(str, keyring->epoch_count == 1 ? "epoch " : "epochs ");
	for (i = 0; i < keyring->epoch_count; i++) {
		if (i > 0)
			str_append(str, ", ");
		str_printfa(str, "%u", keyring->epoch_numbers[i]);
	}
	return str_c(str);
}

unsigned int cas_keyring_epoch_count(const struct cas_keyring *keyring)
{
	return keyring->secrets == NULL ? 1 : keyring->file_epochs;
}

bool cas_keyring_retiring_epoch(const struct cas_keyring *keyring,
				uint32_t *epoch_r)
{
	unsigned int i;

	if (keyring->secrets == NULL)
		return FALSE;
	for (i = 0; i < keyring->file_epochs; i++) {
		if (i != keyring->cur_epoch) {
			*epoch_r = keyring->epoch_numbers[i];
			return TRUE;
		}
	}
	return FALSE;
}

unsigned int cas_blob_id_key_count(const struct cas_keyring *keyring)
{
	return keyring->secrets == NULL ? 1 : keyring->epoch_count;
}

void cas_blob_id_init_nth(const struct cas_keyring *keyring, unsigned int n,
			  struct cas_blob_id_ctx *ctx)
{
	unsigned int i;

	if (n == 0 || keyring->secrets == NULL) {
		i_assert(n == 0);
		cas_blob_id_init(keyring, ctx);
		return;
	}
	i_assert(n < keyring->epoch_count);
	/* n counts the epochs other than the current one */
	i = n <= keyring->cur_epoch ? n - 1 : n;
	crypto_generichash_init((crypto_generichash_state *)ctx->state,
				keyring->secrets->blob_id[i], CAS_KEK_SIZE,
				CAS_BLOB_ID_SIZE);
}

int cas_record_reseal(const struct cas_keyring *keyring,
		      const void *aad, size_t aad_size,
		      const void *sealed, size_t sealed_size,
		      buffer_t *resealed, const char **error_r)
{
	buffer_t *plain;
	int ret;

	plain = t_buffer_create(sealed_size);
	if (keyring->secrets != NULL &&
	    cas_record_open_key(keyring->secrets->index[keyring->cur_epoch],
				aad, aad_size, sealed, sealed_size, plain,
				error_r) > 0) {
		ret = 0;
	} else if (cas_record_open(keyring, aad, aad_size, sealed,
				   sealed_size, plain, error_r) < 0) {
		ret = -1;
	} else if (keyring->secrets == NULL) {
		/* password mode: one index key, nothing to re-seal */
		ret = 0;
	} else {
		cas_record_seal(keyring, aad, aad_size, plain->data,
				plain->used, resealed);
		ret = 1;
	}
	sodium_memzero(buffer_get_modifiable_data(plain, NULL), plain->used);
	return ret;
}

static int
cas_keyring_server_store_key(const struct cas_keyring *keyring,
			     enum cas_store_key_purpose purpose,
			     uint32_t epoch,
			     unsigned char key_r[CAS_STORE_KEY_SIZE],
			     const char **error_r)
{
	unsigned int i = cas_keyring_epoch_index(keyring, epoch);

	if (i == UINT_MAX) {
		*error_r = t_strdup_printf(
			"The key file does not hold key epoch %u (it has "
			"%s)", epoch, cas_keyring_epochs_str(keyring));
		return -1;
	}
	crypto_kdf_derive_from_key(key_r, CAS_STORE_KEY_SIZE, purpose,
				   CAS_KDF_STORE_CONTEXT,
				   keyring->secrets->epoch[i]);
	return 1;
}

static void
cas_keyring_server_fingerprint(const struct cas_keyring *keyring,
			       unsigned char fp_r[CAS_KEY_FINGERPRINT_SIZE])
{
	memcpy(fp_r, keyring->fingerprint, CAS_KEY_FINGERPRINT_SIZE);
}

static int
cas_keyring_password_store_key(const struct cas_keyring *keyring,
			       enum cas_store_key_purpose purpose,
			       uint32_t epoch,
			       unsigned char key_r[CAS_STORE_KEY_SIZE],
			       const char **error_r)
{
	if (epoch != 0) {
		*error_r = t_strdup_printf(
			"The user key file does not hold key epoch %u", epoch);
		return -1;
	}
	cas_userkey_store_key(keyring->userkey, purpose, key_r);
	return 1;
}

static void
cas_keyring_password_fingerprint(const struct cas_keyring *keyring,
				 unsigned char fp_r[CAS_KEY_FINGERPRINT_SIZE])
{
	cas_userkey_fingerprint(keyring->userkey, fp_r);
}

static bool
cas_keyring_server_can_decrypt(const struct cas_keyring *keyring ATTR_UNUSED)
{
	return TRUE;
}

static bool
cas_keyring_password_can_decrypt(const struct cas_keyring *keyring)
{
	return cas_userkey_is_unlocked(keyring->userkey);
}

/* ---- protecting blob DEKs (cas-keymode.h) ---- */

int cas_keyring_dek_protect(const struct cas_keyring *keyring,
			    const struct cas_blob_id *id,
			    const unsigned char dek[CAS_DEK_SIZE],
			    uint8_t *kind_r,
			    unsigned char stored_r[CAS_STORED_DEK_MAX_SIZE],
			    const char **error_r)
{
	return keyring->backend->dek_protect(keyring, id, dek, kind_r,
					     stored_r, error_r);
}

static int
cas_keyring_server_dek_protect(const struct cas_keyring *keyring,
			       const struct cas_blob_id *id,
			       const unsigned char dek[CAS_DEK_SIZE],
			       uint8_t *kind_r,
			       unsigned char stored_r[CAS_STORED_DEK_MAX_SIZE],
			       const char **error_r ATTR_UNUSED)
{
	*kind_r = CAS_DEK_KIND_SERVER_WRAP;
	cas_dek_wrap(keyring, id, dek, stored_r);
	return 1;
}

static int
cas_keyring_password_dek_protect(const struct cas_keyring *keyring,
		const struct cas_blob_id *id,
		const unsigned char dek[CAS_DEK_SIZE], uint8_t *kind_r,
		unsigned char stored_r[CAS_STORED_DEK_MAX_SIZE],
		const char **error_r)
{
	*kind_r = CAS_DEK_KIND_SEALED;
	if (cas_dek_seal_to_public(keyring->userkey, id, dek, stored_r) < 0) {
		*error_r = "sealing the DEK failed: "
			"the user key file's public key is unusable";
		return -1;
	}
	return 1;
}

int cas_keyring_dek_open(const struct cas_keyring *keyring,
			 const struct cas_blob_id *id, uint8_t kind,
			 const unsigned char *stored,
			 unsigned char dek_r[CAS_DEK_SIZE],
			 const char **error_r)
{
	sodium_memzero(dek_r, CAS_DEK_SIZE);
	if (kind != CAS_DEK_KIND_SERVER_WRAP && kind != CAS_DEK_KIND_SEALED) {
		*error_r = t_strdup_printf("unknown DEK kind 0x%02x", kind);
		return -1;
	}
	return keyring->backend->dek_open(keyring, id, kind, stored, dek_r,
					  error_r);
}

static int
cas_keyring_server_dek_open(const struct cas_keyring *keyring,
			    const struct cas_blob_id *id, uint8_t kind,
			    const unsigned char *stored,
			    unsigned char dek_r[CAS_DEK_SIZE],
			    const char **error_r)
{
	if (kind != CAS_DEK_KIND_SERVER_WRAP) {
		*error_r = "DEK is sealed to a user key "
			"(casbox_key_mode=password), but the store "
			"uses a server key";
		return -1;
	}
	return cas_dek_unwrap(keyring, id, stored, dek_r, error_r);
}

static int
cas_keyring_password_dek_open(const struct cas_keyring *keyring,
			      const struct cas_blob_id *id, uint8_t kind,
			      const unsigned char *stored,
			      unsigned char dek_r[CAS_DEK_SIZE],
			      const char **error_r)
{
	if (kind != CAS_DEK_KIND_SEALED) {
		*error_r = "DEK is wrapped by a server key "
			"(casbox_key_mode=server), but the store "
			"uses a password-mode user key";
		return -1;
	}
	if (!cas_userkey_is_unlocked(keyring->userkey)) {
		*error_r = "user key is locked: casbox_key_mode="
			"password needs the user's password "
			"(casbox_key_password, set from %w at "
			"IMAP/POP3 login) to read mail";
		return -1;
	}
	return cas_dek_open_sealed(keyring->userkey, id, stored, dek_r,
				   error_r);
}

int cas_keyring_dek_verify(const struct cas_keyring *keyring,
			   const struct cas_blob_id *id, uint8_t kind,
			   const unsigned char *stored, const char **error_r)
{
	return keyring->backend->dek_verify(keyring, id, kind, stored,
					    error_r);
}

static int
cas_keyring_server_dek_verify(const struct cas_keyring *keyring ATTR_UNUSED,
			      const struct cas_blob_id *id ATTR_UNUSED,
			      uint8_t kind ATTR_UNUSED,
			      const unsigned char *stored ATTR_UNUSED,
			      const char **error_r ATTR_UNUSED)
{
	/* a wrapped DEK can be checked only by opening it */
	return 0;
}

static int
cas_keyring_password_dek_verify(const struct cas_keyring *keyring,
				const struct cas_blob_id *id, uint8_t kind,
				const unsigned char *stored,
				const char **error_r)
{
	if (kind != CAS_DEK_KIND_SEALED) {
		*error_r = t_strdup_printf("DEK of kind 0x%02x, but the "
					   "store uses a password-mode user "
					   "key", kind);
		return -1;
	}
	return cas_dek_sealed_verify(keyring->userkey, id, stored, error_r);
}

static const struct cas_keyring_backend cas_keyring_server = {
	.free = cas_keyring_server_free,
	.wrap_key_id = cas_keyring_server_wrap_key_id,
	.has_key_id = cas_keyring_server_has_key_id,
	.refresh = cas_keyring_server_refresh,
	.blob_id_init = cas_keyring_server_blob_id_init,
	.record_seal = cas_keyring_server_record_seal,
	.record_open = cas_keyring_server_record_open,
	.can_decrypt = cas_keyring_server_can_decrypt,
	.dek_protect = cas_keyring_server_dek_protect,
	.dek_open = cas_keyring_server_dek_open,
	.dek_verify = cas_keyring_server_dek_verify,
	.store_epoch = cas_keyring_server_store_epoch,
	.store_key = cas_keyring_server_store_key,
	.fingerprint = cas_keyring_server_fingerprint,
};

static const struct cas_keyring_backend cas_keyring_password = {
	.free = cas_keyring_password_free,
	.wrap_key_id = cas_keyring_password_key_id,
	.has_key_id = cas_keyring_password_has_key_id,
	.refresh = cas_keyring_password_refresh,
	.blob_id_init = cas_keyring_password_blob_id_init,
	.record_seal = cas_keyring_password_record_seal,
	.record_open = cas_keyring_password_record_open,
	.can_decrypt = cas_keyring_password_can_decrypt,
	.dek_protect = cas_keyring_password_dek_protect,
	.dek_open = cas_keyring_password_dek_open,
	.dek_verify = cas_keyring_password_dek_verify,
	.store_epoch = cas_keyring_epoch0,
	.store_key = cas_keyring_password_store_key,
	.fingerprint = cas_keyring_password_fingerprint,
};
