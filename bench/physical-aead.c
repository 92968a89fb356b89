/* Physical limit: libsodium XChaCha20-Poly1305 (IETF) and, where the CPU
 * has AES-NI, AES-256-GCM throughput on this machine: the two chunk
 * ciphers of casbox frames (version 2 picks AES-256-GCM when available).
 *
 * Built by bench/run with cc directly (cc -O2 physical-aead.c -lsodium),
 * not by automake: it is a measuring tool, not part of the product.
 *
 * Usage: physical-aead [seconds-per-size]
 * Prints one line per buffer size and cipher:
 *   aead size=<bytes> encrypt_mbps=<MB/s> decrypt_mbps=<MB/s>
 *   aead-aes256gcm size=<bytes> encrypt_mbps=<MB/s> decrypt_mbps=<MB/s>
 * (MB = 10^6 bytes of plaintext). Decryption verifies the tag of every
 * buffer; a failed verification exits 1, so a broken build cannot report
 * a fast number. */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef int aead_enc_fn(unsigned char *, unsigned long long *,
			const unsigned char *, unsigned long long,
			const unsigned char *, unsigned long long,
			const unsigned char *, const unsigned char *,
			const unsigned char *);
typedef int aead_dec_fn(unsigned char *, unsigned long long *,
			unsigned char *, const unsigned char *,
			unsigned long long, const unsigned char *,
			unsigned long long, const unsigned char *,
			const unsigned char *);

static int measure(const char *label, aead_enc_fn *enc_fn,
		   aead_dec_fn *dec_fn, double secs)
{
	static const size_t sizes[] = { 4096, 65536, 1048576 };
	/* 32-byte key and 24-byte nonce buffers fit both ciphers (AES-GCM
	   reads the first 12 nonce bytes) */
	unsigned char key[32];
	unsigned char nonce[24];

	randombytes_buf(key, sizeof(key));
	randombytes_buf(nonce, sizeof(nonce));

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t n = sizes[i];
		unsigned char *pt = malloc(n), *ct = malloc(n + 16),
			      *out = malloc(n);
		unsigned long long ctlen, outlen;
		double t0, t, enc_bytes = 0, dec_bytes = 0;

		if (pt == NULL || ct == NULL || out == NULL)
			return 1;
		randombytes_buf(pt, n);

		t0 = now();
		do {
			for (int k = 0; k < 16; k++) {
				enc_fn(ct, &ctlen, pt, n, NULL, 0, NULL,
				       nonce, key);
				enc_bytes += n;
			}
			t = now() - t0;
		} while (t < secs);
		double enc = enc_bytes / t / 1e6;

		t0 = now();
		do {
			for (int k = 0; k < 16; k++) {
				if (dec_fn(out, &outlen, NULL, ct, ctlen,
					   NULL, 0, nonce, key) != 0 ||
				    outlen != n) {
					fprintf(stderr, "tag check failed\n");
					return 1;
				}
				dec_bytes += n;
			}
			t = now() - t0;
		} while (t < secs);
		double dec = dec_bytes / t / 1e6;
		if (memcmp(out, pt, n) != 0) {
			fprintf(stderr, "round trip mismatch\n");
			return 1;
		}
		printf("%s size=%zu encrypt_mbps=%.1f decrypt_mbps=%.1f\n",
		       label, n, enc, dec);
		free(pt);
		free(ct);
		free(out);
	}
	return 0;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 0.5;

	if (secs <= 0)
		secs = 0.5;
	if (sodium_init() < 0) {
		fprintf(stderr, "sodium_init failed\n");
		return 1;
	}
	if (measure("aead", crypto_aead_xchacha20poly1305_ietf_encrypt,
		    crypto_aead_xchacha20poly1305_ietf_decrypt, secs) != 0)
		return 1;
	if (crypto_aead_aes256gcm_is_available() &&
	    measure("aead-aes256gcm", crypto_aead_aes256gcm_encrypt,
		    crypto_aead_aes256gcm_decrypt, secs) != 0)
		return 1;
	return 0;
}
