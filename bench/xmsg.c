/* Cross-message compression through the pack writer (issue 16 step 4).

   bench/xmsg-plan.py CORPUS FOLDER... | bench/xmsg [max-depth]
     Reads the plan ("path<TAB>base line" per message, file order) and
     writes every message as one blob three ways through the real frame
     writer (chunked, padded, sealed; fsync off): alone; with its
     planned base (casbox_pack_txn_add_base(), which keeps the smaller
     of with/without); and with the base only where the base itself has
     no base (max depth 1). Prints stored bytes per mail byte for each,
     how many blobs became deltas, encode MB/s, and decode MB/s of
     every blob in file order: alone, with bases through the store's
     base cache (sequential FETCH: every blob that some delta uses as
     base is kept as it is read, casbox_pack_blob_cache_as_base()), and
     with the
     cache cleared before every blob (each base decoded again); with
     how many base decodes each took. Mode "base/grandparent": a planned
     base at the maximum depth is replaced by its own base. Decoded
     bytes are compared with the input. Decode is the best of three
     interleaved rounds. Times are CPU time of the process
     (CLOCK_PROCESS_CPUTIME_ID). MB = 10^6 bytes of plaintext. XMSG_CACHE_MB
     sets the base cache bound. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "hash.h"
#include "cas-key.h"
#include "cas-aead.h"
#include "casbox-pack.h"
#include "casbox-base-cache.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct msg {
	buffer_t *data;
	int base;
	struct cas_blob_id id;
	struct casbox_blob_record rec[4];
	/* the message whose blob rec[mode] used as base, -1 = none */
	int used_base[4];
	/* a later blob of this mode uses this one as its base (what the
	   store knows from its base refcounts) */
	bool is_base[4];
};
ARRAY_DEFINE_TYPE(msg, struct msg);
static ARRAY_TYPE(msg) msgs;
/* blob id -> 1 + index in msgs (the LSM's part, not timed as ours) */
static HASH_TABLE(struct cas_blob_id *, void *) msg_ids;

static unsigned int id_hash(const struct cas_blob_id *id)
{
	return id->id[0] | (id->id[1] << 8) | (id->id[2] << 16) |
		((unsigned int)id->id[3] << 24);
}

static int id_cmp(const struct cas_blob_id *a, const struct cas_blob_id *b)
{
	return memcmp(a->id, b->id, sizeof(a->id));
}
static const struct cas_keyring *bench_keyring;

