/* Physical limit: libsodium XChaCha20-Poly1305 (IETF) throughput on this
 * machine, the AEAD that casbox uses for every blob.
 *
 * Built by bench/run with cc directly (cc -O2 physical-aead.c -lsodium),
 * not by automake: it is a measuring tool, not part of the product.
 *
 * Usage: physical-aead [seconds-per-size]
 * Prints one line per buffer size:
 *   aead size=<bytes> encrypt_mbps=<MB/s> decrypt_mbps=<MB/s>
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

int main(int argc, char **argv)
{
	static const size_t sizes[] = { 4096, 65536, 1048576 };
	double secs = argc > 1 ? atof(argv[1]) : 0.5;
	unsigned char key[crypto_aead_xchacha20poly1305_ietf_KEYBYTES];
	unsigned char nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];

	if (secs <= 0)
		secs = 0.5;
	if (sodium_init() < 0) {
		fprintf(stderr, "sodium_init failed\n");
		return 1;
	}
	crypto_aead_xchacha20poly1305_ietf_keygen(key);
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
				crypto_aead_xchacha20poly1305_ietf_encrypt(
					ct, &ctlen, pt, n, NULL, 0, NULL,
					nonce, key);
				enc_bytes += n;
			}
			t = now() - t0;
		} while (t < secs);
		double enc = enc_bytes / t / 1e6;

		t0 = now();
		do {
			for (int k = 0; k < 16; k++) {
				if (crypto_aead_xchacha20poly1305_ietf_decrypt(
					    out, &outlen, NULL, ct, ctlen,
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
		printf("aead size=%zu encrypt_mbps=%.1f decrypt_mbps=%.1f\n",
		       n, enc, dec);
		free(pt);
		free(ct);
		free(out);
	}
	return 0;
}
