/* User key file layout (doc/casbox-format.md, "User key file"):

     0   8  magic "CASUKEY1"
     8   1  version (1)
     9   1  alg (2 = crypto_pwhash_ALG_ARGON2ID13)
    10   2  flags (0)
    12   8  Argon2id opslimit (LE)
    20   8  Argon2id memlimit in bytes (LE)
    28  16  salt
    44  32  X25519 public key
    76  32  delivery key (server-held: blob-id and seal-MAC keys)
   108  24  nonce
   132  48  XChaCha20-Poly1305(Argon2id key, user secret) | tag,
            AAD = bytes 0..131
   180  32  BLAKE2b-256 of bytes 0..179
   = 212 bytes, mode 0600 */

#include "lib.h"
#include "buffer.h"
#include "cas-keyfile.h"
#include "cas-userkey.h"

#include <sodium.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#define UKEY_MAGIC "CASUKEY1"
#define UKEY_MAGIC_SIZE 8
#define UKEY_VERSION 1
#define UKEY_OFF_VERSION 8
#define UKEY_OFF_ALG 9
#define UKEY_OFF_FLAGS 10
#define UKEY_OFF_OPS 12
#define UKEY_OFF_MEM 20
#define UKEY_OFF_SALT 28
#define UKEY_OFF_PK 44
#define UKEY_OFF_DELIVERY_KEY 76
#define UKEY_OFF_NONCE 108
#define UKEY_OFF_WRAPPED 132
#define UKEY_OFF_CHECK 180
#define UKEY_FILE_SIZE 212
#define UKEY_SECRET_SIZE 32
#define UKEY_WRAPPED_SIZE (UKEY_SECRET_SIZE + CAS_AEAD_TAG_SIZE)
#define UKEY_WRAP_KEY_SIZE crypto_aead_xchacha20poly1305_ietf_KEYBYTES

/* Upper bounds on the Argon2id cost a file may ask for: a hostile or
   damaged file must not make a login process allocate without limit. */
#define UKEY_OPSLIMIT_MAX 32ULL
#define UKEY_MEMLIMIT_MAX ((size_t)crypto_pwhash_argon2id_MEMLIMIT_SENSITIVE)

/* crypto_kdf context and sub-key ids derived from the user secret */
#define UKEY_KDF_CONTEXT "CASUKEY1"
enum cas_userkey_subkey {
	UKEY_KDF_X25519_SEED = 1,
	UKEY_KDF_INDEX = 2,
};
#define UKEY_KEY_ID_PERSONAL "CASUKID1"
/* crypto_kdf context and sub-key ids derived from the delivery key */
#define UKEY_DELIVERY_CONTEXT "CASUDLV1"
enum cas_userkey_delivery_subkey {
	UKEY_DLV_BLOB_ID = 1,
	UKEY_DLV_SEAL_MAC = 2,
	UKEY_DLV_BOX_MAC = 3,
	UKEY_DLV_LOCATOR = 4,
	/* the base of the store keys and of the fingerprint */
	UKEY_DLV_STORE = 5,
	UKEY_DLV_FINGERPRINT = 6,
};
#define UKEY_STORE_CONTEXT "CASUSTO1"
#define UKEY_FINGERPRINT_PERSONAL "CASUFP01"
#define UKEY_SEAL_MAC_SIZE 16
#define UKEY_SEAL_BOX_OFF 5
#define UKEY_SEAL_MAC_OFF (CAS_SEALED_DEK_SIZE - UKEY_SEAL_MAC_SIZE)

const struct cas_userkey_limits cas_userkey_limits_default = {
	.opslimit = crypto_pwhash_argon2id_OPSLIMIT_INTERACTIVE,
	.memlimit = crypto_pwhash_argon2id_MEMLIMIT_INTERACTIVE,
};

struct cas_userkey_secrets {
	unsigned char blob_id_key[32];
	unsigned char seal_mac_key[32];
	unsigned char box_mac_key[32];
	unsigned char locator_key[32];
	unsigned char store_key[32];
	unsigned char fingerprint_key[32];
	unsigned char sk[crypto_box_SECRETKEYBYTES];
	unsigned char index_key[32];
};

struct cas_userkey {
	struct cas_userkey_secrets *secrets; /* sodium_malloc()ed */
	unsigned char pk[crypto_box_PUBLICKEYBYTES];
	uint32_t key_id;
	bool unlocked;
};

/* A parsed (checksum-verified) file image; pointers into it. */
struct cas_userkey_file {
	const unsigned char *data;
	struct cas_userkey_limits limits;
};

static void cas_sodium_init(void)
{
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
}

static void *cas_secure_alloc(size_t size)
{
	void *mem;

	/* sodium_malloc() needs sodium_init() (page size) first */
	cas_sodium_init();
	mem = sodium_malloc(size);
	if (mem == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "sodium_malloc() failed: %m");
	return mem;
}