static double now(void)
{
	struct timespec ts;

	/* CPU time of this process: the machine is shared, and wall time
	   swings with the other load (the work is single-threaded and
	   page-cache bound, fsync off) */
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static buffer_t *read_path(const char *path)
{
	buffer_t *buf = buffer_create_dynamic(default_pool, 4096);
	FILE *f = fopen(path, "r");
	char tmp[65536];
	size_t n;

	if (f == NULL)
		i_fatal("fopen(%s) failed: %m", path);
	while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
		buffer_append(buf, tmp, n);
	fclose(f);
	return buf;
}

static void load_plan(void)
{
	char line[8192], *tab;
	struct msg *m;

	i_array_init(&msgs, 4096);
	while (fgets(line, sizeof(line), stdin) != NULL) {
		tab = strchr(line, '\t');
		if (tab == NULL)
			i_fatal("bad plan line: %s", line);
		*tab = '\0';
		m = array_append_space(&msgs);
		m->data = read_path(line);
		m->base = atoi(tab + 1);
		if (m->base >= (int)array_count(&msgs) - 1)
			i_fatal("plan: base %d is not earlier", m->base);
		cas_blob_id_compute(bench_keyring, m->data->data,
				    m->data->used, &m->id);
	}
}

static struct casbox_pack_store *bench_store(const char *dir)
{
	struct casbox_pack_settings set;
	struct casbox_pack_store *store;
	const char *error;

	i_zero(&set);
	set.dir = dir;
	set.max_pack_size = 4ULL * 1024 * 1024 * 1024;
	/* XMSG_CACHE_MB: the base cache bound (default: the store's) */
	if (getenv("XMSG_CACHE_MB") != NULL)
		set.base_cache_size = atoi(getenv("XMSG_CACHE_MB")) << 20;
	if (casbox_pack_store_open(&set, bench_keyring, &store, &error) < 0)
		i_fatal("%s", error);
	return store;
}

/* mode 0: alone, 1: with base, 2: with a base of depth 0 only, 3: as
   1, but a planned base at the maximum depth is replaced by its own
   base (the grandparent, whose text the base quotes) */
#define MODES 4
static unsigned int cur_mode;

static unsigned int lookups;
static int lookup(void *context ATTR_UNUSED, const struct cas_blob_id *id,
		  struct casbox_blob_record *rec_r, const char **error_r)
{
	const struct msg *m;
	void *idx;

	lookups++;
	idx = hash_table_lookup(msg_ids, id);
	if (idx == NULL) {
		*error_r = "unknown";
		return 0;
	}
	m = array_idx(&msgs, POINTER_CAST_TO(idx, unsigned int) - 1);
	*rec_r = m->rec[cur_mode];
	return 1;
}

static void encode(struct casbox_pack_store *store, unsigned int mode,
		   uint64_t *stored_r, unsigned int *deltas_r,
		   unsigned int *depth2_r, double *secs_r)
{
	struct casbox_pack_base base, *basep;
	struct casbox_pack_txn *txn;
	struct istream *input;
	struct msg *m, *b = NULL;
	const char *error;
	double t0 = now();

	*stored_r = 0;
	*deltas_r = *depth2_r = 0;
	array_foreach_modifiable(&msgs, m) T_BEGIN {
		basep = NULL;
		if (mode != 0 && m->base >= 0) {
			b = array_idx_modifiable(&msgs, m->base);
			i_zero(&base);
			base.id = b->id;
			base.plain_size = b->data->used;
			base.depth = b->rec[mode].base_depth;
			base.data = b->data->data;
			base.size = b->data->used;
			while (mode == 3 &&
			       base.depth >= CASBOX_BASE_MAX_DEPTH) {
				b = array_idx_modifiable(&msgs,
					b->used_base[mode]);
				base.id = b->id;
				base.plain_size = b->data->used;
				base.depth = b->rec[mode].base_depth;
				base.data = b->data->data;
				base.size = b->data->used;
			}
			if (mode != 2 || base.depth == 0)
				basep = &base;
		}
		if (casbox_pack_txn_begin(store, &txn, &error) < 0)
			i_fatal("%s", error);
		input = i_stream_create_from_data(m->data->data,
						  m->data->used);
		if (casbox_pack_txn_add_base(txn, &m->id, input, basep,
					     &m->rec[mode], &error) < 0)
			i_fatal("%s", error);
		i_stream_unref(&input);
		if (casbox_pack_txn_commit(&txn, &error) < 0)
			i_fatal("%s", error);
		*stored_r += m->rec[mode].frame_size;
		m->used_base[mode] = m->rec[mode].base_depth == 0 ? -1 :
			(basep == &base ? (int)(b - array_front(&msgs)) : -1);
		if (m->used_base[mode] >= 0)
			b->is_base[mode] = TRUE;
		if (m->rec[mode].base_depth > 0)
			(*deltas_r)++;
		if (m->rec[mode].base_depth > 1)
			(*depth2_r)++;
	} T_END;
	*secs_r = now() - t0;
}

static double decode(struct casbox_pack_store *store, unsigned int mode,
		     bool clear_cache)
{
	struct casbox_base_cache *cache =
		casbox_pack_store_get_base_cache(store);
	const unsigned char *data;
	struct istream *input;
	const struct msg *m;
	const char *error;
	size_t size, pos;
	double t0;

	cur_mode = mode;
	casbox_base_cache_clear(cache);
	lookups = 0;
	t0 = now();
	array_foreach(&msgs, m) T_BEGIN {
		if (clear_cache)
			casbox_base_cache_clear(cache);
		if (casbox_pack_blob_open_chain(store, &m->id, &m->rec[mode],
						lookup, NULL, &input,
						&error) < 0)
			i_fatal("%s", error);
		/* what a sequential FETCH would do for a blob the store
		   knows to be a base: a later message may be a delta
		   against it */
		if (!clear_cache && m->is_base[mode])
			casbox_pack_blob_cache_as_base(input);
		pos = 0;
		while (i_stream_read_more(input, &data, &size) > 0) {
			if (pos + size > m->data->used ||
			    memcmp(data, CONST_PTR_OFFSET(m->data->data, pos),
				   size) != 0)
				i_fatal("decoded bytes differ");
			pos += size;
			i_stream_skip(input, size);
		}
		if (input->stream_errno != 0 || pos != m->data->used)
			i_fatal("decode failed: %s",
				i_stream_get_error(input));
		i_stream_unref(&input);
	} T_END;
	return now() - t0;
}

int main(int argc ATTR_UNUSED, char **argv ATTR_UNUSED)
{
	static const char *const names[MODES] = {
		"alone", "base (depth<=2)", "base (depth<=1)",
		"base/grandparent"
	};
	struct casbox_pack_store *store[MODES];
	unsigned char kek[CAS_KEK_SIZE];
	struct cas_keyring *keyring;
	char tmpl[] = "/tmp/bench-xmsg.XXXXXX";
	uint64_t total = 0, stored;
	unsigned int mode, deltas, depth2, with_base = 0;
	double secs, best[MODES][2];
	unsigned int base_decodes[MODES][2];
	const struct msg *m;
	unsigned int round;

	lib_init();
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	randombytes_buf(kek, sizeof(kek));
	keyring = cas_keyring_create_from_kek(kek);
	bench_keyring = keyring;
	load_plan();
	hash_table_create(&msg_ids, default_pool, 0, id_hash, id_cmp);
	for (unsigned int i = 0; i < array_count(&msgs); i++) {
		struct msg *mm = array_idx_modifiable(&msgs, i);

		hash_table_update(msg_ids, &mm->id, POINTER_CAST(i + 1));
	}
	array_foreach(&msgs, m) {
		total += m->data->used;
		if (m->base >= 0)
			with_base++;
	}
	if (mkdtemp(tmpl) == NULL)
		i_fatal("mkdtemp() failed: %m");
	printf("%u messages, %.1f MB, %u with a planned base\n",
	       array_count(&msgs), total / 1e6, with_base);
	for (mode = 0; mode < MODES; mode++) {
		store[mode] = bench_store(t_strdup_printf("%s/%u", tmpl,
							  mode));
		encode(store[mode], mode, &stored, &deltas, &depth2, &secs);
		printf("%-16s stored/mail %.4f  deltas %u (depth 2: %u)  "
		       "encode %.1f MB/s\n", names[mode],
		       (double)stored / total, deltas, depth2,
		       total / secs / 1e6);
	}
	/* decode: best of three interleaved rounds */
	for (mode = 0; mode < MODES; mode++)
		best[mode][0] = best[mode][1] = 1e9;
	for (round = 0; round < 3; round++) {
		for (mode = 0; mode < MODES; mode++) {
			best[mode][0] = I_MIN(best[mode][0],
					      decode(store[mode], mode, FALSE));
			base_decodes[mode][0] = lookups;
			if (mode == 0)
				continue;
			best[mode][1] = I_MIN(best[mode][1],
					      decode(store[mode], mode, TRUE));
			base_decodes[mode][1] = lookups;
		}
	}
	for (mode = 0; mode < MODES; mode++) {
		if (mode == 0) {
			printf("%-16s decode %.1f MB/s\n", names[mode],
			       total / best[mode][0] / 1e6);
			continue;
		}
		printf("%-16s decode %.1f MB/s cached bases (%u base "
		       "decodes), %.1f MB/s uncached (%u)\n", names[mode],
		       total / best[mode][0] / 1e6, base_decodes[mode][0],
		       total / best[mode][1] / 1e6, base_decodes[mode][1]);
	}
	for (mode = 0; mode < MODES; mode++)
		casbox_pack_store_close(&store[mode]);
	if (system(t_strdup_printf("rm -rf '%s'", tmpl)) != 0)
		i_error("rm -rf %s failed", tmpl);
	cas_keyring_free(&keyring);
	lib_deinit();
	return 0;
}