static uint64_t le64_get(const unsigned char *p)
{
	uint64_t v = 0;
	int i;

	for (i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static void le64_put(unsigned char *p, uint64_t v)
{
	unsigned int i;

	for (i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static int
cas_userkey_limits_check(unsigned long long opslimit, uint64_t memlimit,
			 const char **error_r)
{
	if (opslimit < crypto_pwhash_argon2id_OPSLIMIT_MIN ||
	    opslimit > UKEY_OPSLIMIT_MAX) {
		*error_r = t_strdup_printf(
			"Argon2id opslimit %llu out of range %u..%llu",
			opslimit, crypto_pwhash_argon2id_OPSLIMIT_MIN,
			UKEY_OPSLIMIT_MAX);
		return -1;
	}
	if (memlimit < crypto_pwhash_argon2id_MEMLIMIT_MIN ||
	    memlimit > UKEY_MEMLIMIT_MAX) {
		*error_r = t_strdup_printf(
			"Argon2id memlimit %llu out of range %u..%zu",
			(unsigned long long)memlimit,
			crypto_pwhash_argon2id_MEMLIMIT_MIN,
			UKEY_MEMLIMIT_MAX);
		return -1;
	}
	return 0;
}

static void
cas_userkey_file_checksum(const unsigned char *data, unsigned char check_r[32])
{
	crypto_generichash(check_r, 32, data, UKEY_OFF_CHECK, NULL, 0);
}

static int
cas_userkey_file_parse(const void *data, size_t size,
		       struct cas_userkey_file *file_r, const char **error_r)
{
	const unsigned char *p = data;
	unsigned char check[32];
	uint64_t ops, mem;

	if (size != UKEY_FILE_SIZE) {
		*error_r = t_strdup_printf("size %zu, expected %u",
					   size, UKEY_FILE_SIZE);
		return -1;
	}
	if (memcmp(p, UKEY_MAGIC, UKEY_MAGIC_SIZE) != 0) {
		*error_r = "bad magic (not a casbox user key file)";
		return -1;
	}
	if (p[UKEY_OFF_VERSION] != UKEY_VERSION) {
		*error_r = t_strdup_printf("unsupported version %u",
					   p[UKEY_OFF_VERSION]);
		return -1;
	}
	/* the checksum before any other field: damage is reported as
	   damage, never as a wrong password */
	cas_userkey_file_checksum(p, check);
	if (sodium_memcmp(check, p + UKEY_OFF_CHECK, sizeof(check)) != 0) {
		*error_r = "checksum mismatch (file damaged)";
		return -1;
	}
	if (p[UKEY_OFF_ALG] != crypto_pwhash_ALG_ARGON2ID13) {
		*error_r = t_strdup_printf(
			"unsupported password hash algorithm %u",
			p[UKEY_OFF_ALG]);
		return -1;
	}
	if (p[UKEY_OFF_FLAGS] != 0 || p[UKEY_OFF_FLAGS + 1] != 0) {
		*error_r = "unknown flags set";
		return -1;
	}
	ops = le64_get(p + UKEY_OFF_OPS);
	mem = le64_get(p + UKEY_OFF_MEM);
	if (cas_userkey_limits_check(ops, mem, error_r) < 0)
		return -1;
	file_r->data = p;
	file_r->limits.opslimit = ops;
	file_r->limits.memlimit = (size_t)mem;
	return 0;
}

static struct cas_userkey *
cas_userkey_alloc(const unsigned char *pk, const unsigned char *delivery_key)
{
	struct cas_userkey *key;
	unsigned char hash[16];
	crypto_generichash_state state;

	key = i_new(struct cas_userkey, 1);
	key->secrets = cas_secure_alloc(sizeof(*key->secrets));
	memset(key->secrets, 0, sizeof(*key->secrets));
	crypto_kdf_derive_from_key(key->secrets->blob_id_key,
				   sizeof(key->secrets->blob_id_key),
				   UKEY_DLV_BLOB_ID, UKEY_DELIVERY_CONTEXT,
				   delivery_key);
	crypto_kdf_derive_from_key(key->secrets->seal_mac_key,
				   sizeof(key->secrets->seal_mac_key),
				   UKEY_DLV_SEAL_MAC, UKEY_DELIVERY_CONTEXT,
				   delivery_key);
	crypto_kdf_derive_from_key(key->secrets->box_mac_key,
				   sizeof(key->secrets->box_mac_key),
				   UKEY_DLV_BOX_MAC, UKEY_DELIVERY_CONTEXT,
				   delivery_key);
	crypto_kdf_derive_from_key(key->secrets->locator_key,
				   sizeof(key->secrets->locator_key),
				   UKEY_DLV_LOCATOR, UKEY_DELIVERY_CONTEXT,
				   delivery_key);
	crypto_kdf_derive_from_key(key->secrets->store_key,
				   sizeof(key->secrets->store_key),
				   UKEY_DLV_STORE, UKEY_DELIVERY_CONTEXT,
				   delivery_key);
	crypto_kdf_derive_from_key(key->secrets->fingerprint_key,
				   sizeof(key->secrets->fingerprint_key),
				   UKEY_DLV_FINGERPRINT, UKEY_DELIVERY_CONTEXT,
				   delivery_key);
	memcpy(key->pk, pk, sizeof(key->pk));

	crypto_generichash_init(&state, NULL, 0, sizeof(hash));
	crypto_generichash_update(&state, (const void *)UKEY_KEY_ID_PERSONAL,
				  strlen(UKEY_KEY_ID_PERSONAL));
	crypto_generichash_update(&state, pk, crypto_box_PUBLICKEYBYTES);
	crypto_generichash_final(&state, hash, sizeof(hash));
	key->key_id = ((uint32_t)hash[0] << 24) | ((uint32_t)hash[1] << 16) |
		((uint32_t)hash[2] << 8) | hash[3];
	return key;
}

static void
cas_userkey_derive_pair(const unsigned char secret[UKEY_SECRET_SIZE],
			unsigned char pk_r[crypto_box_PUBLICKEYBYTES],
			unsigned char sk_r[crypto_box_SECRETKEYBYTES])
{
	unsigned char seed[crypto_box_SEEDBYTES];

	crypto_kdf_derive_from_key(seed, sizeof(seed), UKEY_KDF_X25519_SEED,
				   UKEY_KDF_CONTEXT, secret);
	crypto_box_seed_keypair(pk_r, sk_r, seed);
	sodium_memzero(seed, sizeof(seed));
}

/* Fill the secret part from the user secret. Returns 0 ok, -1 the
   public key in the file is not the one the secret yields. */
static int
cas_userkey_set_secret(struct cas_userkey *key,
		       const unsigned char secret[UKEY_SECRET_SIZE],
		       const char **error_r)
{
	unsigned char pk[crypto_box_PUBLICKEYBYTES];

	cas_userkey_derive_pair(secret, pk, key->secrets->sk);
	if (sodium_memcmp(pk, key->pk, sizeof(pk)) != 0) {
		sodium_memzero(key->secrets->sk, sizeof(key->secrets->sk));
		*error_r = "public key does not match the private key "
			"(file damaged)";
		return -1;
	}
	crypto_kdf_derive_from_key(key->secrets->index_key,
				   sizeof(key->secrets->index_key),
				   UKEY_KDF_INDEX, UKEY_KDF_CONTEXT, secret);
	key->unlocked = TRUE;
	sodium_mprotect_readonly(key->secrets);
	return 0;
}

/* Argon2id(password, salt, limits) -> 32-byte wrapping key. */
static int
cas_userkey_password_key(const void *password, size_t password_len,
			 const unsigned char *salt,
			 const struct cas_userkey_limits *limits,
			 unsigned char *key_r, const char **error_r)
{
	if (crypto_pwhash(key_r, crypto_aead_xchacha20poly1305_ietf_KEYBYTES,
			  password, password_len, salt, limits->opslimit,
			  limits->memlimit,
			  crypto_pwhash_ALG_ARGON2ID13) != 0) {
		sodium_memzero(key_r,
			       crypto_aead_xchacha20poly1305_ietf_KEYBYTES);
		*error_r = "Argon2id failed (out of memory?)";
		return -1;
	}
	return 0;
}

/* Decrypt the user secret of a parsed file with the password. */
static int
cas_userkey_file_open(const struct cas_userkey_file *file,
		      const void *password, size_t password_len,
		      unsigned char *secret_r, bool *wrong_password_r,
		      const char **error_r)
{
	const unsigned char *p = file->data;
	unsigned char *wrap_key;
	int ret = 0;

	wrap_key = cas_secure_alloc(UKEY_WRAP_KEY_SIZE);
	if (cas_userkey_password_key(password, password_len,
				     p + UKEY_OFF_SALT, &file->limits,
				     wrap_key, error_r) < 0)
		ret = -1;
	else if (crypto_aead_xchacha20poly1305_ietf_decrypt(secret_r, NULL,
			NULL, p + UKEY_OFF_WRAPPED, UKEY_WRAPPED_SIZE,
			p, UKEY_OFF_WRAPPED, p + UKEY_OFF_NONCE,
			wrap_key) != 0) {
		/* the checksum passed, so this is the password (or a
		   deliberate edit that recomputed the checksum) */
		*error_r = "wrong password";
		*wrong_password_r = TRUE;
		ret = -1;
	}
	if (ret < 0)
		sodium_memzero(secret_r, UKEY_SECRET_SIZE);
	sodium_free(wrap_key);
	return ret;
}

/* Build a complete file image around the user secret: fresh salt and
   nonce, Argon2id under limits, checksum. */
static int
cas_userkey_file_build(const unsigned char *secret,
		       const unsigned char *pk,
		       const unsigned char *delivery_key,
		       const void *password, size_t password_len,
		       const struct cas_userkey_limits *limits,
		       unsigned char *file, const char **error_r)
{
	unsigned char *wrap_key;
	int ret = 0;

	if (password_len == 0) {
		/* would make the mode pointless; no passdb login has one */
		*error_r = "empty password";
		return -1;
	}
	if (cas_userkey_limits_check(limits->opslimit, limits->memlimit,
				     error_r) < 0)
		return -1;
	memset(file, 0, UKEY_FILE_SIZE);
	memcpy(file, UKEY_MAGIC, UKEY_MAGIC_SIZE);
	file[UKEY_OFF_VERSION] = UKEY_VERSION;
	file[UKEY_OFF_ALG] = crypto_pwhash_ALG_ARGON2ID13;
	le64_put(file + UKEY_OFF_OPS, limits->opslimit);
	le64_put(file + UKEY_OFF_MEM, limits->memlimit);
	randombytes_buf(file + UKEY_OFF_SALT, crypto_pwhash_SALTBYTES);
	memcpy(file + UKEY_OFF_PK, pk, crypto_box_PUBLICKEYBYTES);
	memcpy(file + UKEY_OFF_DELIVERY_KEY, delivery_key, 32);
	randombytes_buf(file + UKEY_OFF_NONCE,
			crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);

	wrap_key = cas_secure_alloc(UKEY_WRAP_KEY_SIZE);
	if (cas_userkey_password_key(password, password_len,
				     file + UKEY_OFF_SALT, limits,
				     wrap_key, error_r) < 0) {
		ret = -1;
	} else {
		crypto_aead_xchacha20poly1305_ietf_encrypt(
			file + UKEY_OFF_WRAPPED, NULL, secret,
			UKEY_SECRET_SIZE, file, UKEY_OFF_WRAPPED, NULL,
			file + UKEY_OFF_NONCE, wrap_key);
		cas_userkey_file_checksum(file, file + UKEY_OFF_CHECK);
	}
	sodium_free(wrap_key);
	return ret;
}

/* Read the whole file into a sodium_malloc()ed buffer of
   UKEY_FILE_SIZE + 1 bytes (one more to notice a file that grew).
   Returns 1 ok, 0 missing, -1 error. */
static int
cas_userkey_read_once(const char *path, unsigned char **data_r,
		      size_t *size_r, struct stat *st_r, bool *replaced_r,
		      const char **error_r)
{
	struct stat now;
	unsigned char *data;
	ssize_t ret;
	int fd;

	*data_r = NULL;
	*replaced_r = FALSE;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd == -1) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	if (fstat(fd, st_r) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		i_close_fd(&fd);
		return -1;
	}
	if (cas_keyfile_check_mode_stat(st_r, path, error_r) < 0) {
		i_close_fd(&fd);
		return -1;
	}
	data = cas_secure_alloc(UKEY_FILE_SIZE + 1);
	ret = pread(fd, data, UKEY_FILE_SIZE + 1, 0);
	if (ret < 0) {
		*error_r = t_strdup_printf("read(%s) failed: %m", path);
		sodium_free(data);
		i_close_fd(&fd);
		return -1;
	}
	/* a password change renamed a new file over this one and shreds
	   it (cas_userkey_change_password()): what was read may be zeros,
	   read the new file instead */
	if (fstat(fd, &now) == 0 && now.st_nlink == 0) {
		*replaced_r = TRUE;
		sodium_free(data);
		i_close_fd(&fd);
		return -1;
	}
	i_close_fd(&fd);
	*data_r = data;
	*size_r = (size_t)ret;
	return 1;
}

static int
cas_userkey_read(const char *path, unsigned char **data_r, size_t *size_r,
		 struct stat *st_r, const char **error_r)
{
	unsigned int tries = 0;
	bool replaced;
	int ret;

	do {
		ret = cas_userkey_read_once(path, data_r, size_r, st_r,
					    &replaced, error_r);
	} while (ret < 0 && replaced && ++tries < 3);
	if (ret < 0 && replaced) {
		*error_r = t_strdup_printf("read(%s): the file was replaced "
					   "while it was read, 3 times", path);
	}
	return ret;
}

int cas_userkey_parse_public(const void *data, size_t size,
			     struct cas_userkey **key_r, const char **error_r)
{
	struct cas_userkey_file file;

	*key_r = NULL;
	cas_sodium_init();
	if (cas_userkey_file_parse(data, size, &file, error_r) < 0)
		return -1;
	*key_r = cas_userkey_alloc(file.data + UKEY_OFF_PK,
				   file.data + UKEY_OFF_DELIVERY_KEY);
	sodium_mprotect_readonly((*key_r)->secrets);
	return 1;
}

static int
cas_userkey_unlock_image(const void *data, size_t size,
			 const void *password, size_t password_len,
			 struct cas_userkey **key_r, bool *wrong_password_r,
			 const char **error_r)
{
	struct cas_userkey_file file;
	struct cas_userkey *key;
	unsigned char *secret;
	int ret = 1;

	*key_r = NULL;
	cas_sodium_init();
	if (cas_userkey_file_parse(data, size, &file, error_r) < 0)
		return -1;
	secret = cas_secure_alloc(UKEY_SECRET_SIZE);
	key = cas_userkey_alloc(file.data + UKEY_OFF_PK,
				file.data + UKEY_OFF_DELIVERY_KEY);
	if (cas_userkey_file_open(&file, password, password_len, secret,
				  wrong_password_r, error_r) < 0 ||
	    cas_userkey_set_secret(key, secret, error_r) < 0) {
		cas_userkey_free(&key);
		ret = -1;
	}
	sodium_free(secret);
	*key_r = key;
	return ret;
}

int cas_userkey_unlock_data(const void *data, size_t size,
			    const void *password, size_t password_len,
			    struct cas_userkey **key_r, const char **error_r)
{
	bool wrong_password;

	return cas_userkey_unlock_image(data, size, password, password_len,
					key_r, &wrong_password, error_r);
}

int cas_userkey_load_public(const char *path, struct cas_userkey **key_r,
			    const char **error_r)
{
	unsigned char *data;
	const char *error;
	struct stat st;
	size_t size;
	int ret;

	*key_r = NULL;
	if ((ret = cas_userkey_read(path, &data, &size, &st, error_r)) <= 0)
		return ret;
	if (cas_userkey_parse_public(data, size, key_r, &error) < 0) {
		*error_r = t_strdup_printf("User key file %s is damaged: %s",
					   path, error);
		ret = -1;
	}
	sodium_free(data);
	return ret;
}

int cas_userkey_unlock(const char *path, const void *password,
		       size_t password_len, struct cas_userkey **key_r,
		       const char **error_r)
{
	unsigned char *data;
	const char *error;
	bool wrong_password = FALSE;
	struct stat st;
	size_t size;
	int ret;

	*key_r = NULL;
	if ((ret = cas_userkey_read(path, &data, &size, &st, error_r)) <= 0)
		return ret;
	if (cas_userkey_unlock_image(data, size, password, password_len,
				     key_r, &wrong_password, &error) < 0) {
		*error_r = wrong_password ?
			t_strdup_printf("User key file %s: wrong password",
					path) :
			t_strdup_printf("User key file %s is damaged: %s",
					path, error);
		ret = -1;
	}
	sodium_free(data);
	return ret;
}

int cas_userkey_create(const char *path, const void *password,
		       size_t password_len,
		       const struct cas_userkey_limits *limits,
		       struct cas_userkey **key_r, const char **error_r)
{
	unsigned char *secret, *delivery, *sk, *file;
	unsigned char pk[crypto_box_PUBLICKEYBYTES];
	const char *error;
	int ret = -1;

	if (key_r != NULL)
		*key_r = NULL;
	cas_sodium_init();
	if (limits == NULL)
		limits = &cas_userkey_limits_default;
	secret = cas_secure_alloc(UKEY_SECRET_SIZE);
	file = cas_secure_alloc(UKEY_FILE_SIZE);
	delivery = cas_secure_alloc(32);
	sk = cas_secure_alloc(crypto_box_SECRETKEYBYTES);
	randombytes_buf(secret, UKEY_SECRET_SIZE);
	randombytes_buf(delivery, 32);
	cas_userkey_derive_pair(secret, pk, sk);
	sodium_free(sk);

	if (cas_userkey_file_build(secret, pk, delivery, password,
				   password_len, limits, file, &error) < 0) {
		*error_r = t_strdup_printf("Creating user key file %s: %s",
					   path, error);
	} else if (cas_keyfile_write_atomic(path, file, UKEY_FILE_SIZE,
					    NULL, FALSE, error_r) == 0) {
		ret = 1;
	}
	if (ret == 1 && key_r != NULL) {
		*key_r = cas_userkey_alloc(pk, delivery);
		if (cas_userkey_set_secret(*key_r, secret, &error) < 0)
			i_unreached();
	}
	sodium_free(delivery);
	sodium_free(file);
	sodium_free(secret);
	return ret;
}

int cas_userkey_change_password(const char *path,
				const void *old_password, size_t old_len,
				const void *new_password, size_t new_len,
				const struct cas_userkey_limits *limits,
				const char **error_r)
{
	struct cas_userkey_file parsed;
	struct cas_userkey_limits old_limits;
	unsigned char *data, *secret, *file;
	const char *error;
	bool wrong_password = FALSE;
	struct stat st;
	size_t size;
	int ret, old_fd;

	cas_sodium_init();
	if ((ret = cas_userkey_read(path, &data, &size, &st, error_r)) <= 0)
		return ret;
	/* held open across the rename to shred the file it replaces: the
	   old file wraps the user secret under the old password, which
	   must not survive in freed blocks (doc/threat-model.md) */
	old_fd = open(path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	secret = cas_secure_alloc(UKEY_SECRET_SIZE);
	file = cas_secure_alloc(UKEY_FILE_SIZE);
	ret = -1;
	if (cas_userkey_file_parse(data, size, &parsed, &error) < 0) {
		*error_r = t_strdup_printf("User key file %s is damaged: %s",
					   path, error);
	} else if (cas_userkey_file_open(&parsed, old_password, old_len,
					 secret, &wrong_password,
					 &error) < 0) {
		*error_r = t_strdup_printf("User key file %s: %s",
					   path, error);
	} else {
		old_limits = parsed.limits;
		if (cas_userkey_file_build(secret, data + UKEY_OFF_PK,
				data + UKEY_OFF_DELIVERY_KEY, new_password,
				new_len, limits != NULL ? limits : &old_limits,
				file, &error) < 0) {
			*error_r = t_strdup_printf(
				"Rewrapping user key file %s: %s",
				path, error);
		} else if (cas_keyfile_write_atomic(path, file,
				UKEY_FILE_SIZE, &st, TRUE, error_r) == 0) {
			ret = 1;
		}
	}
	if (old_fd != -1) {
		if (ret > 0 &&
		    cas_keyfile_shred_unlinked(old_fd, path, &error) < 0) {
			i_warning("casbox: could not overwrite the replaced "
				  "user key file: %s", error);
		}
		i_close_fd(&old_fd);
	}
	sodium_free(file);
	sodium_free(secret);
	sodium_free(data);
	return ret;
}

void cas_userkey_free(struct cas_userkey **_key)
{
	struct cas_userkey *key = *_key;

	if (key == NULL)
		return;
	*_key = NULL;
	sodium_free(key->secrets);
	i_free(key);
}

bool cas_userkey_is_unlocked(const struct cas_userkey *key)
{
	return key->unlocked;
}

uint32_t cas_userkey_key_id(const struct cas_userkey *key)
{
	return key->key_id;
}

void cas_userkey_public_key(const struct cas_userkey *key,
			    unsigned char pk_r[CAS_USERKEY_PUBLIC_KEY_SIZE])
{
	memcpy(pk_r, key->pk, CAS_USERKEY_PUBLIC_KEY_SIZE);
}

void cas_userkey_blob_id_init(const struct cas_userkey *key,
			      struct cas_blob_id_ctx *ctx)
{
	i_assert(crypto_generichash_statebytes() <= sizeof(ctx->state));
	crypto_generichash_init((crypto_generichash_state *)ctx->state,
				key->secrets->blob_id_key,
				sizeof(key->secrets->blob_id_key),
				CAS_BLOB_ID_SIZE);
}

void cas_userkey_blob_id_compute(const struct cas_userkey *key,
				 const void *data, size_t size,
				 struct cas_blob_id *id_r)
{
	struct cas_blob_id_ctx ctx;

	cas_userkey_blob_id_init(key, &ctx);
	cas_blob_id_update(&ctx, data, size);
	cas_blob_id_final(&ctx, id_r);
}

#define SEALED_PLAIN_SIZE (CAS_DEK_SIZE + CAS_BLOB_ID_SIZE)

/* Keyed BLAKE2b-128 over kind | key id | box | blob id with the seal-MAC
   key: only holders of the key file can make a sealed DEK, though the
   public key alone could make the box. */
static void
cas_sealed_dek_mac(const struct cas_userkey *key, const unsigned char *sealed,
		   const struct cas_blob_id *id,
		   unsigned char mac_r[UKEY_SEAL_MAC_SIZE])
{
	crypto_generichash_state state;

	crypto_generichash_init(&state, key->secrets->seal_mac_key,
				sizeof(key->secrets->seal_mac_key),
				UKEY_SEAL_MAC_SIZE);
	crypto_generichash_update(&state, sealed, UKEY_SEAL_MAC_OFF);
	crypto_generichash_update(&state, id->id, CAS_BLOB_ID_SIZE);
	crypto_generichash_final(&state, mac_r, UKEY_SEAL_MAC_SIZE);
	sodium_memzero(&state, sizeof(state));
}

int cas_dek_seal_to_public(const struct cas_userkey *key,
			   const struct cas_blob_id *id,
			   const unsigned char dek[CAS_DEK_SIZE],
			   unsigned char sealed_r[CAS_SEALED_DEK_SIZE])
{
	unsigned char plain[SEALED_PLAIN_SIZE];
	int ret;

	cas_sodium_init();
	memcpy(plain, dek, CAS_DEK_SIZE);
	memcpy(plain + CAS_DEK_SIZE, id->id, CAS_BLOB_ID_SIZE);
	sealed_r[0] = CAS_DEK_KIND_SEALED;
	sealed_r[1] = key->key_id >> 24;
	sealed_r[2] = key->key_id >> 16;
	sealed_r[3] = key->key_id >> 8;
	sealed_r[4] = key->key_id;
	ret = crypto_box_seal(sealed_r + UKEY_SEAL_BOX_OFF, plain,
			      sizeof(plain), key->pk);
	sodium_memzero(plain, sizeof(plain));
	if (ret != 0) {
		sodium_memzero(sealed_r, CAS_SEALED_DEK_SIZE);
		return -1;
	}
	cas_sealed_dek_mac(key, sealed_r, id, sealed_r + UKEY_SEAL_MAC_OFF);
	return 1;
}

int cas_dek_sealed_verify(const struct cas_userkey *key,
			  const struct cas_blob_id *id,
			  const unsigned char sealed[CAS_SEALED_DEK_SIZE],
			  const char **error_r)
{
	unsigned char mac[UKEY_SEAL_MAC_SIZE];
	uint32_t key_id;
	int ret;

	if (sealed[0] != CAS_DEK_KIND_SEALED) {
		*error_r = t_strdup_printf("sealed DEK: unknown kind %u",
					   sealed[0]);
		return -1;
	}
	key_id = ((uint32_t)sealed[1] << 24) | ((uint32_t)sealed[2] << 16) |
		((uint32_t)sealed[3] << 8) | sealed[4];
	if (key_id != key->key_id) {
		*error_r = t_strdup_printf(
			"DEK sealed to another key (key id %08x, ours %08x)",
			key_id, key->key_id);
		return -1;
	}
	cas_sealed_dek_mac(key, sealed, id, mac);
	ret = sodium_memcmp(mac, sealed + UKEY_SEAL_MAC_OFF, sizeof(mac));
	sodium_memzero(mac, sizeof(mac));
	if (ret != 0) {
		/* forged, damaged, or made for another blob */
		*error_r = "sealed DEK: authentication failed";
		return -1;
	}
	return 1;
}

int cas_dek_open_sealed(const struct cas_userkey *key,
			const struct cas_blob_id *id,
			const unsigned char sealed[CAS_SEALED_DEK_SIZE],
			unsigned char dek_r[CAS_DEK_SIZE],
			const char **error_r)
{
	unsigned char plain[SEALED_PLAIN_SIZE];
	int ret = 1;

	sodium_memzero(dek_r, CAS_DEK_SIZE);
	if (!key->unlocked) {
		*error_r = "sealed DEK: user key is locked "
			"(no password in this process)";
		return -1;
	}
	if (cas_dek_sealed_verify(key, id, sealed, error_r) < 0)
		return -1;
	if (crypto_box_seal_open(plain, sealed + UKEY_SEAL_BOX_OFF,
				 UKEY_SEAL_MAC_OFF - UKEY_SEAL_BOX_OFF,
				 key->pk, key->secrets->sk) != 0) {
		*error_r = "sealed DEK: authentication failed";
		ret = -1;
	} else if (sodium_memcmp(plain + CAS_DEK_SIZE, id->id,
				 CAS_BLOB_ID_SIZE) != 0) {
		/* a valid MAC over another blob's box: only a key file
		   holder can make that, still refuse it */
		*error_r = "sealed DEK belongs to another blob";
		ret = -1;
	} else {
		memcpy(dek_r, plain, CAS_DEK_SIZE);
	}
	sodium_memzero(plain, sizeof(plain));
	return ret;
}

void cas_userkey_record_seal(const struct cas_userkey *key,
			     const void *aad, size_t aad_size,
			     const void *data, size_t size, buffer_t *sealed)
{
	i_assert(key->unlocked);
	cas_record_seal_key(key->secrets->index_key, aad, aad_size,
			    data, size, sealed);
}

int cas_userkey_record_open(const struct cas_userkey *key,
			    const void *aad, size_t aad_size,
			    const void *sealed, size_t sealed_size,
			    buffer_t *plain, const char **error_r)
{
	if (!key->unlocked) {
		*error_r = "sealed record: user key is locked "
			"(no password in this process)";
		return -1;
	}
	return cas_record_open_key(key->secrets->index_key, aad, aad_size,
				   sealed, sealed_size, plain, error_r);
}

/* Sealed box (doc/casbox-format.md, "Meta frame sealed to the user
   key"):
     0  4  key id (BE)
     4 32  ephemeral X25519 public key (epk)
    36  n  XChaCha20-Poly1305(k, data, AAD = caller's), nonce all zero
  36+n 16  tag
  52+n 16  BLAKE2b-128(key = box-MAC key, aad | bytes 0..51+n)
   k = BLAKE2b-256(key = X25519(esk, pk), "CASUBOX1" | epk | pk)
   The ephemeral key pair is fresh for every box, so k is too, and one
   fixed nonce is safe. */
#define UKEY_BOX_PERSONAL "CASUBOX1"
#define UKEY_BOX_OFF_EPK 4
#define UKEY_BOX_OFF_CIPHER (UKEY_BOX_OFF_EPK + crypto_box_PUBLICKEYBYTES)
#define UKEY_BOX_MAC_SIZE 16
#define UKEY_BOX_KEY_SIZE crypto_aead_xchacha20poly1305_ietf_KEYBYTES

static void
cas_userkey_box_key(const unsigned char shared[crypto_scalarmult_BYTES],
		    const unsigned char *epk, const unsigned char *pk,
		    unsigned char key_r[UKEY_BOX_KEY_SIZE])
{
	crypto_generichash_state state;

	crypto_generichash_init(&state, shared, crypto_scalarmult_BYTES,
				UKEY_BOX_KEY_SIZE);
	crypto_generichash_update(&state, (const void *)UKEY_BOX_PERSONAL,
				  strlen(UKEY_BOX_PERSONAL));
	crypto_generichash_update(&state, epk, crypto_box_PUBLICKEYBYTES);
	crypto_generichash_update(&state, pk, crypto_box_PUBLICKEYBYTES);
	crypto_generichash_final(&state, key_r, UKEY_BOX_KEY_SIZE);
	sodium_memzero(&state, sizeof(state));
}

static void
cas_userkey_box_mac(const struct cas_userkey *key, const void *aad,
		    size_t aad_size, const unsigned char *box, size_t size,
		    unsigned char mac_r[UKEY_BOX_MAC_SIZE])
{
	crypto_generichash_state state;
	unsigned char len[8];

	crypto_generichash_init(&state, key->secrets->box_mac_key,
				sizeof(key->secrets->box_mac_key),
				UKEY_BOX_MAC_SIZE);
	/* the AAD's length first: AAD and box cannot trade bytes */
	le64_put(len, aad_size);
	crypto_generichash_update(&state, len, sizeof(len));
	crypto_generichash_update(&state, aad, aad_size);
	crypto_generichash_update(&state, box, size);
	crypto_generichash_final(&state, mac_r, UKEY_BOX_MAC_SIZE);
	sodium_memzero(&state, sizeof(state));
}

int cas_userkey_box_seal(const struct cas_userkey *key,
			 const void *aad, size_t aad_size,
			 const void *data, size_t size, buffer_t *sealed)
{
	static const unsigned char nonce[CAS_AEAD_NONCE_SIZE] = { 0 };
	unsigned char esk[crypto_box_SECRETKEYBYTES];
	unsigned char shared[crypto_scalarmult_BYTES];
	unsigned char box_key[UKEY_BOX_KEY_SIZE];
	unsigned char *out;
	size_t start = sealed->used, box_size;
	int ret;

	cas_sodium_init();
	box_size = UKEY_BOX_OFF_CIPHER + size + CAS_AEAD_TAG_SIZE;
	out = buffer_append_space_unsafe(sealed, box_size + UKEY_BOX_MAC_SIZE);
	out[0] = key->key_id >> 24;
	out[1] = key->key_id >> 16;
	out[2] = key->key_id >> 8;
	out[3] = key->key_id;
	crypto_box_keypair(out + UKEY_BOX_OFF_EPK, esk);
	ret = crypto_scalarmult(shared, esk, key->pk);
	sodium_memzero(esk, sizeof(esk));
	if (ret != 0) {
		/* a low order public key: nothing secret would result */
		sodium_memzero(shared, sizeof(shared));
		buffer_set_used_size(sealed, start);
		return -1;
	}
	cas_userkey_box_key(shared, out + UKEY_BOX_OFF_EPK, key->pk, box_key);
	sodium_memzero(shared, sizeof(shared));
	crypto_aead_xchacha20poly1305_ietf_encrypt(out + UKEY_BOX_OFF_CIPHER,
		NULL, data, size, aad, aad_size, NULL, nonce, box_key);
	sodium_memzero(box_key, sizeof(box_key));
	cas_userkey_box_mac(key, aad, aad_size, out, box_size,
			    out + box_size);
	return 1;
}

int cas_userkey_box_verify(const struct cas_userkey *key,
			   const void *aad, size_t aad_size,
			   const void *sealed, size_t sealed_size,
			   const char **error_r)
{
	const unsigned char *p = sealed;
	unsigned char mac[UKEY_BOX_MAC_SIZE];
	size_t box_size;
	uint32_t key_id;
	int ret;

	if (sealed_size < CAS_USERKEY_BOX_OVERHEAD) {
		*error_r = t_strdup_printf("sealed box: %zu bytes, less than "
					   "the %u of an empty one",
					   sealed_size,
					   CAS_USERKEY_BOX_OVERHEAD);
		return -1;
	}
	key_id = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
		((uint32_t)p[2] << 8) | p[3];
	if (key_id != key->key_id) {
		*error_r = t_strdup_printf(
			"sealed box: sealed to another key (key id %08x, "
			"ours %08x)", key_id, key->key_id);
		return -1;
	}
	box_size = sealed_size - UKEY_BOX_MAC_SIZE;
	cas_userkey_box_mac(key, aad, aad_size, p, box_size, mac);
	ret = sodium_memcmp(mac, p + box_size, sizeof(mac));
	sodium_memzero(mac, sizeof(mac));
	if (ret != 0) {
		*error_r = "sealed box: authentication failed";
		return -1;
	}
	return 1;
}

int cas_userkey_box_open(const struct cas_userkey *key,
			 const void *aad, size_t aad_size,
			 const void *sealed, size_t sealed_size,
			 buffer_t *plain, const char **error_r)
{
	static const unsigned char nonce[CAS_AEAD_NONCE_SIZE] = { 0 };
	const unsigned char *p = sealed;
	unsigned char shared[crypto_scalarmult_BYTES];
	unsigned char box_key[UKEY_BOX_KEY_SIZE];
	size_t cipher_size, start = plain->used;
	unsigned char *out;
	int ret;

	if (!key->unlocked) {
		*error_r = "sealed box: user key is locked "
			"(no password in this process)";
		return -1;
	}
	if (cas_userkey_box_verify(key, aad, aad_size, sealed, sealed_size,
				   error_r) < 0)
		return -1;
	cipher_size = sealed_size - UKEY_BOX_MAC_SIZE - UKEY_BOX_OFF_CIPHER;
	if (crypto_scalarmult(shared, key->secrets->sk,
			      p + UKEY_BOX_OFF_EPK) != 0) {
		sodium_memzero(shared, sizeof(shared));
		*error_r = "sealed box: authentication failed";
		return -1;
	}
	cas_userkey_box_key(shared, p + UKEY_BOX_OFF_EPK, key->pk, box_key);
	sodium_memzero(shared, sizeof(shared));
	out = buffer_append_space_unsafe(plain,
					 cipher_size - CAS_AEAD_TAG_SIZE);
	ret = crypto_aead_xchacha20poly1305_ietf_decrypt(out, NULL, NULL,
		p + UKEY_BOX_OFF_CIPHER, cipher_size, aad, aad_size, nonce,
		box_key);
	sodium_memzero(box_key, sizeof(box_key));
	if (ret != 0) {
		sodium_memzero(out, cipher_size - CAS_AEAD_TAG_SIZE);
		buffer_set_used_size(plain, start);
		*error_r = "sealed box: authentication failed";
		return -1;
	}
	return 1;
}

void cas_userkey_store_key(const struct cas_userkey *key,
			   enum cas_store_key_purpose purpose,
			   unsigned char key_r[CAS_STORE_KEY_SIZE])
{
	crypto_kdf_derive_from_key(key_r, CAS_STORE_KEY_SIZE, purpose,
				   UKEY_STORE_CONTEXT,
				   key->secrets->store_key);
}

void cas_userkey_fingerprint(const struct cas_userkey *key,
			     unsigned char fp_r[CAS_KEY_FINGERPRINT_SIZE])
{
	crypto_generichash_state state;
	unsigned char sub[32];

	crypto_generichash(sub, sizeof(sub),
			   (const void *)UKEY_FINGERPRINT_PERSONAL,
			   strlen(UKEY_FINGERPRINT_PERSONAL),
			   key->secrets->fingerprint_key,
			   sizeof(key->secrets->fingerprint_key));
	crypto_generichash_init(&state, NULL, 0, CAS_KEY_FINGERPRINT_SIZE);
	crypto_generichash_update(&state, key->pk, sizeof(key->pk));
	crypto_generichash_update(&state, sub, sizeof(sub));
	crypto_generichash_final(&state, fp_r, CAS_KEY_FINGERPRINT_SIZE);
	sodium_memzero(sub, sizeof(sub));
}

void cas_userkey_locator(const struct cas_userkey *key,
			 const void *data, size_t size,
			 unsigned char locator_r[CAS_USERKEY_LOCATOR_SIZE])
{
	crypto_generichash(locator_r, CAS_USERKEY_LOCATOR_SIZE, data, size,
			   key->secrets->locator_key,
			   sizeof(key->secrets->locator_key));
}
